"""Does `qserve bench` give the same answer twice? N consecutive runs over the same variant dirs.

    python -m benchmarks.bench_repeat models/minilm-l6-distilbert-imdb/variants/* --runs 5 \
        --out benchmarks/reports/bench-repeat -- --batch-sizes 1,32 --seq-lens 128 --threads 2

Each run is a plain `qserve bench` (its own children, its own rounds) writing into OUT/runs/N; after them the
report holds, per run, the recommended variant and the set tied with it, and per variant the p50 the
recommendation weighs (its ranking entry) in every run with the span max / min. The verdict: the same
recommendation (or the same tie, same set and same tie-break) every run, and every weighed variant's span within
--max-span. Arguments after `--` go to `qserve bench` unchanged.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import ROOT, finish, write_report

MAX_SPAN = 1.15
"""The issue's bar (#60): a weighed variant's p50 across the runs spans at most this (max / min)."""


def run_once(dirs: list[str], out: Path, extra: list[str]) -> dict[str, Any]:
    """One `qserve bench` into `out`; its report.json's recommendation and ranking, and its wall time."""
    t0 = time.monotonic()
    cmd = [sys.executable, "-m", "qserve", "bench", *dirs, "--out", str(out), "--force", *extra]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - t0
    path = out / "report.json"
    if proc.returncode != 0 or not path.is_file():
        return {"ok": False, "wall_s": wall, "error": (proc.stderr or proc.stdout)[-2000:]}
    rec = json.loads(path.read_text(encoding="utf-8")).get("recommended") or {}
    return {
        "ok": True,
        "wall_s": round(wall, 1),
        "variant": rec.get("variant"),
        "tied_with": sorted(rec.get("tied_with") or []),
        "ratio_text": rec.get("ratio_text"),
        "runner_up": rec.get("runner_up"),
        "why": rec.get("why"),
        "p50_ms": {r["variant"]: r["p50_ms"] for r in rec.get("ranking") or [] if r.get("p50_ms") is not None},
        "meets_bar": sorted(r["variant"] for r in rec.get("ranking") or [] if r.get("meets_bar")),
    }


def summarize(runs: list[dict[str, Any]], max_span: float = MAX_SPAN) -> dict[str, Any]:
    """The verdict over the runs: one answer (variant + tie set) or several; each weighed variant's span."""
    ok = [r for r in runs if r["ok"]]
    answers = sorted({json.dumps([r["variant"], r["tied_with"]]) for r in ok})
    weighed = sorted({v for r in ok for v in r["meets_bar"]})
    spans = {}
    for v in weighed:
        vals = [r["p50_ms"][v] for r in ok if v in r["p50_ms"]]
        spans[v] = {"p50_ms": vals, "span": round(max(vals) / min(vals), 3) if vals else None}
    return {
        "runs_ok": len(ok),
        "runs": len(runs),
        "answers": [json.loads(a) for a in answers],
        "same_answer": len(answers) == 1 and len(ok) == len(runs),
        "spans": spans,
        "max_span": max_span,
        "spans_hold": all(s["span"] is not None and s["span"] <= max_span for s in spans.values()),
    }


def render(rep: dict[str, Any]) -> str:
    s = rep["summary"]
    lines = [
        "# The same machine gives the same answer: consecutive `qserve bench` runs",
        "",
        f"{s['runs']} runs over {len(rep['variant_dirs'])} variant dirs, one after another, nothing else running; "
        f"`qserve bench` flags: `{' '.join(rep['bench_args']) or '(defaults)'}`.",
        "",
        "| run | recommended | tied with | against the runner-up | wall s |",
        "|---|---|---|---|---|",
    ]
    for i, r in enumerate(rep["runs"], 1):
        if not r["ok"]:
            lines.append(f"| {i} | failed | | | {r['wall_s']:.0f} |")
            continue
        tie = ", ".join(r["tied_with"]) or "-"
        lines.append(
            f"| {i} | {r['variant']} | {tie} | {r['ratio_text'] or '-'} ({r['runner_up'] or '-'}) | {r['wall_s']:.0f} |"
        )
    verdict = "the same answer every run" if s["same_answer"] else f"{len(s['answers'])} different answers"
    lines += [
        "",
        f"**{verdict}**; spans of the weighed variants' p50 "
        + ("all within" if s["spans_hold"] else "NOT all within")
        + f" {s['max_span']}x.",
        "",
        "| variant (meets its bar) | p50 ms per run | span (max / min) |",
        "|---|---|---|",
    ]
    for v, sp in s["spans"].items():
        lines.append(f"| {v} | {' / '.join(f'{x:.2f}' for x in sp['p50_ms'])} | {sp['span']}x |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("variant_dirs", nargs="+")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--max-span", type=float, default=MAX_SPAN)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "reports" / "bench-repeat")
    args = p.parse_args(own)
    if args.runs < 2:
        p.error(f"--runs {args.runs}: at least 2 (a repeat needs two runs)")

    def run(a: argparse.Namespace, _argv: list[str]) -> dict[str, Any]:
        runs: list[dict[str, Any]] = []
        for i in range(1, a.runs + 1):
            runs.append(run_once(a.variant_dirs, a.out / "runs" / str(i), extra))
            rep = {"variant_dirs": a.variant_dirs, "bench_args": extra, "runs": runs, "done": i == a.runs}
            rep["summary"] = summarize(runs, a.max_span)
            if i < a.runs:  # a killed repeat keeps the runs it finished
                write_report(a.out, dict(rep), render(rep), echo=False)
        return rep

    return finish(
        "bench_repeat",
        args,
        own,
        run,
        render,
        lambda r: not (r["summary"]["same_answer"] and r["summary"]["spans_hold"]),
    )


if __name__ == "__main__":
    raise SystemExit(main())
