"""Repair every int8 and 4-bit variant of a run: each meets the bench's bar and passes its gate, or says how close.

    python -m benchmarks.repair_bench models/minilm-l6-distilbert-imdb --out benchmarks/reports/repair-xeon

Copies the run's checkpoint, torch-fp32 and quantized variants into --work (the run stays as it is); gates each as
it is on the 1,000 test texts the pipeline's bench scores (the sequential gate: more where undecided), repairs it
(qserve/repair.py: ranked on training texts, searched on validation texts, exported once, gated once on those test
texts) and benches each beside its repair in one run (b1 on real test texts, size). Writes report.json and report.md.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.harness import finish, machine
from qserve.artifact import read_manifest
from qserve.bench import BenchConfig, run_bench
from qserve.bench.recommend import ranked
from qserve.benchreport import real_text_b1
from qserve.gate.config import GateConfig
from qserve.gate.run import run_gate
from qserve.placement import plan
from qserve.repair import RepairConfig, repair
from qserve.variants import backend_of, bar_for


def quantized(run_dir: Path) -> list[str]:
    """The run's variants of at most 8 bits whose backend can keep layers in fp32 and that run on this machine."""
    names = sorted(p.name for p in (run_dir / "variants").iterdir() if (p / "manifest.json").is_file())
    runs = set(plan("cpu", [n for n in names if not n.endswith("-repaired")]).runs)
    return [
        n
        for n in names
        if n in runs and read_manifest(run_dir / "variants" / n).spec.bits <= 8 and backend_of(n).layers
    ]


def run(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    src, work = Path(args.run_dir), Path(args.work or tempfile.mkdtemp(prefix="qserve-repair-bench-"))
    names = args.variants.split(",") if args.variants else quantized(src)
    shutil.copytree(src / "checkpoint", work / "checkpoint", dirs_exist_ok=True)
    for n in ["torch-fp32", *names]:
        shutil.copytree(src / "variants" / n, work / "variants" / n, dirs_exist_ok=True)
    gate = GateConfig(max_eval_samples=args.texts, max_calibration_samples=args.texts, threads=args.threads)
    rows, dirs = [], [work / "variants" / "torch-fp32"]
    for n in names:
        variant = work / "variants" / n
        (before,) = run_gate([variant], gate)
        r = repair(variant, work / "checkpoint", gate, RepairConfig(repair_budget=args.budget), None)
        rows.append(
            {
                "variant": n,
                "bits": read_manifest(variant).spec.bits,
                "bar": bar_for(read_manifest(variant).spec.bits),
                "search_before": r["before"],
                "gate_before": before["gate"],
                "repair": r.get("repair"),
                "gate_after": r.get("gate"),
            }
        )
        dirs += [variant, *([Path(r["dir"])] if r.get("dir") else [])]
    cfg = BenchConfig(
        batch_sizes=[1],
        seq_lens=[128],
        threads=args.threads,
        device="cpu",
        out=work / "bench",
        force=True,
        max_eval_samples=args.texts,
        time_budget_s=args.time_budget,
        long_text=None,
        floor=False,
    )
    bench = run_bench(dirs, cfg)
    speed = {Path(v["dir"]).name: v for v in bench["variants"]}
    for row in rows:
        for side, name in (("before", row["variant"]), ("after", f"{row['variant']}-repaired")):
            v = speed.get(name) or {}
            b1 = real_text_b1(v)
            row[f"b1_ms_{side}"] = ranked(b1)[0] if b1 else None
            row[f"mb_{side}"] = round((v.get("weights_bytes") or v.get("disk_bytes") or 0) / 1e6, 2) or None
            row[f"agreement_bench_{side}"] = v.get("agreement")
    return {"machine": machine(), "run_dir": str(src), "texts": args.texts, "budget_s": args.budget, "rows": rows}


def _gate(g: dict[str, Any] | None) -> str:
    if not g:
        return "—"
    a = g["agreement"]
    return f"{g['decision']} at {g['n']}: {a['value']:.2%} [{a['lo']:.2%}, {a['hi']:.2%}]"


def render(rep: dict[str, Any]) -> str:
    """report.md from report.json: one row per variant, then each search's trace."""
    rows = rep["rows"]
    as_is = sum(r["gate_before"]["decision"] == "passed" for r in rows)
    repaired = sum(bool(r["repair"]) and (r["gate_after"] or {}).get("decision") == "passed" for r in rows)
    lines = [
        "# Repair: the quantized variants, before and after",
        "",
        f"**{as_is + repaired} of {len(rows)} int8 and 4-bit variants pass their gate on {rep['texts']:,} test texts: "
        f"{as_is} as exported, {repaired} after repair, {len(rows) - as_is - repaired} not within the budget.**",
        "",
        f"Run `{rep['run_dir']}` on {rep['machine']['cpu']}: each variant gated as it is, then repaired (search on "
        f"validation texts, {rep['budget_s']:g}s budget) and its repair gated once on the {rep['texts']:,} test texts "
        "the bench scores (more where undecided); speed is b1 on real test texts, both benched in one run.",
        "",
        "| variant | bar | agreement before (search) | gate before | layers kept | agreement after (search) "
        "| gate after | b1 ms before -> after | MB before -> after | repair s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rep["rows"]:
        rec = r["repair"] or {}
        b0, b1 = r.get("b1_ms_before"), r.get("b1_ms_after")
        speed = f"{b0:.2f} -> {b1:.2f} ({b1 / b0:.2f}x)" if b0 and b1 else (f"{b0:.2f}" if b0 else "—")
        after = rec.get("closest", {}).get("agreement")
        lines.append(
            f"| {r['variant']} | {r['bar']:.0%} | {r['search_before']['agreement']:.2%} | {_gate(r['gate_before'])} "
            f"| {len(rec['kept']) if rec else 'not needed'}"
            + ("" if not rec or rec["reached"] else f" ({rec['why']})")
            + f" | {'—' if after is None else f'{after:.2%}'} | {_gate(r['gate_after'])} | {speed} "
            f"| {r.get('mb_before') or '—'} -> {r.get('mb_after') or '—'} | {rec.get('seconds', '—')} |"
        )
    for r in rep["rows"]:
        rec = r["repair"]
        if rec:
            lines += [
                "",
                f"**{r['variant']}** kept {', '.join(f'`{k}`' for k in rec['kept']) or 'nothing'}; the search:",
            ]
            lines += [
                f"- {len(s['kept'])} kept: agreement {s['agreement']:.2%}, accuracy {s['accuracy_delta']:+.2%} "
                f"({s['seconds']}s)"
                for s in rec["trace"]
            ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", help="a pipeline run dir: checkpoint/ and variants/ (read only)")
    p.add_argument("--out", type=Path, required=True, help="where report.json and report.md go")
    p.add_argument("--work", help="where the copies and the repaired variants go (default: a new temp dir)")
    p.add_argument("--variants", help="comma list (default: every int8 and 4-bit variant a backend can repair)")
    p.add_argument("--texts", type=int, default=1000, help="test texts the gates start on (default %(default)s)")
    p.add_argument(
        "--budget", type=float, default=300.0, help="seconds of each ranking and search (default %(default)s)"
    )
    p.add_argument("--time-budget", type=float, default=1.0, help="bench seconds per shape (default %(default)s)")
    p.add_argument("--threads", type=int, default=None, help="threads (default: all cores)")
    return finish("repair_bench", p.parse_args(argv), argv, run, render, lambda rep: False)


if __name__ == "__main__":
    sys.exit(main())
