"""Training: the precision study (and the seed project's figures it is read against), the automatic precision's
probe in the main job, each precision's optimizer step, and what a resumable checkpoint costs.

    python -c "from benchmarks.render.blocks.training import precision_findings; print(precision_findings())"
"""

from __future__ import annotations

from typing import Any

from benchmarks.render.blocks.cells import num, pct, ratio, span, table
from benchmarks.render.blocks.reports import (
    MAIN_JOB,
    NOT_MEASURED,
    load,
    maybe,
    on,
    rendered_from,
    rendered_from_some,
    train_metrics,
)
from qserve.training.study import SEED, seed_table


def precision() -> str:
    """The precision study: one fine-tune per precision, plus a second seed for the noise."""
    rel = "precision/precision_study.json"
    r = load(rel)
    rows = []
    for run in r["runs"]:
        if not run.get("ok"):
            rows.append([run["label"], "failed"] + ["–"] * 6)
            continue
        rows.append(
            [
                run["label"],
                str(run.get("optimizer")),
                num(run.get("train_time_s") and run["train_time_s"] / 60, 1),
                num(run.get("step_time_median_s"), 3),
                num(run.get("step_interleaved_vs_bf16_mixed"), 2, "x"),
                num(run.get("optimizer_state_bytes") and run["optimizer_state_bytes"] / 1e6, 0),
                pct(run.get("val_accuracy")),
                pct(run.get("test_accuracy")),
            ]
        )
    head = [
        "run",
        "optimizer",
        "train time (min)",
        "median step (s)",
        "interleaved step vs bf16-mixed",
        "optimizer state (MB)",
        "val acc",
        "test acc",
    ]
    return table(head, rows, ["---", "---"] + ["---:"] * 6) + rendered_from(rel)


def checkpoint_cost() -> str:
    """What one resumable training checkpoint costs (benchmarks/studies/checkpoint_cost.py), per precision."""
    rel = "checkpoint_cost/checkpoint_cost.json"
    r = maybe(rel)
    head = ["precision", "checkpoint (MB)", "wall s / checkpoint", "CPU s / checkpoint", "share at ~300 s interval"]
    if r is None:
        return table(head, [[NOT_MEASURED] * 5]) + rendered_from_some([rel]).replace(
            "checkpoint_cost`)", "checkpoint-cost`)"
        )
    rows = [
        [
            x["precision"],
            num(x["bytes"] / 1e6, 0),
            num(x["wall_s_median"]),
            num(x["cpu_s_median"]),
            pct(x["share_at_default_interval"]),
        ]
        for x in r["runs"]
    ]
    return table(head, rows) + rendered_from(rel)


def seed_precision() -> str:
    """The seed project's precision study (not measured here): rendered from its one copy, qserve's SEED table."""
    return (
        f"{SEED['setup']}.\n\n" + seed_table() + "\n\n<sub>Rendered from `qserve/training/study.py` SEED (the seed "
        f"project's [published figures]({SEED['source']}), not measured by qserve) by "
        "`benchmarks/render/tables.py`.</sub>"
    )


def checkpoint_cost_text() -> str:
    """One resumable checkpoint's cost per precision, as a sentence (the table is checkpoint-cost)."""
    rel = "checkpoint_cost/checkpoint_cost.json"
    r = load(rel)
    runs = r["runs"]
    share = span([x["share_at_default_interval"] * 100 for x in runs])
    return (
        f"{on(rel)}: "
        + " / ".join(num(x["wall_s_median"]) for x in runs)
        + " s per resumable checkpoint ("
        + " / ".join(x["precision"] for x in runs)
        + f"), {share}% of training at the default ~5-minute interval "
        "(goal < 2%)."
    )


def _amx(rel: str) -> str:
    """`" (AMX)"` where a report's provenance says its CPU has AMX: what makes bf16 native on a Xeon."""
    return " (AMX)" if (load(rel).get("provenance") or {}).get("amx") else ""


def main_job_precision_probe() -> str:
    """docs/training.md: the line `--precision auto` printed in the main job, and the CPU probe's timings behind it."""
    rel = f"{MAIN_JOB}/report.json"
    c = train_metrics(MAIN_JOB)["precision_choice"]
    pr = c.get("probe") or {}
    return (
        f"In the main job (`make demo`'s pipeline, {on(rel)}) the choice read `precision: {c['precision']} "
        f"({c['reason']})`: the probe's "
        f"block ({pr.get('block')}, {pr.get('threads')} threads) took {num(pr['bf16_mixed_s'] * 1e3, 1)} ms "
        f"under bf16 autocast against {num(pr['fp32_s'] * 1e3, 1)} ms in fp32."
    )


def _study_runs(r: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {run["label"]: run for run in r["runs"] if run.get("ok")}


def precision_findings() -> str:
    """docs/training.md: the precision study's accuracy against its seed noise, and its step times three ways."""
    rel = "precision/precision_study.json"
    r = load(rel)
    cfg, runs, noise = r["config"], _study_runs(r), r["noise"]
    epochs = f"{cfg['epochs']} epoch" + ("" if cfg["epochs"] == 1 else "s")
    first = next(iter(runs.values()))
    mixed = runs[noise["label"]]
    seed2 = next(x for x in runs.values() if x is not mixed and x["precision"] == noise["label"])
    comp = next(x for x in runs.values() if x["precision"] == "bf16-true" and x["bf16_update"] == "compensated")
    plain = next(x for x in runs.values() if x["precision"] == "bf16-true" and x["bf16_update"] == "plain")
    gaps = ", ".join(
        f"{label} {g['test_accuracy_minus_bf16_mixed'] * 100:+.2f} points "
        f"({'beyond' if g['exceeds_noise'] else 'within'} the noise)"
        for label, g in r["gaps_to_bf16_mixed"].items()
    )
    return (
        f"{on(rel)}{_amx(rel)}, {cfg['max_samples']:,} reviews, {epochs}, "
        f"{first['sizes']['val']:,} val / {first['sizes']['test']:,} test, one process per run: test accuracy "
        + ", ".join(
            f"{x['label']} **{pct(x['test_accuracy'])}**"
            if x["precision"] == "bf16-true"
            else f"{x['label']} {pct(x['test_accuracy'])}"
            for x in runs.values()
            if x is not seed2
        )
        + f"; a second {noise['label']} seed read {pct(seed2['test_accuracy'])}, so run-to-run noise is "
        f"{noise['test_accuracy_abs_diff'] * 100:.2f} points. Against {noise['label']}: {gaps}. Step time in "
        f"{r['step_rounds']['rounds']} interleaved rounds after the full runs: {mixed['label']} "
        f"{ratio(mixed['step_interleaved_vs_32_true'])} of 32-true; {comp['label']} "
        f"**{ratio(comp['step_interleaved_vs_bf16_mixed'])}** of {mixed['label']} by median step, "
        f"{ratio(comp['step_round_ratio_median_vs_bf16_mixed'])} as the median of its per-round ratios ("
        + " / ".join(num(x) for x in comp["step_round_ratios_vs_bf16_mixed"])
        + f"); {plain['label']} {ratio(plain['step_interleaved_vs_bf16_mixed'])}. The sequential full runs, minutes "
        f"apart, read {comp['label']} at {ratio(comp['step_time_median_s'] / mixed['step_time_median_s'])} "
        f"{mixed['label']}'s median step, on a machine whose speed drifts between runs (the two {mixed['label']} "
        f"seeds: {num(mixed['step_time_median_s'], 3)} and {num(seed2['step_time_median_s'], 3)} s)."
    )


def optimizer_step() -> str:
    """docs/training.md: each precision's optimizer step alone (studies/optimizer_step.py), against fp32 AdamW."""
    rel = "precision/optimizer_step.json"
    r = load(rel)
    ms = {k: v["median"] for k, v in r["ms"].items()}

    def one(*words: str, foreach: bool = False) -> float:
        return next(v for k, v in ms.items() if all(w in k for w in words) and ("foreach" in k) == foreach)

    fp32, plain, kahan = one("fp32 weights"), one("bf16 weights, torch"), one("bf16 weights, optimi")
    return (
        f"{on(rel)}{_amx(rel)}, the {r['parameters']:,} parameters of the embedded model, {r['rounds']} "
        f"interleaved rounds, {r['threads']} threads: optimi's Kahan AdamW on bf16 weights {num(kahan, 1)} ms "
        f"({ratio(kahan / fp32)}), torch's AdamW on bf16 weights {num(plain, 1)} ms ({ratio(plain / fp32)}), against "
        f"{num(fp32, 1)} ms for torch's AdamW on fp32 weights; their foreach paths on bf16 weights "
        f"{num(one('bf16 weights, optimi', foreach=True), 1)} ms (optimi) and "
        f"{num(one('bf16 weights, torch', foreach=True), 1)} ms (torch)."
    )
