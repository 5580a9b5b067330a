"""Does `qserve bench` give the same answer twice? N consecutive runs over the same variant dirs.

    python -m benchmarks.bench_repeat models/minilm-l6-distilbert-imdb/variants/* --runs 5 \
        --out benchmarks/reports/bench-repeat -- --batch-sizes 1,32 --seq-lens 128 --threads 2

Each run is a plain `qserve bench` (its own children, its own rounds) writing into OUT/runs/N; after them the
report holds, per run, the recommended variant and the set tied with it, and for the recommended variant and the
runner-up of every run the p50 the recommendation ranks them by, in every run, with the span max / min. The verdict:
the same recommendation (or the same tie, same set and same tie-break) every run, and each of those spans within
--max-span. Arguments after `--` go to `qserve bench` unchanged.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import ROOT, finish, write_report
from qserve.bench.config import BenchConfig
from qserve.bench.recommend import two_modes

APART = BenchConfig.stability
"""Two modes are the bench's: medians more than its --stability apart."""
KEEP = ("report.json", "report.md")
"""What each run keeps: its html, csv and plots are views of its report.json."""
MAX_SPAN = 1.15
"""The issues' bar (#60, #67): the recommended and runner-up ranked p50 across the runs span at most this."""


def run_once(dirs: list[str], out: Path, extra: list[str]) -> dict[str, Any]:
    """One `qserve bench` into `out`; its report.json's recommendation and ranking, and its wall time."""
    t0 = time.monotonic()
    cmd = [sys.executable, "-m", "qserve", "bench", *dirs, "--out", str(out), "--force", *extra]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - t0
    for f in out.iterdir() if out.is_dir() else []:  # the html, csv and plots are what report.json holds, drawn
        if f.is_file() and f.name not in KEEP:
            f.unlink()
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
        "median_ms": {r["variant"]: r["median_ms"] for r in rec.get("ranking") or [] if r.get("median_ms")},
        "meets_bar": sorted(r["variant"] for r in rec.get("ranking") or [] if r.get("meets_bar")),
    }


def summarize(runs: list[dict[str, Any]], max_span: float = MAX_SPAN) -> dict[str, Any]:
    """The verdict over the runs: one recommendation or several, one answer (variant + tie set) or several; the span
    of each variant that was the recommendation or its runner-up in a run."""
    ok = [r for r in runs if r["ok"]]
    answers = sorted({json.dumps([r["variant"], r["tied_with"]]) for r in ok})
    weighed = sorted({v for r in ok for v in (r["variant"], r.get("runner_up")) if v})
    spans = {}
    for v in weighed:
        vals = [r["p50_ms"][v] for r in ok if v in r["p50_ms"]]
        medians = [r["median_ms"][v] for r in ok if v in r.get("median_ms", {})]
        spans[v] = {"p50_ms": vals, "span": round(max(vals) / min(vals), 3) if vals else None}
        if medians:  # over every round, beside the ranked figure (the fast mode's, where the rounds fall in two)
            spans[v].update({"median_ms": medians, "median_span": round(max(medians) / min(medians), 3)})
    return {
        "runs_ok": len(ok),
        "runs": len(runs),
        "answers": [json.loads(a) for a in answers],
        "same_answer": len(answers) == 1 and len(ok) == len(runs),
        # issue 67's bar: the same variant each run, a tie broken by the unchanged rule counting as the same
        "same_recommendation": len({r["variant"] for r in ok}) == 1 and len(ok) == len(runs),
        "spans": spans,
        "max_span": max_span,
        "spans_hold": all(s["span"] is not None and s["span"] <= max_span for s in spans.values()),
    }


def machine(run_dirs: list[Path]) -> dict[str, Any] | None:
    """The CPU the runs measured on, as the first finished run's report.json records it."""
    for run in run_dirs:
        if (run / "report.json").is_file():
            return json.loads((run / "report.json").read_text(encoding="utf-8"))["environment"].get("cpu")
    return None


def phases(run_dirs: list[Path]) -> dict[str, Any] | None:
    """Do slow rounds fall on one process or on every variant at once? Per run, each variant's headline
    fixed-shape p50 in every round it shares with the other contenders (no text in it: the same work every round;
    a raced-out variant has one round), over its
    fastest round: the mean pairwise correlation of those ratios across variants, and the rounds in which every
    variant sat in the same mode (qserve.bench.recommend.two_modes, as the bench splits them; one mode is all fast)
    against the number that independent modes would give."""
    rounds: list[dict[str, float]] = []
    split: list[dict[str, bool]] = []
    for run in run_dirs:
        if not (run / "report.json").is_file():
            continue  # a failed run
        rep = json.loads((run / "report.json").read_text(encoding="utf-8"))
        head = (rep["headline"]["batch"], rep["headline"]["seq"])
        per = {
            v["name"]: f["round_p50"]
            for v in rep["variants"]
            for f in v.get("fixed") or []
            if (f.get("batch"), f.get("seq")) == head and f.get("round_p50")
        }
        per = {n: r for n, r in per.items() if len(r) > 1}  # the contenders: a raced-out variant has one round
        if len(per) < 2:
            continue
        common = sorted(set.intersection(*(set(r) for r in per.values())), key=lambda k: int(k.rsplit("#", 1)[1]))
        low = {n: min(r[k] for k in common) for n, r in per.items()}  # always in the fast mode, in every run
        modes = {n: two_modes([r[k] for k in common], APART) for n, r in per.items()}
        cut = {n: m[0][-1] if m else math.inf for n, m in modes.items()}
        rounds += [{n: per[n][k] / low[n] for n in per} for k in common]
        split += [{n: per[n][k] > cut[n] for n in per} for k in common]
    if len(rounds) < 2:  # a correlation needs two rounds
        return None
    names = sorted(set.intersection(*(set(r) for r in rounds)))  # the contenders of every run
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]]
    series = {n: [r[n] for r in rounds] for n in names}
    corr = [statistics.correlation(series[a], series[b]) for a, b in pairs if len({*series[a]}) > 1 < len({*series[b]})]
    if not corr:
        return None
    slow = {n: sum(s[n] for s in split) / len(split) for n in names}
    expected = math.prod(slow.values()) + math.prod(1 - x for x in slow.values())
    return {
        "rounds": len(rounds),
        "variants": names,
        "mean_pair_correlation": round(statistics.mean(corr), 3),
        "same_side": sum(len({s[n] for n in names}) == 1 for s in split),
        "same_side_if_independent": round(expected * len(split), 1),
        "slow_share": {n: round(x, 3) for n, x in slow.items()},
        "mode_ratio": {
            n: round(
                statistics.median(r[n] for r, s in zip(rounds, split) if s[n])
                / statistics.median(r[n] for r, s in zip(rounds, split) if not s[n]),
                3,
            )
            for n in names
            if 0 < slow[n] < 1
        },
    }


def render(rep: dict[str, Any]) -> str:
    s, ok = rep["summary"], [r for r in rep["runs"] if r["ok"]]
    recs = sorted({a[0] for a in s["answers"]})
    verdict = (
        "the same answer every run"
        if s["same_answer"]
        else f"the same recommendation every run, {recs[0]} (tied in {sum(bool(r['tied_with']) for r in ok)} of "
        f"{len(ok)} runs, each tie broken by the unchanged rule)"
        if s.get("same_recommendation")
        else f"{len(recs)} different recommendations"
    )
    lines = [
        "# The same machine gives the same answer: consecutive `qserve bench` runs",
        "",
        f"**{verdict[0].upper() + verdict[1:]}**; spans of the recommended and runner-up p50 "
        + ("all within" if s["spans_hold"] else "NOT all within")
        + f" {s['max_span']}x.",
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
    lines += [
        "",
        "The p50 the recommendation ranks by (the fast mode's where a variant's rounds fall in two), and beside it"
        " the median over every round.",
        "",
        "| variant (recommended or runner-up) | ranked p50 ms per run | span (max / min) | median over every round | "
        "span |",
        "|---|---|---|---|---|",
    ]
    for v, sp in s["spans"].items():
        med = sp.get("median_ms") or []
        lines.append(
            f"| {v} | {' / '.join(f'{x:.2f}' for x in sp['p50_ms'])} | {sp['span']}x | "
            f"{' / '.join(f'{x:.2f}' for x in med) or '-'} | {str(sp['median_span']) + 'x' if med else '-'} |"
        )
    if rep.get("phases"):
        ph = rep["phases"]
        lines += [
            "",
            f"Phases: over {ph['rounds']} rounds shared by every variant, {ph['same_side']} had every variant in the"
            f" same mode ({ph['same_side_if_independent']} if each variant's mode were its own); mean pairwise"
            f" correlation of the rounds' headline p50s {ph['mean_pair_correlation']}; slow mode / fast mode: "
            + ", ".join(f"{n} {x}x" for n, x in ph["mode_ratio"].items())
            + ".",
        ]
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
            done = [a.out / "runs" / str(j) for j in range(1, i + 1)]
            rep["cpu"], rep["phases"] = machine(done), phases(done)
            if i < a.runs:  # a killed repeat keeps the runs it finished
                write_report(a.out, dict(rep), render(rep), echo=False)
        return rep

    return finish(
        "bench_repeat",
        args,
        own,
        run,
        render,
        lambda r: not (r["summary"]["same_recommendation"] and r["summary"]["spans_hold"]),
    )


if __name__ == "__main__":
    raise SystemExit(main())
