"""How the measurements are made and trusted: the `make reports` stages, why the bench scores 1,000 texts, and
qserve bench against plain onnxruntime / torch loops.

    python -c "from benchmarks.render.blocks.bench import stages; print(stages())"
"""

from __future__ import annotations

import statistics
from pathlib import Path

from benchmarks.bench_repeat import phases as bench_repeat_phases
from benchmarks.harness import ROOT
from benchmarks.render import rebuild
from benchmarks.render.blocks.cells import minutes, num, pct, span, table
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


BENCH_REPEATS = ("bench-repeat-zen4/report.json", "bench-repeat-zen1/report.json")


def bench_repeat() -> str:
    """docs/bench.md's consecutive `qserve bench` runs: each run's answer, each weighed variant's span, the phases."""
    said = []
    for rel in BENCH_REPEATS:
        r = load(rel)
        s, ok = r["summary"], [x for x in r["runs"] if x["ok"]]
        commit = (r.get("provenance") or {}).get("commit", "")[:7]
        answers = [f"{a[0]}" + (f" tied with {', '.join(a[1])}" if a[1] else "") for a in s["answers"]]
        ratios = [x["ratio_text"] for x in ok if x.get("ratio_text")]
        against = f", against {ok[0]['runner_up']} {', '.join(ratios)}" if ratios and ok[0].get("runner_up") else ""
        spans = "; ".join(
            f"{v} {span(sp['p50_ms'])} ms, {num(sp['span'], 3)}x"
            + (f" (the median over every round: {num(sp['median_span'], 3)}x)" if sp.get("median_span") else "")
            for v, sp in s["spans"].items()
        )
        ph = r.get("phases") or bench_repeat_phases(
            [ROOT / "benchmarks" / "reports" / Path(rel).parent / "runs" / str(i) for i in range(1, s["runs"] + 1)]
        )
        phases = (
            f" Over the {ph['rounds']} rounds every variant shared, {ph['same_side']} had all "
            f"{len(ph['variants'])} in the same mode ({num(ph['same_side_if_independent'], 1)} if each variant's mode "
            f"were its own; mean pairwise correlation of the rounds' b1 x s128 p50s {num(ph['mean_pair_correlation'])}"
            "); slow mode over fast: " + ", ".join(f"{n} {num(x)}x" for n, x in ph["mode_ratio"].items()) + "."
            if ph
            else ""
        )
        said.append(
            f"{on(rel)} (commit {commit}): {s['runs_ok']} of {s['runs']} runs over "
            f"{', '.join(Path(d).name for d in r['variant_dirs'])} (`{' '.join(r['bench_args'])}`), each "
            f"{span([x['wall_s'] for x in ok], 0)} s; recommended "
            + (
                f"{answers[0]} every run"
                if s["same_answer"]
                else f"{s['answers'][0][0]} every run, its tie set differing ({'; '.join(answers)})"
                if s.get("same_recommendation")
                else f"{len(answers)} answers: {'; '.join(answers)}"
            )
            + f"{against}. The ranked b1 p50 across the runs of the variants the repeat weighs (span max / min, bound "
            f"{s['max_span']}x): {spans}.{phases}"
        )
    return "\n\n".join(said)


def bench_time() -> str:
    """docs/bench.md's bench stage of the main job: its minutes, and the variants' steps summed (what it went to)."""
    rel = f"{MAIN_JOB}/report.json"
    r = load(rel)
    pipe = r.get("pipeline") or {}
    stage_s = pipe.get("stage_s") or {}
    steps: dict[str, float] = {}
    for v in r["variants"]:
        for k, x in (v.get("stage_s") or {}).items():
            steps[k] = steps.get(k, 0.0) + x
    rounds = r.get("rounds") or {}
    raced = sum(1 for v in r["variants"] if v.get("raced_out"))
    race = f", {raced} raced out after the first (measured there only)" if r.get("race") else ""
    return (
        f"{on(rel)}, `make demo`'s pipeline: the bench stage {minutes(stage_s['bench'])} min of "
        f"{minutes(stage_s['total'])} (train {minutes(stage_s['train'])}, export {minutes(stage_s['export'])}, gate "
        f"{minutes(stage_s['gate'])}) over {len(r['variants'])} variants, {rounds.get('asked')} rounds and "
        f"{rounds.get('extra')} extra for the unstable ones{race}. The variants' steps summed, in seconds: "
        + ", ".join(f"{k} {num(x, 0)}" for k, x in steps.items())
        + f" ({num(sum(steps.values()), 0)} s in all); the rest is the compute floor, the loads' waits and the "
        "recommended variant's policy pass."
    )
