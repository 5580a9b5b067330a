"""The main job and the pipeline runs per machine: the main job's verdict and summary table, every variant of the
others (size, latency, accuracy, agreement, batch invariance), the training, the stage times, what each recommends.

    python -c "from benchmarks.render.blocks.pipelines import main_job; print(main_job())"
"""

from __future__ import annotations

from typing import Any

from benchmarks.render.blocks.cells import minutes, num, pct, ratio, span, table
from benchmarks.render.blocks.reports import MAIN_JOB, RUN_DIR, cpu_of, load, on, rendered_from, train_metrics
from qserve.bench.recommend import ranked, recommend
from qserve.bench.report import summary_lines
from qserve.benchreport import fixed_shape


def _inv(inv: dict[str, Any] | None) -> str:
    if not inv:
        return "–"
    d = inv["max_abs_dprob"]
    return (f"{d:.1e} / {inv['flips']}" if d else f"0 / {inv['flips']}") + (
        " (row by row)" if inv.get("row_by_row") else ""
    )


def pipeline_rows(r: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of every variant of a pipeline report: size, b1/s128 p50 (as ranked: recommend.ranked), b32/s128
    seq/s, accuracy and agreement (on fewer texts, marked, for a variant under the eval cut of its day), batch
    invariance."""
    rec = (r.get("recommended") or {}).get("variant")
    n = r["config"].get("max_eval_samples")
    rows = []
    for v in r["variants"]:
        if v["status"] != "ok":
            rows.append([f"{v['name']} (failed)"] + ["–"] * 6)
            continue
        b1, b32 = fixed_shape(v, 1, 128), fixed_shape(v, 32, 128)
        name = f"**{v['name']}** (recommended)" if v["name"] == rec else v["name"]
        acc = v.get("accuracy") or {}
        # that pipeline scored a variant that could not be recommended on fewer texts (its eval cut): say how many
        few = f" ({acc['n']:,})" if acc.get("n") and n and acc["n"] < n else ""
        rows.append(
            [
                name,
                num(v["disk_bytes"] / 1e6, 1),
                num(b1 and ranked(b1)[0]),
                num(b32 and b32["throughput"], 1),
                pct(acc.get("accuracy"), 1) + few,
                pct(v.get("agreement"), 1) + few,
                _inv(v.get("invariance")),
            ]
        )
    head = [
        "variant",
        "size MB",
        "p50 b1/s128 ms",
        "b32/s128 seq/s",
        f"accuracy ({n:,})",
        f"agreement with fp32 ({n:,})",
        "max \\|Δprob\\| alone vs batched / flips",
    ]
    return head, rows


def embedded_default() -> str:
    """Every variant of the pipeline's checkpoint, the reference bench (AMX Xeon)."""
    rel = "embedded-default/report.json"
    head, rows = pipeline_rows(load(rel))
    return table(head, rows) + rendered_from(rel)


def main_job() -> str:
    """README's headline: the current main job's verdict and summary table, the report's own first screen, with the
    machine, its training and its stage times."""
    rel = f"{MAIN_JOB}/report.json"
    r = load(rel)
    r["recommended"] = recommend(r)  # every verdict by today's rule, on the report's own measurements
    prov, pipe = r.get("provenance") or {}, r.get("pipeline") or {}
    training, stage_s = pipe.get("training") or {}, pipe.get("stage_s") or {}
    choice = (training.get("precision_choice") or {}).get("reason")
    stages = ", ".join(f"{k} {minutes(v)}" for k, v in stage_s.items() if k != "total")
    lead = (
        f"`make demo`'s pipeline (`{prov.get('command')}`, commit `{str(prov.get('commit'))[:7]}`, "
        f"{r['created'][:10]}) on a {r['environment'].get('physical_cores', '?')}-core **{pipe.get('machine')}**: "
        f"trained in {training.get('precision')} ({choice}), {training.get('optimizer_steps')} steps, test "
        f"accuracy {pct(training.get('test_accuracy'))}; {minutes(stage_s['total'])} min ({stages} min), "
        f"{r['config'].get('threads')} threads, agreement on {r['config']['max_eval_samples']:,} test reviews. "
        f"What `qserve serve {RUN_DIR}` serves on that machine, and why:"
    )
    return lead + "\n\n" + "\n".join(summary_lines(r)).rstrip() + rendered_from(rel)


def embedded_default_amd() -> str:
    """The same pipeline on the AMD EPYC (another checkpoint), with agreement on all 2,000 test reviews."""
    pipe_rel, full_rel = "embedded-default-amd/report.json", "embedded-default-full-test/report.json"
    pipe, full = load(pipe_rel), load(full_rel)
    by_full = {v["name"]: v for v in full["variants"]}
    rows = []
    names = [v["name"] for v in pipe["variants"]] + [
        n for n in by_full if n not in {v["name"] for v in pipe["variants"]}
    ]
    by_pipe = {v["name"]: v for v in pipe["variants"]}
    for name in names:
        p, f = by_pipe.get(name) or {}, by_full.get(name) or {}
        b1 = fixed_shape(p, 1, 128) if p else None
        size = (p or f).get("disk_bytes")
        rows.append(
            [
                name if p else f"{name} (not in the pipeline on CPU)",
                num(size and size / 1e6, 1),
                num(b1 and ranked(b1)[0]),
                pct((p.get("accuracy") or {}).get("accuracy"), 1),
                pct(p.get("agreement"), 1),
                pct(f.get("agreement"), 2),
            ]
        )
    head = ["variant", "size MB", "p50 b1/s128 ms", "accuracy (1,000)", "agreement with fp32 (1,000)", "(2,000)"]
    return table(head, rows) + rendered_from(pipe_rel, full_rel)


# the pipeline runs, one per machine (report dir, what it is); README's headline is MAIN_JOB
PIPELINE_RUNS = (
    ("embedded-default", "`make demo`'s pipeline after issue 30"),
    ("embedded-default-amd", "`make demo`'s pipeline before issue 30, from a fresh clone"),
    ("pipeline-fast-amd", "`make demo`'s pipeline after issue 30"),
    ("pipeline-auto-zen4", "the main job after issues 46-49 (`auto`, transformers 5, the release gate)"),
    (MAIN_JOB, "the current main job (after issues 66-69: racing, the first screen, the sequential gate, repair)"),
)


def pipelines_by_cpu() -> str:
    """docs/measurements.md: each machine's own pipeline run: training, wall time by stage, what it recommends."""
    rows = []
    for d, what in PIPELINE_RUNS:
        r, t = load(f"{d}/report.json"), train_metrics(d)
        stage_s = (r.get("pipeline") or {}).get("stage_s") or {}
        stages = (
            (
                f"{minutes(stage_s['total'])} min ("
                + ", ".join(f"{k} {minutes(v)}" for k, v in stage_s.items() if k != "total")
                + ")"
            )
            if stage_s
            else "not recorded"
        )
        rec = (r.get("recommended") or {}).get("variant") or "not recorded (before the recommendation)"
        rows.append(
            [
                f"`{d}/`",
                what,
                cpu_of(f"{d}/report.json"),
                r["created"][:10],
                f"{t['precision']}, {t['optimizer_steps']} steps, {num(t['train_time_s'], 0)} s, test "
                f"{pct(t['test_accuracy'])}",
                stages,
                rec,
            ]
        )
    head = ["report (benchmarks/reports/)", "run", "CPU", "date", "training", "pipeline wall time", "recommended"]
    return table(head, rows, ["---"] * 7) + rendered_from(*[f"{d}/report.json" for d, _ in PIPELINE_RUNS])


def embedded_default_amd_run() -> str:
    """The AMD pipeline's training and the torch-fp16 row the table marks as outside the pipeline."""
    t = train_metrics("embedded-default-amd")
    full = {v["name"]: v for v in load("embedded-default-full-test/report.json")["variants"]}
    fp16 = fixed_shape(full.get("torch-fp16") or {}, 1, 128)
    return (
        f"{on('embedded-default-amd/report.json')}: training ({t['precision']}, {t['sizes']['train']:,} reviews, "
        f"{t['optimizer_steps']} steps) took {num(t['train_time_s'], 0)} s and read {pct(t['test_accuracy'])} "
        f"test accuracy on {t['sizes']['test']:,} held-out reviews. torch-fp16 (not in `--all` on a CPU) ran "
        f"b1/s128 at {num(fp16 and fp16['p50'])} ms in {on('embedded-default-full-test/report.json')}."
    )


def embedded_default_run() -> str:
    """The AMX Xeon's pipeline: its training and stage times, then what it recommends and why, in ratios."""
    rel = "embedded-default/report.json"
    r, t = load(rel), train_metrics("embedded-default")
    st = r["pipeline"]["stage_s"]
    cfg = r["config"]
    return (
        f"{on(rel)}, {r['created'][:10]}: training {t['precision']}, {t['sizes']['train']:,} reviews, test "
        f"accuracy {pct(t['test_accuracy'])}; {minutes(st['total'])} min wall ("
        + ", ".join(f"{k} {minutes(v)}" for k, v in st.items() if k != "total")
        + f" min); b1/s128 and b32/s128, "
        f"{cfg.get('threads')} threads; accuracy and agreement on the first {cfg['max_eval_samples']:,} test "
        f"reviews, or on the first {cfg.get('slow_eval_samples')}, marked, for a variant slower on real text than "
        f"one already meeting its bar, which cannot be recommended; batch invariance on "
        f"{cfg.get('invariance_samples')} reviews alone vs shuffled batches of 8 and 32."
    )


def embedded_default_choice() -> str:
    """Why the Xeon's report recommends what it does: its p50 and throughput against the runners-up, same run."""
    rel = "embedded-default/report.json"
    r = load(rel)
    rec = r["recommended"]
    by = {v["name"]: v for v in r["variants"] if v["status"] == "ok"}
    me = by[rec["variant"]]
    b1, b32 = fixed_shape(me, 1, 128), fixed_shape(me, 32, 128)

    def vs(name: str) -> str:
        o = by.get(name)
        ob1, ob32 = fixed_shape(o or {}, 1, 128), fixed_shape(o or {}, 32, 128)
        if not (o and ob1 and ob32 and b1 and b32):
            return ""
        return (
            f"{ratio(b1['p50'] / ob1['p50'])} {name}'s b1/s128 p50 and {ratio(b32['throughput'] / ob32['throughput'])} "
            f"its b32 throughput"
        )

    others = [x for x in ("onnx-int8", "ov-bf16") if x in by and x != rec["variant"]]
    checks = [v["real_text_check"]["ratio"] for v in by.values() if (v.get("real_text_check") or {}).get("ratio")]
    bound = next(v["real_text_check"]["bound"] for v in by.values() if v.get("real_text_check"))
    return (
        f"On this Xeon ({on(rel)}) the report recommends **{rec['variant']}** (fastest at b1 on real text among "
        f"the variants meeting their bar, {num(rec['p50_ms'])} ms), served under "
        f"{(r.get('long_text') or {}).get('fast', {}).get('policy')}: "
        + "; ".join(vs(o) for o in others)
        + f", in the same run. Every variant's real-text b1 path is within {span(checks)}x of the fixed-shape "
        f"forward plus the text's tokenization (the report's real-text check; bound {bound:g}x)."
    )


def pipeline_fast_amd() -> str:
    """`make demo` after issue 30 on the AMD EPYC: wall time by stage, what it recommends and serves."""
    rel = "pipeline-fast-amd/report.json"
    r = load(rel)
    st = r["pipeline"]["stage_s"]
    lt = r.get("long_text") or {}
    return (
        f"{on(rel)}, {r['created'][:10]}: **{minutes(st['total'])} min** wall ("
        + ", ".join(f"{k} {minutes(v)}" for k, v in st.items() if k != "total")
        + f" min). Recommended **{r['recommended']['variant']}**, served policy "
        f"**{(lt.get('fast') or {}).get('policy')}** ({lt.get('why')})."
    )
