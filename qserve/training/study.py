"""Precision study: the same fine-tune once per precision, each in its own process.

    qserve train --compare --max-samples 3000 --max-length 128     # -> benchmarks/reports/precision/

Only `--precision` (and bf16-true's `--bf16-update`) changes; each run is a child process, so its peak memory is
its own; one precision runs again with another seed (`--noise-precision`) to size run-to-run noise. Writes
precision_study.json and .md, with the seed project's A100 figures beside ours as a reference (docs/training.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from qserve import QserveError
from qserve.devices import capabilities, cpu_info, resolve_device
from qserve.files import now_iso, refuse_existing, write_json_atomic, write_text_atomic
from qserve.provenance import provenance, with_header
from qserve.training.autotune import BASE_BATCH
from qserve.training.config import split_seed, validate
from qserve.training.precision import AUTO, BF16_UPDATES, PRECISION_CHOICES, PRECISIONS, choose_precision
from qserve.training.train import config_from_args
from qserve.variants import library_versions

DEFAULT_DIR = "benchmarks/reports/precision"
KEPT = tuple(  # what the study keeps of each run's train_metrics.json
    "train_time_s wall_time_s optimizer_steps step_time_median_s samples_per_s peak_memory_bytes peak_memory_kind "
    "val_accuracy test_accuracy sizes device model_name optimizer optimizer_state_bytes optimizer_step_median_s".split()
)


def _seed(precision: str, matmul: str, minutes: float, gb: float, acc: float, note: str = "", **update: str) -> dict:
    """One run of the seed project's table, its fields in the order they are recorded."""
    run = {"precision": precision, "matmul": matmul, **update, "train_time_min": minutes, "peak_memory_gb": gb}
    return {**run, "test_accuracy": acc, **({"note": note} if note else {})}


SEED: dict[str, Any] = {
    "source": "https://github.com/rasbt/LLM-finetuning-scripts/blob/main/conventional/distilbert-movie-review/"
    "mixed-precision-experiment/README.md",
    "setup": "DistilBERT-base (66M parameters) on IMDb (35k train, 5k val, 10k test), 3 epochs, batch 12, torch Adam "
    "lr 5e-5, every text padded to 512 tokens, one NVIDIA A100; time includes each epoch's validation, "
    "memory is torch.cuda.max_memory_reserved",
    "runs": [
        _seed("32-true", "highest", 21.75, 5.37, 0.8992),
        _seed("16-mixed", "highest", 7.25, 4.31, 0.9215),
        _seed("bf16-mixed", "highest", 7.45, 4.46, 0.9261),
        _seed("16-true", "highest", 5.23, 2.87, 0.5008, note="diverged: the loss went NaN"),
        _seed("bf16-true", "highest", 5.22, 2.87, 0.9269, note="plain Adam on bf16 weights", bf16_update="plain"),
        _seed("64-true", "highest", 24.59, 10.42, 0.9214),
        _seed("32-true", "high", 8.11, 5.37, 0.9250),
        _seed("16-mixed", "high", 7.1, 4.31, 0.9215),
        _seed("bf16-mixed", "high", 7.43, 4.46, 0.9261),
    ],
}
"""The seed project's published precision study (Sebastian Raschka's mixed-precision experiment; not measured by
qserve): the one place its numbers live. The study's report and docs/training.md (benchmarks/render/tables.py)
render them from here, beside ours, as ratios to its own 32-true."""


def supported_precisions(device: str) -> list[str]:
    if device == "cpu":
        return [p for p in PRECISIONS if p != "16-mixed"]
    return [p for p in PRECISIONS if not p.startswith("bf16") or capabilities(with_cuda=True).cuda_bf16]


def child_argv(cfg, precision: str, out: Path) -> list[str]:
    """The `python -m qserve.training.train` command line reproducing cfg with another precision and --out."""
    argv = [sys.executable, "-m", "qserve.training.train"]
    for f in fields(cfg):
        v = getattr(cfg, f.name)
        flag = "--" + f.name.replace("_", "-")
        if f.name in ("precision", "out", "force"):
            continue
        if f.name == "resume":
            argv += [] if v is None else ["--resume" if v else "--no-resume"]
        elif f.name in ("max_samples", "max_eval_samples") and v is None:
            argv += [flag, "0"]  # 0 = no cap on the command line
        elif v is not None:
            argv += [flag, str(v)]
    return argv + ["--precision", precision, "--out", str(out)]


def label(run: dict[str, Any]) -> str:
    """How a run is named in the report: its precision, the bf16-true update, a seed that differs."""
    name = run["precision"]
    if run["precision"] == "bf16-true":
        name += f" ({run['bf16_update']})"
    if run.get("matmul_precision"):
        name += " (TF32)" if run["matmul_precision"] == "high" else f" (matmul {run['matmul_precision']})"
    return name + (f", seed {run['seed']}" if run.get("noise") else "")


def plan(
    cfg, precisions: list[str] | None, device: str, bf16_updates: list[str] | None, noise_precision: str | None
) -> list[dict[str, Any]]:
    """The runs of a study, in order: one per precision (bf16-true once per update), then the noise run (`auto`: what
    `--precision auto` chooses here)."""
    supported = supported_precisions(device)
    auto = None
    if AUTO in (precisions or []) or noise_precision in (None, AUTO):
        auto = choose_precision(AUTO, device)
        print(f"auto: {auto.line}", flush=True)
    precisions = [auto.precision if p == AUTO and auto else p for p in precisions or []]
    if noise_precision == AUTO and auto:
        noise_precision = auto.precision
    for p in list(precisions or []) + ([noise_precision] if noise_precision not in (None, "none") else []):
        if p not in PRECISION_CHOICES:
            raise QserveError(f"--precision must be one of {', '.join(PRECISION_CHOICES)} (got {p!r})")
        if p not in supported:
            raise QserveError(f"--precision {p} is not supported on {device}; this device runs {', '.join(supported)}")
    for u in bf16_updates or []:
        if u not in BF16_UPDATES:
            raise QserveError(f"--bf16-update must be one of {', '.join(BF16_UPDATES)} (got {u!r})")
    chosen = list(dict.fromkeys(precisions)) if precisions else supported
    updates = list(dict.fromkeys(bf16_updates)) if bf16_updates else list(BF16_UPDATES)  # both, side by side
    runs = []
    for p in chosen:
        for u in updates if p == "bf16-true" else [cfg.bf16_update]:
            runs.append({"precision": p, "bf16_update": u, "seed": cfg.seed, "noise": False})
        if p == "32-true" and device.startswith("cuda") and cfg.matmul_precision is None:
            # the seed's table has 32-true at both matmul precisions, and TF32 is what a GPU's auto weighs
            runs.append({**runs[-1], "matmul_precision": "high"})
    if noise_precision == "none":
        return runs
    if noise_precision is None:
        noise_precision = auto.precision if auto and auto.precision in chosen else chosen[0]
    if noise_precision not in chosen:
        raise QserveError(
            f"--noise-precision {noise_precision} is not among the precisions studied "
            f"({', '.join(chosen)}); pick one of them or none"
        )
    first = next(r for r in runs if r["precision"] == noise_precision)
    runs.append({**first, "seed": cfg.seed + 1, "noise": True, "data_seed": split_seed(cfg)})
    return runs


def run_compare(args: argparse.Namespace) -> int:
    """`qserve train --compare`: the precision study over the train command's flags (qserve.cli sends
    the command here; qserve.training.train itself never imports this module)."""
    cfg = config_from_args(args)
    out_dir = Path(args.out) if args.out else Path(DEFAULT_DIR)
    cfg.out = None
    study = compare(
        cfg,
        args.precision,
        out_dir,
        bf16_updates=args.bf16_update,
        noise_precision=args.noise_precision,
        step_rounds=args.step_rounds,
        step_samples=args.step_samples,
    )
    print(f"precision study: {out_dir / 'precision_study.md'} ({len(study['runs'])} runs)")
    return 0 if all(r.get("ok") for r in study["runs"]) else 1


def compare(
    cfg,
    precisions: list[str] | None,
    out_dir,
    bf16_updates: list[str] | None = None,
    noise_precision: str | None = None,
    step_rounds: int = 0,
    step_samples: int = 768,
) -> dict[str, Any]:
    """Run cfg once per precision (children), write precision_study.json/.md in out_dir, return the study.

    noise_precision: run again with seed + 1 ("none" skips it); step_rounds: then time the step again in that many
    interleaved rounds of short children, since machine drift over the long runs exceeds precision differences."""
    validate(cfg)
    if cfg.batch_size is None:  # one batch for every precision: a study compares precisions, not batches
        cfg = replace(cfg, batch_size=BASE_BATCH)
        print(f"every run at --batch-size {BASE_BATCH} (give --batch-size to study another)", flush=True)
    if isinstance(step_rounds, bool) or not isinstance(step_rounds, int) or step_rounds < 0:
        raise QserveError(f"--step-rounds must be an integer >= 0 (got {step_rounds!r})")
    if isinstance(step_samples, bool) or not isinstance(step_samples, int) or step_samples < 3 * cfg.batch_size:
        raise QserveError(
            f"--step-samples must be an integer >= 3 x --batch-size ({3 * cfg.batch_size}), "
            f"so each child times at least two steps after its first (got {step_samples!r})"
        )
    out_dir = Path(out_dir)
    device = resolve_device(cfg.device)
    todo = plan(cfg, precisions, device, bf16_updates, noise_precision)
    refuse_existing(out_dir / "precision_study.json", cfg.force)
    runs: list[dict[str, Any]] = []
    base: dict[str, Any] = {
        "device": device,
        "cpu": cpu_info(),
        "provenance": provenance(),
        "precisions": list(dict.fromkeys(r["precision"] for r in todo)),
        "config": {
            f.name: getattr(cfg, f.name)
            for f in fields(cfg)
            if f.name not in ("precision", "out", "force", "bf16_update")
        },
        "reference": SEED,
        "versions": library_versions(),
    }  # recorded as compared; rendered from SEED
    base["step_rounds"] = {"rounds": step_rounds, "samples": step_samples} if step_rounds else None
    with tempfile.TemporaryDirectory(prefix="qserve-precision-") as tmp:

        def write(complete: bool) -> dict[str, Any]:
            # rewritten after every child: a study cut short keeps the runs it finished
            study = {**base, "runs": runs, **summarize(runs), "complete": complete, "created": now_iso()}
            write_json_atomic(out_dir / "precision_study.json", study)
            write_text_atomic(out_dir / "precision_study.md", with_header(render_markdown(study), study["provenance"]))
            return study

        for i, spec in enumerate(todo):
            m, code = _child(cfg, spec, Path(tmp) / f"run{i}", label(spec))
            run = {**spec, "label": label(spec)}
            if m is None:
                runs.append(
                    {**run, "ok": False, "exit_code": code, "error": "the training run failed; its output is above"}
                )
            else:
                runs.append({**run, "ok": True, **{k: m.get(k) for k in KEPT}, "gpu": m.get("gpu")})
            if any(r["ok"] for r in runs):
                study = write(complete=i + 1 == len(todo) and not step_rounds)
        for k in range(step_rounds if any(r["ok"] for r in runs) else 0):
            for j, (spec, run) in enumerate(zip(todo, runs)):
                if spec["noise"] or not run["ok"]:
                    continue  # the noise run repeats a precision already timed
                short = replace(cfg, max_samples=step_samples, max_eval_samples=cfg.batch_size)
                m, _ = _child(short, spec, Path(tmp) / f"step{k}-{j}", f"{label(spec)}, step round {k + 1}")
                run.setdefault("step_rounds_s", []).append(None if m is None else m.get("step_time_median_s"))
            study = write(complete=k + 1 == step_rounds)
    if not any(r["ok"] for r in runs):
        raise QserveError(f"every precision run failed ({', '.join(r['label'] for r in runs)}); see the output above")
    return study


def _child(cfg, spec: dict[str, Any], out: Path, name: str) -> tuple[dict[str, Any] | None, int]:
    """One `python -m qserve.training.train` child for spec: (its train_metrics.json, exit code); None if it failed."""
    run_cfg = replace(
        cfg,
        bf16_update=spec["bf16_update"],
        seed=spec["seed"],
        data_seed=spec.get("data_seed", cfg.data_seed),
        matmul_precision=spec.get("matmul_precision") or cfg.matmul_precision,
    )
    argv = child_argv(run_cfg, spec["precision"], out)
    print(f"== {name}: {' '.join(argv[1:])}", file=sys.stderr, flush=True)
    proc = subprocess.run(argv, env={**os.environ, "PYTHONUNBUFFERED": "1"}, check=False)
    metrics_path = out / "train_metrics.json"
    if proc.returncode != 0 or not metrics_path.is_file():
        return None, proc.returncode
    return json.loads(metrics_path.read_text(encoding="utf-8")), 0


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Step-time ratios to 32-true, the two-seed noise, and each run's test-accuracy gap to bf16-mixed."""
    ok = [r for r in runs if r["ok"]]
    main = [r for r in ok if not r["noise"]]
    base = next((r["step_time_median_s"] for r in main if r["precision"] == "32-true"), None)
    for r in ok:
        if base:
            r["step_time_vs_32_true"] = round(r["step_time_median_s"] / base, 3)
    noise = None
    extra = next((r for r in ok if r["noise"]), None)
    if extra:
        first = next(
            (r for r in main if (r["precision"], r["bf16_update"]) == (extra["precision"], extra["bf16_update"])), None
        )
        if first:
            noise = {
                "label": first["label"],
                "seeds": [first["seed"], extra["seed"]],
                "test_accuracy": [first["test_accuracy"], extra["test_accuracy"]],
                "test_accuracy_abs_diff": round(abs(first["test_accuracy"] - extra["test_accuracy"]), 6),
            }
    ref = next((r for r in main if r["precision"] == "bf16-mixed"), None)
    gaps = {}
    if ref:
        for r in main:
            if r is not ref:
                gap = r["test_accuracy"] - ref["test_accuracy"]
                gaps[r["label"]] = {
                    "test_accuracy_minus_bf16_mixed": round(gap, 6),
                    "exceeds_noise": None if noise is None else abs(gap) > noise["test_accuracy_abs_diff"],
                }
    by: dict[str, dict[str, Any]] = {}
    for r in main:  # a precision's first run (not the TF32 one after 32-true, not plain bf16-true)
        if r["precision"] != "bf16-true" or r["bf16_update"] != "plain":
            by.setdefault(r["precision"], r)
    return {
        "bf16_mixed_over_32_true_step_time": by.get("bf16-mixed", {}).get("step_time_vs_32_true"),
        "noise": noise,
        "gaps_to_bf16_mixed": gaps,
        **_interleaved(main, by),
    }


def _interleaved(main: list[dict[str, Any]], by: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Each run's median step over the interleaved rounds, and its ratio to 32-true's and bf16-mixed's."""
    for r in main:
        got = [x for x in r.get("step_rounds_s") or [] if x is not None]
        r["step_interleaved_s"] = round(statistics.median(got), 6) if got else None
    out: dict[str, Any] = {}
    for name, ref in (("32_true", by.get("32-true")), ("bf16_mixed", by.get("bf16-mixed"))):
        base = (ref or {}).get("step_interleaved_s")
        for r in main:
            if base and r["step_interleaved_s"]:
                r[f"step_interleaved_vs_{name}"] = round(r["step_interleaved_s"] / base, 3)
    # paired by round too: one round's runs met the same machine speed, steadier when the machine drifts
    mixed = (by.get("bf16-mixed") or {}).get("step_rounds_s") or []
    for r in main:
        pairs = [a / b for a, b in zip(r.get("step_rounds_s") or [], mixed) if a and b]
        if pairs:
            r["step_round_ratios_vs_bf16_mixed"] = [round(x, 3) for x in pairs]
            r["step_round_ratio_median_vs_bf16_mixed"] = round(statistics.median(pairs), 3)
    true = by.get("bf16-true", {})
    out["bf16_true_over_bf16_mixed_step_interleaved"] = true.get("step_interleaved_vs_bf16_mixed")
    out["bf16_true_over_bf16_mixed_step_round_ratio_median"] = true.get("step_round_ratio_median_vs_bf16_mixed")
    return out


def _fmt(v, spec: str, scale: float = 1.0) -> str:
    return "—" if v is None else format(v * scale, spec)


def _amx(cpu: dict[str, Any]) -> str:
    return "with AMX (amx_bf16)" if "amx_bf16" in cpu.get("flags", []) else "no AMX"


SEED_HEAD = ["run", "train time (min)", "vs 32-true", "peak memory (GB)", "vs 32-true", "test acc"]
SEED_HEAD += ["seed: train time (min)", "vs 32-true", "peak memory (GB)", "vs 32-true", "test acc"]


def _matmul(run: dict[str, Any], cfg: dict[str, Any]) -> str:
    return run.get("matmul_precision") or cfg.get("matmul_precision") or "highest"  # torch's default


def _seed_key(r: dict[str, Any]) -> tuple[str, str, str | None]:
    return r["precision"], r["matmul"], r.get("bf16_update") if r["precision"] == "bf16-true" else None


def seed_rows(study: dict[str, Any]) -> list[list[str]]:
    """Our runs (first seed) and the seed's, one row per (precision, matmul precision, bf16-true update), each
    side's time and memory also as a ratio to its own 32-true; the seed's bf16-true ran plain Adam."""
    cfg = study.get("config") or {}
    ours = {_seed_key({**r, "matmul": _matmul(r, cfg)}): r for r in study["runs"] if r.get("ok") and not r.get("noise")}
    seed = {_seed_key(r): r for r in SEED["runs"]}
    base = ours.get(("32-true", "highest", None)) or {}
    sbase = seed[("32-true", "highest", None)]

    def ratio(v, b) -> str:
        return f"{v / b:.2f}x" if v and b else "—"

    rows = []
    for key in list(ours) + [k for k in seed if k not in ours]:
        o, r = ours.get(key), seed.get(key)
        tf32, update = " (TF32)" if key[1] == "high" else "", f" ({key[2]})" if key[2] else ""
        name = o["label"] if o else f"{key[0]}{tf32}{update} (seed only)"
        mine = (
            ["—"] * 5
            if o is None
            else [
                _fmt(o.get("train_time_s"), ".2f", 1 / 60),
                ratio(o.get("train_time_s"), base.get("train_time_s")),
                _fmt(o.get("peak_memory_bytes"), ".2f", 1e-9),
                ratio(o.get("peak_memory_bytes"), base.get("peak_memory_bytes")),
                _fmt(o.get("test_accuracy"), ".2%"),
            ]
        )
        theirs = (
            ["—"] * 5
            if r is None
            else [
                f"{r['train_time_min']:.2f}",
                ratio(r["train_time_min"], sbase["train_time_min"]),
                f"{r['peak_memory_gb']:.2f}",
                ratio(r["peak_memory_gb"], sbase["peak_memory_gb"]),
                f"{r['test_accuracy']:.2%}" + (f" ({r['note']})" if r.get("note") else ""),
            ]
        )
        rows.append([name, *mine, *theirs])
    return rows


def seed_table() -> str:
    """The seed's study alone, with its ratios to its own 32-true (docs/training.md renders it from SEED)."""
    sbase = next(r for r in SEED["runs"] if (r["precision"], r["matmul"]) == ("32-true", "highest"))
    rows = [
        [
            r["precision"] + (" (TF32)" if r["matmul"] == "high" else ""),
            f"{r['train_time_min']:.2f}",
            f"{r['train_time_min'] / sbase['train_time_min']:.2f}x",
            f"{r['peak_memory_gb']:.2f}",
            f"{r['peak_memory_gb'] / sbase['peak_memory_gb']:.2f}x",
            f"{r['test_accuracy']:.2%}",
            r.get("note", ""),
        ]
        for r in SEED["runs"]
    ]
    head = ["precision", "train time (min)", "vs 32-true", "peak memory (GB)", "vs 32-true", "test acc", "note"]
    return "\n".join(_table(head, rows, text_last=True))


def _table(head: list[str], rows: list[list[str]], text_last: bool = False) -> list[str]:
    numbers = len(head) - 1 - text_last
    return ["| " + " | ".join(head) + " |", "|---|" + "---:|" * numbers + "---|" * text_last] + [
        "| " + " | ".join(r) + " |" for r in rows
    ]


def render_markdown(study: dict[str, Any]) -> str:
    cfg = study["config"]
    ok = [r for r in study["runs"] if r["ok"]]
    sizes = ok[0]["sizes"] if ok else {}
    cpu = study["cpu"]
    where = study["device"] if study["device"] == "cpu" else (ok[0].get("gpu") if ok else study["device"])
    lines = [
        "# Precision study (qserve)",
        "",
        f"Model `{ok[0]['model_name'] if ok else cfg['model']}` fine-tuned on `{cfg['dataset']}` "
        f"(train {sizes.get('train')}, val {sizes.get('val')}, test {sizes.get('test')}), {cfg['epochs']} epoch(s), "
        f"batch {cfg['batch_size']}, max length {cfg['max_length']}, lr {cfg['lr']}, seed {cfg['seed']}, "
        f"on {where}: **{cpu['model']}, {_amx(cpu)}**, {cpu['cores']} cores, flags: {' '.join(cpu['flags'])}. "
        "Each run in its own process, one after the other."
        + ("" if study.get("complete", True) else " **Incomplete: the study stopped before its last run.**"),
        "",
        "| run | optimizer | train time (min) | median step (s) | step vs 32-true | optimizer step (s) "
        "| optimizer state (MB) | peak memory (GB) | val acc | test acc |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in study["runs"]:
        if not r["ok"]:
            lines.append(f"| {r['label']} | failed (exit {r['exit_code']}) | | | | | | | | |")
            continue
        lines.append(
            f"| {r['label']} | {r.get('optimizer') or '—'} | {_fmt(r['train_time_s'], '.2f', 1 / 60)} | "
            f"{_fmt(r['step_time_median_s'], '.4f')} | {_fmt(r.get('step_time_vs_32_true'), '.2f')}x | "
            f"{_fmt(r.get('optimizer_step_median_s'), '.4f')} | "
            f"{_fmt(r.get('optimizer_state_bytes'), '.1f', 1e-6)} | "
            f"{_fmt(r['peak_memory_bytes'], '.2f', 1e-9)} | "
            f"{_fmt(r['val_accuracy'], '.2%', 1)} | {_fmt(r['test_accuracy'], '.2%', 1)} |"
        )
    ratio = study.get("bf16_mixed_over_32_true_step_time")
    kind = ok[0]["peak_memory_kind"] if ok else ""
    lines += [
        "",
        f"bf16-mixed / 32-true median step time: **{_fmt(ratio, '.2f')}x**. Peak memory is {kind}; "
        "optimizer state is the bytes of the optimizer's per-parameter tensors (moments, Kahan buffer).",
        "",
    ]
    rounds = study.get("step_rounds")
    if rounds and any(r.get("step_rounds_s") for r in ok):
        n = max(len(r.get("step_rounds_s") or []) for r in ok)
        lines += [
            f"Step time, interleaved: after the full runs, {n} round(s) of short children ({rounds['samples']} "
            "training examples each, the same batches for every run); every run once per round, taking "
            "turns, so a machine whose speed drifts over minutes slows all of them alike. Median step of "
            "each child (first step left out), then the median over rounds:",
            "",
            "| run | per round (s) | median (s) | vs 32-true | vs bf16-mixed | vs bf16-mixed, round by round "
            "(median) |",
            "|---|---|---:|---:|---:|---|",
        ]
        for r in ok:
            if r.get("step_rounds_s"):
                per = ", ".join(_fmt(x, ".4f") for x in r["step_rounds_s"])
                paired = ", ".join(f"{x:.3f}" for x in r.get("step_round_ratios_vs_bf16_mixed") or [])
                lines.append(
                    f"| {r['label']} | {per} | {_fmt(r.get('step_interleaved_s'), '.4f')} | "
                    f"{_fmt(r.get('step_interleaved_vs_32_true'), '.3f')}x | "
                    f"{_fmt(r.get('step_interleaved_vs_bf16_mixed'), '.3f')}x | {paired} "
                    f"({_fmt(r.get('step_round_ratio_median_vs_bf16_mixed'), '.3f')}x) |"
                )
        lines.append("")
    noise = study.get("noise")
    if noise:
        a, b = noise["test_accuracy"]
        lines.append(
            f"Run-to-run noise: {noise['label']} with seeds {noise['seeds'][0]} and {noise['seeds'][1]} "
            f"(same data split) scored {a:.2%} and {b:.2%} test accuracy: "
            f"**{noise['test_accuracy_abs_diff'] * 100:.2f} points** apart."
        )
    gaps = study.get("gaps_to_bf16_mixed") or {}
    if gaps:
        lines += ["", "| run | test acc minus bf16-mixed (points) | larger than the noise |", "|---|---:|---|"]
        for name, g in gaps.items():
            exceeds = {None: "—", True: "yes", False: "no"}[g["exceeds_noise"]]
            lines.append(f"| {name} | {g['test_accuracy_minus_bf16_mixed'] * 100:+.2f} | {exceeds} |")
    lines += [
        "",
        "## Beside the seed (its A100 figures, not measured by qserve)",
        "",
        f"The seed project's study ([source]({SEED['source']})): {SEED['setup']}. Another model, data size, "
        "recipe and GPU: compare the ratios to each table's own 32-true, not the absolute numbers. Ours: "
        f"train time excludes validation; peak memory is {kind}.",
        "",
    ]
    lines += _table(SEED_HEAD, seed_rows(study)) + [""]
    return "\n".join(lines)
