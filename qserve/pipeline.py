"""`qserve pipeline`: the main job. train -> export every supported variant -> bench -> gate -> repair -> report.

    qserve pipeline                                   # embedded default: train -> export -> bench -> gate -> report
    qserve pipeline --model distilbert-base-uncased --dataset imdb   # hub path, needs network

One run dir (default models/<model>-<dataset>/) holds checkpoint/, variants/<name>/ and report/. A rerun reuses each
finished stage whose inputs are unchanged (unless --force); a killed run picks up where it stopped (docs/training.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import time
from pathlib import Path

import exporters
from qserve import QserveError
from qserve.artifact import VariantError, checkpoint_hash, read_manifest, reseal
from qserve.bench import BenchConfig, run_bench
from qserve.bench.analysis import apply_gates
from qserve.bench.report import write_reports
from qserve.bench.stages import line, record_stages
from qserve.devices import capabilities, resolve_device
from qserve.files import write_json_atomic
from qserve.gate.config import GateConfig
from qserve.gate.report import row, write_report
from qserve.gate.run import run_gate
from qserve.placement import Plan
from qserve.placement import plan as plan_run
from qserve.repair import RepairConfig, repair, said
from qserve.rundir import RunDir
from qserve.training.config import TrainConfig
from qserve.training.config import run_dir as default_run_dir
from qserve.training.precision import PRECISION_CHOICES
from qserve.training.resume import STARTED, config_diff, describe_diff
from qserve.training.train import train
from qserve.variants import UnsupportedVariant, backend_of
from qserve.verify import verify

# Pipeline defaults on a CPU, chosen so the whole job fits a short wait on 2 CPU cores and still classifies
# held-out IMDb well (what it takes and reads: README "Measured").
PIPELINE_TRAIN = {"max_samples": 6000, "max_length": 128, "epochs": 1, "batch_size": 16, "lr": 1e-4}
PIPELINE_TRAIN_GPU = {"max_samples": None, "max_length": 512, "epochs": 3, "batch_size": None, "lr": 1e-4}
"""On a GPU the seed's recipe (every training review, 3 epochs, up to 512 tokens): a few minutes of a GPU's time
where it is hours of a CPU's. batch_size None: the probe picks it (with the precision and TF32) and scales --lr,
the rate at batch 16, with it (qserve/training/autotune.py)."""
PIPELINE_TRAIN_BUDGET_MIN = 9.0
"""Minutes of optimizer steps the main job trains at most: more than the full recipe takes where bf16 is native
(docs/measurements.md), so those CPUs train it whole; a slower CPU trains the steps that fit, and says so."""


def train_recipe(device: str) -> tuple[dict, str]:
    """The main job's training recipe on `device` and why: chosen here, once; the report says it."""
    if device.startswith("cuda"):
        g = PIPELINE_TRAIN_GPU
        return g, (
            f"the seed's recipe on a GPU (every training review, {g['epochs']} epochs, up to {g['max_length']} "
            "tokens; the batch size, precision and TF32 from a short probe): minutes of a GPU's time"
        )
    c = PIPELINE_TRAIN
    return c, (
        f"the CPU cut ({c['max_samples']:,} reviews, {c['epochs']} epoch, {c['max_length']} tokens, batch "
        f"{c['batch_size']}): the whole job in about 15 minutes of a small CPU"
    )


def recipe_values(args: argparse.Namespace, device: str) -> tuple[dict, str, list[str]]:
    """The recipe's values with given flags in their place (--max-samples 0: all), why, and which flags replaced it."""
    recipe, why = train_recipe(device)
    given = {k: getattr(args, k) for k in recipe if getattr(args, k) not in (None, recipe[k])}
    values = {**recipe, **given}
    return {**values, "max_samples": values["max_samples"] or None}, why, sorted(given)


PIPELINE_GATE_CANDIDATES = 3
"""The release gate scores at most this many candidates, fastest first, and stops once two passed: the
recommendation and its runner-up, a real alternative to it."""
PIPELINE_CALIBRATION_TEXTS = 1000
"""Held-out validation texts the gate fits each candidate's calibration on."""
PIPELINE_REPAIR_CANDIDATES = 1
"""The repair stage repairs at most this many variants that could win and failed, fastest first."""
PIPELINE_REPAIR_BUDGET_S = 180.0
"""Seconds of each repair's ranking and search (its export, gate and bench come after)."""
PIPELINE_FLOOR_BUDGET_S = 0.25
"""Seconds per GEMM of the compute floor's best-of timing (`qserve bench` uses 1): hundreds of calls of each
shape at these sizes, where the best one is what the floor reads."""


def _stage(i: int, n: int, title: str) -> float:
    print(f"\n== [{i}/{n}] {title} ==", flush=True)
    return time.perf_counter()


def _done(t0: float, what: str) -> float:
    took = time.perf_counter() - t0
    print(f"   {what} ({took:.0f}s)", flush=True)
    return took


def _train_stage(cfg, run: RunDir, force: bool) -> Path:
    ckpt = run.checkpoint
    metrics_path = ckpt / "train_metrics.json"
    want, defaults = dataclasses.asdict(cfg), dataclasses.asdict(TrainConfig())
    # checkpoints trained before the policy existed read the head; fields added since count as their default
    defaults = {**defaults, "long_text": "head"}
    if metrics_path.is_file() and not (ckpt / STARTED).is_file() and not force:
        have = json.loads(metrics_path.read_text(encoding="utf-8")).get("config") or {}
        diff = config_diff(want, have, defaults)
        if not diff:
            print(f"   reusing {ckpt} (same training config; --force to retrain)")
            return ckpt
        raise QserveError(
            f"{ckpt} was trained with another config; pass --force to retrain, "
            f"or --run-dir to use another directory ({describe_diff(diff, want, have, defaults)})"
        )
    train(cfg)  # an unfinished run in ckpt (a killed pipeline) resumes from its last checkpoint
    return ckpt


def _training_record(ckpt: Path) -> dict:
    """What the report says of the training: the precision, why, and what was trained on (train_metrics.json)."""
    try:
        m = json.loads((ckpt / "train_metrics.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    keys = tuple(
        "precision precision_choice time_budget optimizer_steps sizes test_accuracy val_accuracy train_time_s "
        "step_time_median_s batch_choice cuda_probe samples_per_s tokens_per_s".split()
    )
    return {k: m[k] for k in keys if k in m}


def _export_stage(
    ckpt: Path, run: RunDir, plan: Plan, force: bool
) -> tuple[list[Path], dict[str, str], dict[str, str]]:
    """Export every variant the plan runs, each on its device: (variant dirs, skipped with why, failed with why)."""
    src_hash = checkpoint_hash(ckpt)
    names = plan.runs
    out: list[Path] = []
    skipped: dict[str, str] = {}
    failed: dict[str, str] = {}
    for i, name in enumerate(names, 1):
        dest = run.variant(name)
        if dest.exists() and not force:
            try:
                if (verify(dest).source or {}).get("sha256") == src_hash:
                    print(f"   [{i}/{len(names)}] {name}: reusing {dest}")
                    out.append(dest)
                    continue
            except VariantError as e:
                print(f"   [{i}/{len(names)}] {name}: existing dir is invalid ({e}); rebuilding")
        # a killed export's staging dir (or the old copy a --force replace had moved aside): never trusted or kept
        for stale in [*dest.parent.glob(f".{name}.tmp-*"), *dest.parent.glob(f".{name}.old-*")]:
            shutil.rmtree(stale, ignore_errors=True)
        t0 = time.perf_counter()
        device = plan.device_of(name)
        print(
            f"   [{i}/{len(names)}] {name}: exporting{'' if device == plan.device else f' on the {device}'} ...",
            flush=True,
        )
        try:
            m = exporters.export(ckpt, name, dest, force=True, device=device)
        except UnsupportedVariant as e:  # the others export, bench and report as usual
            print(f"       skipped: {e}", flush=True)
            skipped[name] = str(e)
            continue
        except QserveError as e:  # one variant's failure is said in the report; the run goes on without it
            print(f"       failed: {e}", flush=True)
            failed[name] = str(e)
            continue
        p = m.parity or {}
        print(
            f"       {time.perf_counter() - t0:.0f}s, max|Δlogit| {p['max_abs_logit_diff']:.3g}, "
            f"probe agreement {p['agreement']:.0%}",
            flush=True,
        )
        out.append(dest)
    return out, skipped, failed


def _bench_stage(variants: list[Path], report_dir: Path, args, plan: Plan, force: bool) -> Path:
    long_text = [x for x in (args.bench_long_text or "").split(",") if x.strip()] or None
    key = {str(v.name): read_manifest(v).to_json()["files"] for v in variants}
    if long_text:
        key["--long-text"] = long_text  # another comparison is another report
    moved = {v.name: plan.device_of(v.name) for v in variants if plan.device_of(v.name) != plan.device}
    if moved:
        key["--placement"] = moved  # an ONNX variant that ran on the CPU is re-measured once it can run on the GPU
    stamp = report_dir / "inputs.json"
    if (report_dir / "report.json").is_file() and stamp.is_file() and not force:
        if json.loads(stamp.read_text(encoding="utf-8")) == key:
            print(f"   reusing {report_dir / 'report.md'} (same variants; --force to re-measure)")
            return report_dir / "report.md"
    # re-measuring replaces a report this pipeline wrote (stamped, or a killed bench's); anything else needs --force
    store = report_dir / "measured"
    owned = stamp.is_file() or store.is_dir() or not report_dir.exists() or not any(report_dir.iterdir())
    if not owned and not force:
        raise QserveError(
            f"{report_dir} already holds files the pipeline did not write; pass --force "
            "to replace them, or choose another --report-dir"
        )
    cfg = BenchConfig(
        batch_sizes=[int(b) for b in args.batch_sizes.split(",")],
        seq_lens=[int(s) for s in args.seq_lens.split(",")],
        threads=args.threads,
        device=plan.device,
        out=report_dir,
        max_eval_samples=args.bench_eval_samples,
        time_budget_s=args.time_budget,
        force=True,
        long_text=long_text,
        floor_budget_s=PIPELINE_FLOOR_BUDGET_S,
    )
    run_bench(variants, cfg, store=store, reuse=not force, plan=plan)  # a killed bench resumes: bench/store.py

    write_json_atomic(stamp, key)
    return report_dir / "report.md"


def _gate_candidates(report: dict) -> tuple[list[str], str]:
    """Variant dirs worth gating, fastest first: those meeting their agreement bar on the bench's texts and
    faster than the reference (which needs no gate), at most PIPELINE_GATE_CANDIDATES; and why none, if so."""
    rec = report.get("recommended") or {}
    ref = report.get("agreement_reference")
    out = []
    for r in rec.get("ranking") or []:  # fastest first, as the recommendation ranks them
        if r["variant"] == ref:
            break  # the reference is recommendable as it is: slower variants cannot win
        if r.get("agreement") is not None and r["agreement"] >= r["bar"]:
            out.append(r["dir"])
    why = (
        "no variant faster than the reference meets its agreement bar"
        if ref
        else "no fp32 reference in this run to gate against"
    )
    return out[:PIPELINE_GATE_CANDIDATES], why


def _gate_config(args, plan: Plan) -> GateConfig:
    """The pipeline's gate: the bench's test texts first (`qserve gate --max-eval-samples N`), then the rest of the
    split where undecided; calibrated on held-out validation texts."""
    return GateConfig(
        max_eval_samples=args.bench_eval_samples,
        max_calibration_samples=PIPELINE_CALIBRATION_TEXTS,
        device=plan.device,
        threads=args.threads,
    ).validate()


def _gate_stage(report_dir: Path, args, plan: Plan, force: bool) -> dict | None:
    """The release gate on the bench's own test texts (`qserve gate --max-eval-samples N`), verdicts sealed into
    the candidates' manifests; the report then recommends a gated variant (bench/analysis.apply_gates)."""
    path = report_dir / "report.json"
    report = json.loads(path.read_text(encoding="utf-8"))
    if report.get("gate") and not force:
        print(f"   reusing {report_dir / 'gate' / 'gate.md'} (the bench it gated is unchanged; --force to re-gate)")
        return report["gate"]
    candidates, why = _gate_candidates(report)
    cfg = _gate_config(args, plan)
    results = run_gate([Path(c) for c in candidates], cfg, until_pass=2, plan=plan) if candidates else []
    for r in results:
        g = r["gate"]
        print(
            f"   {r['variant']}: {'PASSED' if g['passed'] else 'FAILED'}: agreement {g['agreement']['value']:.2%} "
            f"[{g['agreement']['lo']:.2%}, {g['agreement']['hi']:.2%}] on {g['agreement']['of']} texts, bar "
            f"{g['bar']['agreement_lower_bound']:.0%} on the lower bound"
            + ("" if g["passed"] else f" ({'; '.join(g['reasons'])})"),
            flush=True,
        )
    if results:
        write_report(results, report_dir / "gate", force=True)
    by_dir = {Path(r["dir"]).resolve(): r["gate"] for r in results}
    gated = {
        v["dir"]: by_dir[Path(v["dir"]).resolve()]
        for v in report["variants"]
        if v.get("dir") and Path(v["dir"]).resolve() in by_dir
    }
    first = results[0]["gate"]["data"] if results else {}
    report["gate"] = {
        "dir": "gate",
        "max_candidates": PIPELINE_GATE_CANDIDATES,
        "data": first,
        "rows": [row(r) for r in results],
        "not_gated": [Path(c).name for c in candidates if Path(c).resolve() not in by_dir],
        **({} if candidates else {"why": why}),
    }
    apply_gates(report, gated)
    _gate_chosen_policy(report, cfg, plan)
    write_reports(report, report_dir)  # every chart, page and table from the verdict the gate left
    rec = report["recommended"]
    print(f"   recommended: {rec.get('variant') or 'none'} ({rec.get('why')})", flush=True)
    return report["gate"]


def _repair_candidates(report: dict) -> list[str]:
    """Variant dirs that could win and failed, fastest first: faster than the recommended variant (else the
    reference), below the bench's bar, failed by their gate or missing its bars on its point estimates, of a
    backend that can keep layers in fp32."""
    rec, out = report.get("recommended") or {}, []
    for r in rec.get("ranking") or []:
        if r["variant"] in (rec.get("variant"), report.get("agreement_reference")):
            break
        m = read_manifest(Path(r["dir"]))
        g = m.gate or {"decision": None}
        point = g["decision"] and (  # undecided, or decided, on point estimates that miss the bars
            g["agreement"]["value"] < g["bar"]["agreement_lower_bound"]
            or g["accuracy"]["delta"]["value"] < -g["bar"]["max_accuracy_drop"]
        )
        failed = (r.get("agreement") or 1.0) < r["bar"] or g["decision"] == "failed" or point
        if failed and backend_of(m.name).layers and "repair" not in m.records:
            out.append(r["dir"])
    return out[:PIPELINE_REPAIR_CANDIDATES]


def _repaired(run: RunDir, ckpt: Path) -> list[Path]:
    """The repaired variants a run of this checkpoint left (benched and reused with the others)."""
    want, out = checkpoint_hash(ckpt), []
    for d in sorted(run.variants.glob("*-repaired")):
        try:
            out += [d] if (verify(d).source or {}).get("sha256") == want else []
        except VariantError:
            continue
    return out


def _repair_stage(ckpt: Path, variants: list[Path], report_dir: Path, args, plan: Plan, force: bool) -> None:
    """Repair what could win and failed (qserve/repair.py: gated on the bench's test texts), bench it beside the
    others, and let the report choose again; report["repair"] says what was kept and what it cost."""
    path = report_dir / "report.json"
    report = json.loads(path.read_text(encoding="utf-8"))
    if "repair" in report and not force:
        print("   reusing the repair the report holds (--force to repair again)")
        return
    rows = []
    for d in _repair_candidates(report):
        r = repair(Path(d), ckpt, _gate_config(args, plan), RepairConfig(repair_budget=PIPELINE_REPAIR_BUDGET_S), plan)
        print(f"   {r['variant']}: {said(r)}", flush=True)
        g = r.get("gate") or {}
        rows.append({**{k: r.get(k) for k in ("variant", "needed", "before", "dir", "why")}, "gate": g.get("decision")})
    new = [Path(r["dir"]) for r in rows if r["dir"]]
    if new:  # bench them beside the rest (the others' measurements are reused), then the report chooses again
        gate = report.get("gate")
        _bench_stage([*variants, *new], report_dir, args, plan, False)
        report = {**json.loads(path.read_text(encoding="utf-8")), "gate": gate}
    report["repair"] = {"candidates": PIPELINE_REPAIR_CANDIDATES, "budget_s": PIPELINE_REPAIR_BUDGET_S, "rows": rows}
    write_reports(report, report_dir)  # every chart, page and table from the verdict the repair left


def _gate_chosen_policy(report: dict, cfg: GateConfig, plan: Plan | None) -> None:
    """Gate the recommended variant again under the policy the long-text study separated as better; only a pass
    replaces the manifest's verdict, and report["long_text"]["gate"] says what was found."""
    lt = report.get("long_text") or {}
    rec = report.get("recommended") or {}
    if not lt.get("changed") or lt.get("variant") != rec.get("variant") or not rec.get("dir"):
        return
    vdir, policy = Path(rec["dir"]), lt["fast"]["policy"]
    if not (read_manifest(vdir).gate or {}).get("passed"):
        return  # the reference (never gated), or a variant the gate did not pass: nothing to extend
    print(f"   {rec['variant']}: gating the long-text policy the report chose, {policy}", flush=True)
    (res,) = run_gate([vdir], dataclasses.replace(cfg, long_text=policy, record=False), plan=plan)
    g = res["gate"]
    if g["passed"]:
        vm = verify(vdir)
        calibration = res["calibration"] if res["calibration"] is not None else vm.calibration
        reseal(vdir, dataclasses.replace(vm, gate=g, calibration=calibration))
    lt["gate"] = {"policy": policy, **row(res)}
    print(f"   {policy}: {'PASSED' if g['passed'] else 'FAILED: ' + '; '.join(g['reasons'])}", flush=True)


def run_pipeline(args: argparse.Namespace) -> Path:
    device = resolve_device(args.device)
    run = RunDir(Path(args.run_dir) if args.run_dir else default_run_dir(args.model, args.dataset))
    r, recipe_why, given = recipe_values(args, device)
    cfg = TrainConfig(
        model=args.model,
        dataset=args.dataset,
        precision=args.precision,
        **r,  # the recipe's epochs, batch_size, lr, max_length and max_samples, given flags in their place
        seed=args.seed,
        out=str(run.checkpoint),
        device=device,
        force=args.force,
        checkpoint_every=args.checkpoint_every,
        max_eval_samples=args.max_eval_samples or None,
        train_budget=args.train_budget or None,
    )
    # what runs where, decided before training: on the CPU what the GPU cannot run; skipped, with why, what cannot
    plan = plan_run(device, [n.strip() for n in args.variants.split(",") if n.strip()] if args.variants else None)
    left_out = plan.skipped
    t_all = time.perf_counter()
    times: dict[str, float] = {}
    machine = _machine(device)
    print(f"machine: {machine}", flush=True)
    print("plan:\n" + "\n".join(f"   {step}" for step in plan.lines()), flush=True)
    n_stages = 3 if args.no_gate else 4 if args.no_repair else 5
    t0 = _stage(1, n_stages, f"train {args.model} on {args.dataset} ({args.precision}, {device})")
    ckpt = _train_stage(cfg, run, args.force)
    times["train"] = _done(t0, f"checkpoint: {ckpt}")
    training = _training_record(ckpt)
    budget = training.get("time_budget") or {}
    if budget.get("cut"):
        print(
            f"   trained {budget['steps']} of {budget['of_steps']} steps ({budget['examples']:,} of "
            f"{budget['of_examples']:,} examples) within the {budget['minutes']:g}-minute budget",
            flush=True,
        )
    for name, why in left_out.items():
        print(f"   skipping {name}: {why}", flush=True)
    names = plan.runs
    t0 = _stage(2, n_stages, f"export {len(names)} variants: {', '.join(names)}")
    variants, at_export, failed = _export_stage(ckpt, run, plan, args.force)
    times["export"] = _done(t0, f"variants: {run.variants}")
    t0 = _stage(3, n_stages, "bench + report")
    report_dir = Path(args.report_dir) if args.report_dir else run.report_dir
    if not variants:
        why = "; ".join(f"{k}: {v}" for k, v in {**at_export, **failed}.items()) or "none planned"
        raise QserveError(f"no variant was exported ({why}); nothing to bench. The checkpoint is in {ckpt}")
    variants += [] if args.force else _repaired(run, ckpt)  # a finished run's, reused with the rest
    report = _bench_stage(variants, report_dir, args, plan, args.force)
    times["bench"] = _done(t0, "benchmarked")
    if not args.no_gate:
        t0 = _stage(4, n_stages, "release gate: the fastest candidates vs fp32 on the bench's texts")
        _gate_stage(report_dir, args, plan, args.force)
        times["gate"] = _done(t0, f"gated: {report_dir / 'gate'}")
        if not args.no_repair:
            t0 = _stage(5, n_stages, "repair: what could win and failed keeps its most sensitive layers in fp32")
            _repair_stage(ckpt, variants, report_dir, args, plan, args.force)
            times["repair"] = _done(t0, "repaired")
    times["total"] = time.perf_counter() - t_all

    record_stages(
        report_dir,
        times,
        {
            "machine": machine,
            "training": training,
            "skipped": {**left_out, **at_export},
            "plan": plan.to_json(),
            **({"export_failed": failed} if failed else {}),
            "recipe": {"why": recipe_why, "given": given, **r},
        },
    )
    print(f"\n{line(times)}\n\npipeline finished in {times['total'] / 60:.1f} min\nreport: {report}", flush=True)
    return report


def _machine(device: str) -> str:
    """How the report names the machine: the CPU class, and the GPU where the run is on one."""
    cpu = capabilities(with_cuda=False).describe()
    if not device.startswith("cuda"):
        return cpu
    caps = capabilities()
    cc = f", sm_{caps.cuda_capability[0]}{caps.cuda_capability[1]}" if caps.cuda_capability else ""
    return f"{caps.cuda_name or 'a CUDA GPU'} ({device}{cc}, bf16 {'yes' if caps.cuda_bf16 else 'no'}); CPU: {cpu}"


def cmd_pipeline(args: argparse.Namespace) -> int:
    report = run_pipeline(args)
    # the report is written either way; a variant whose export or bench failed makes the exit status say so
    data = json.loads(report.with_suffix(".json").read_text(encoding="utf-8"))
    bad = {v["name"] for v in data.get("variants") or [] if v.get("status") != "ok"}
    failed = sorted(bad | set((data.get("pipeline") or {}).get("export_failed") or {}))
    if failed:
        print(f"{len(failed)} variant(s) failed: {', '.join(failed)} (details in {report})")
        return 1
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "pipeline", help="the main job: train -> export -> bench -> report", description=__doc__.split("\n\n", 1)[0]
    )
    p.add_argument(
        "--model",
        default="default",
        help="'default' (embedded MiniLM-L6 in DistilBERT layout), a local checkpoint dir, or a hub id",
    )
    p.add_argument(
        "--dataset",
        default="default",
        help="'default' (embedded IMDb), 'rotten-tomatoes', a local csv/jsonl, or a HF datasets id",
    )
    p.add_argument(
        "--precision",
        default=TrainConfig.precision,
        choices=PRECISION_CHOICES,
        help="training precision (default %(default)s: what this device runs fast, measured and said)",
    )
    p.add_argument(
        "--train-budget",
        type=float,
        default=PIPELINE_TRAIN_BUDGET_MIN,
        metavar="MINUTES",
        help="train for at most this many minutes of optimizer steps, cut from the first steps' time "
        "(default %(default)s; 0: no budget)",
    )
    p.add_argument(
        "--max-samples",
        type=int,
        default=None,
        help=f"training reviews (seeded subsample; 0: all; default {PIPELINE_TRAIN['max_samples']} on a "
        "CPU, all on a GPU)",
    )
    p.add_argument(
        "--max-length",
        type=int,
        default=None,
        help=f"tokens (default {PIPELINE_TRAIN['max_length']} on a CPU, {PIPELINE_TRAIN_GPU['max_length']} on a GPU)",
    )
    p.add_argument(
        "--max-eval-samples",
        type=int,
        default=TrainConfig.max_eval_samples,
        help="validation and test reviews the training stage scores, each (seeded, stratified; "
        "default %(default)s; 0: all)",
    )
    p.add_argument(
        "--epochs",
        type=int,
        default=None,
        help=f"default {PIPELINE_TRAIN['epochs']} on a CPU, {PIPELINE_TRAIN_GPU['epochs']} on a GPU",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help=f"default {PIPELINE_TRAIN['batch_size']} on a CPU; on a GPU measured by the training probe",
    )
    p.add_argument(
        "--lr",
        type=float,
        default=PIPELINE_TRAIN["lr"],
        help="peak learning rate (default %(default)s; with an automatic batch size the rate at batch 16, "
        "scaled by sqrt(batch / 16))",
    )
    p.add_argument("--seed", type=int, default=42)
    p.add_argument(
        "--checkpoint-every",
        type=int,
        default=None,
        metavar="STEPS",
        help="training writes a resumable checkpoint every STEPS optimizer steps, so a killed pipeline "
        "resumes its training (default: about every 5 minutes of training; 0: never)",
    )
    p.add_argument("--variants", help="comma list of variants (default: every one the device supports)")
    p.add_argument("--batch-sizes", default="1,8,32", help="bench batch sizes (default %(default)s)")
    p.add_argument("--seq-lens", default="128", help="bench sequence lengths (default %(default)s)")
    p.add_argument("--threads", type=int, default=None, help="bench threads (default: all cores)")
    # a longer budget spent most of the bench on the grid (docs/bench.md, "Where the bench's time goes")
    p.add_argument(
        "--time-budget",
        type=float,
        default=0.5,
        help="bench seconds of timed calls per shape (default %(default)s; `qserve bench` uses 3)",
    )
    p.add_argument(
        "--bench-eval-samples",
        type=int,
        default=1000,
        help="test reviews for bench accuracy/agreement per variant (default %(default)s)",
    )
    # tail among them: on the demo recipe it is the most accurate policy at head's cost (docs/long-texts.md)
    p.add_argument(
        "--bench-long-text",
        default="head,tail,head-tail,windows",
        metavar="POLICIES",
        help="long-text policies the bench compares on the test split; the report names the most accurate "
        "at >= half head's texts/s (what `qserve serve RUN_DIR` serves) and the most accurate "
        "overall; '' skips the comparison (default %(default)s)",
    )
    p.add_argument("--device", default="auto", help="auto|cpu|cuda")
    p.add_argument(
        "--run-dir",
        help="where checkpoint/, variants/ and report/ go (default models/<model>-<dataset>, "
        "e.g. models/minilm-l6-distilbert-imdb)",
    )
    p.add_argument("--report-dir", help="where the report goes (default <run-dir>/report)")
    p.add_argument(
        "--no-gate",
        action="store_true",
        help="skip the release gate (then the recommendation rests on the bench's point estimates)",
    )
    p.add_argument(
        "--no-repair",
        action="store_true",
        help="skip the repair of a variant that could win and failed its bar or its gate (docs/repair.md)",
    )
    p.add_argument("--force", action="store_true", help="redo every stage even if its outputs are current")
    p.set_defaults(func=cmd_pipeline)
