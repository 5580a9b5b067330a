"""How the measurements are made and trusted: the `make reports` stages, why the bench scores 1,000 texts, and
qserve bench against plain onnxruntime / torch loops.

    python -c "from benchmarks.render.blocks.bench import stages; print(stages())"
"""

from __future__ import annotations

import statistics
from pathlib import Path

from benchmarks.render import rebuild
from benchmarks.render.blocks.cells import num, pct, span, table
from benchmarks.render.blocks.long_text import policy_rows
from benchmarks.render.blocks.reports import MAIN_JOB, cpu_of, load, on


def stages() -> str:
    """The `make reports` stages: what each re-runs, the CPU its reports record, and how long it takes."""
    rows = []
    for st in rebuild.STAGES:
        cpus = sorted({c or "not recorded" for c in rebuild.recorded(st).values()}) or [
            f"no report yet ({st.pending})" if st.pending else "no report yet"
        ]
        reports = ", ".join(f"`{Path(r.json).relative_to('benchmarks/reports')}`" for r in st.reports)
        rows.append(
            [
                f"`{st.name}`",
                st.what + ("" if not st.notes else " (" + " ".join(st.notes) + ")"),
                reports,
                ", ".join(cpus),
                rebuild.stage_duration(st),
            ]
        )
    head = ["STAGE", "what it re-runs", "reports (under benchmarks/reports/)", "measured on", "duration on 2 cores"]
    return table(head, rows, ["---"] * 5) + (
        "\n\n<sub>Rendered from `benchmarks/render/rebuild.py`, the CPU each report's JSON records, and the measured "
        f"times in its pipeline record or `{rebuild.STAGE_TIMES}`.</sub>"
    )


def crosscheck() -> str:
    """qserve bench against plain onnxruntime / torch loops, each variant judged by its median round."""
    rel = "crosscheck.json"
    r = load(rel)
    ratios = ", ".join(
        f"{num(x['ratio'])} {n} (qserve {num(x['qserve_p50'], 1)} ms; per round {span(x['round_ratios'])})"
        for n, x in r["rows"].items()
    )
    return (
        f"{on(rel)}, {r['rounds']} rounds of plain-bench-plain: "
        f"median-round ratios (qserve / plain) {ratios}. {r['verdict']}"
    )


BENCH_DECIDING = ("embedded-default", "pipeline-fast-amd", MAIN_JOB)
"""The pipeline reports whose bench scores a deciding variant on all its eval texts (after issue 30)."""


def bench_eval_cut() -> str:
    """docs/bench.md's reason for 1,000 texts: where the int8 variants sit, and how far apart the policies are."""
    sits = []
    for d in BENCH_DECIDING:
        r = load(f"{d}/report.json")
        n = r["config"]["max_eval_samples"]
        sits += [
            f"{v['name']} {pct(v['agreement'], 1)} (`{d}/`, {cpu_of(f'{d}/report.json')})"
            for v in r["variants"]
            if v["status"] == "ok" and "int8" in v["name"] and (v.get("accuracy") or {}).get("n") == n
        ]
    lt_rel = "long-text/report.json"
    pol = policy_rows(load(lt_rel))
    n_lt = next(iter(pol.values())).get("n")
    order = sorted(pol, key=lambda p: -pol[p]["accuracy"])
    return (
        "The int8 variants scored on all 1,000 reviews of a pipeline report read: "
        + ", ".join(sits)
        + ". Policy accuracies differ by points ("
        + " vs ".join(f"{p} {pct(pol[p]['accuracy'])}" for p in order)
        + f" on {n_lt:,} reviews, {on(lt_rel)})."
    )


B1_MODES = "b1-modes-amd/report.json"


def b1_modes() -> str:
    """docs/bench.md's per-process b1 latency: each setting's per-process medians, and how many were slow."""
    r = load(B1_MODES)
    cells = r["cells"]
    first = next(iter(cells)).split("|")[0]

    def said(c: dict, setting: str) -> str:
        cut = r["starved_below"] * (1 if setting == "threads=1" else 2)  # of the CPU its intra-op threads use
        fed = [x["p50"] for x in c["runs"] if x["cpu_per_wall"] >= cut]
        starved = [x["p50"] for x in c["runs"] if x["cpu_per_wall"] < cut]
        split = ", ".join(
            f"{len(xs)} {name} at a median {num(statistics.median(xs))} ms"
            for name, xs in (("fed", fed), ("starved", starved))
            if xs
        )
        return (
            f"{num(c['median'])} ms (processes {span(c['p50s'])} ms, {num(c['spread'])}x; "
            f"{c['slow']} of {len(c['p50s'])} in the slow mode, above {num(c['slow_mode_ms'])} ms; {split})"
        )

    mine = {k.split("|")[1]: c for k, c in cells.items() if k.startswith(first + "|") and c["p50s"]}
    others = [
        f"{k.split('|')[0]} `{k.split('|')[1]}` {said(c, k.split('|')[1])}"
        for k, c in cells.items()
        if not k.startswith(first)
    ]
    fewest = min(mine, key=lambda s: (mine[s]["slow"] / len(mine[s]["p50s"]), mine[s]["spread"]))
    return (
        f"{on(B1_MODES)} ({r['cpu_class']}), b1 x s128, {r['procs']} fresh processes per setting, the settings in "
        f"turn, each process the median of {r['calls']} forwards; {r['conditions']}. {first}: "
        + "; ".join(f"`{s}` {said(c, s)}" for s, c in mine.items())
        + (f". Beside it: {'; '.join(others)}" if others else "")
        + f". Fewest processes in the slow mode, then the narrowest spread: `{fewest}`. Every process of the "
        "two-thread settings by mode and by whether it got the CPU its two threads use while timed (starved: CPU "
        f"seconds per wall second below {r['starved_below'] * 2:g}; slow: above {r['slow_above']:g}x the variant's "
        "fastest process): "
        + ", ".join(f"{k.replace('_', ' and ')} {v}" for k, v in (r.get("starved_vs_slow") or {}).items())
        + "."
    )
