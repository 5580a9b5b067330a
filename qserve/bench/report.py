"""Render a benchmark report: report.json (everything), report.csv, report.md, report.html, PNG charts.

    qserve report benchmarks/reports/minilm-l6-distilbert-cpu-t2      # re-render md/csv/html/png from report.json

A pure function of report.json (no clock, no machine queries): `qserve report` reproduces the md byte for byte.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from qserve.bench.html import render_html
from qserve.bench.invariance import cell as invariance_cell
from qserve.bench.mdtable import blocks, cell, md_table, pct
from qserve.bench.pipelinerecord import md_lines as pipeline_md_lines
from qserve.bench.plots import write_plots
from qserve.bench.policies import md_lines as long_text_lines
from qserve.bench.rounds import ci_cell
from qserve.benchreport import Row, fixed_shape, peak_memory, recommendation, shown, summary_rows
from qserve.devices import cpu_label
from qserve.files import write_json_atomic, write_text_atomic
from qserve.provenance import md_line, with_header
from qserve.variants import REFERENCES

FILES = ("report.json", "report.csv", "report.md", "report.html")
FLOOR_OFF = "floor measurement disabled (--no-floor)"
DECISION_PNG = "![which variant is fast and faithful: latency and throughput against agreement](decision.png)"


def _floor_lines(report: dict[str, Any]) -> list[str]:
    b, s = report["headline"]["batch"], report["headline"]["seq"]
    floor = report.get("floor") or {}
    fl = (floor.get("flops_per_sequence") or {}).get(str(s))
    if not fl:
        return blocks("## Compute floor", f"Not stated: {floor.get('error', 'no FLOP count')}.")
    intro = (
        f"One sequence of {s} tokens costs **{fl['total'] / 1e9:.3f} GFLOP** "
        f"(linear layers {fl['linear'] / 1e9:.3f} = 2 × {fl['params_linear'] / 1e6:.2f}M params × {s}; "
        f"attention {fl['attention'] / 1e9:.3f} = 2·2·S²·d per layer; head {fl['head'] / 1e6:.2f} MFLOP; "
        "embeddings excluded). Peak GEMM rates measured on this machine at "
        f"{floor.get('threads', report['config'].get('threads'))} threads (best-of-N timing; the model's own GEMM "
        f"shapes at {b * s} rows, then larger saturating shapes):"
    )
    peaks, mpeaks = floor.get("peaks") or {}, floor.get("model_peaks") or {}
    if not peaks:
        return blocks("## Compute floor", intro, f"Peak not measured: {floor.get('error', FLOOR_OFF)}.")
    rows = [
        [name, kind, f"{p['gflops']:,.1f}", p["method"], "×".join(map(str, p["shape"]))]
        + [f"{fl['total'] * b / (p['gflops'] * 1e9) * 1e3:.2f}"]
        for name in ("fp32", "bf16", "fp16", "int8")
        for kind, table in (("machine peak", peaks), (f"at the model's shapes (M={b * s})", mpeaks))
        if (p := table.get(name)) is not None
    ]
    cols = (("floor_ms", ""), ("p50_over_floor", "×"), ("model_floor_ms", ""), ("model_p50_over_floor", "×"))
    vrows = [
        [shown(v, report), f.get("peak") or "–"] + [cell(f.get(k), 2, x) for k, x in cols]
        for v in report["variants"]
        if v["status"] == "ok" and (f := v.get("floor"))
    ]
    head = "variant|compute|floor, machine peak (ms)|p50/floor|floor, model shapes (ms)|p50/model-shape floor"
    return blocks(
        "## Compute floor",
        intro,
        md_table(
            ["compute", "rate", "GFLOP/s (GOP/s for int8)", "measured with", "M×K×N", f"floor b{b}/s{s} (ms)"],
            rows,
            ["---", "---", "---:", "---", "---", "---:"],
        ),
        "Each variant is held to the peak of its compute type (fp32 → fp32, bf16 → bf16, int8 → int8; "
        "4-bit and other low-bit formats → the fastest peak measured). The summary table's floor uses the "
        "machine peak (the hardest bound); the model-shape floor is what the fastest measured kernel reaches "
        "on this workload's own matrices. p50/floor = 1.0 would mean every FLOP ran at that rate.",
        *([md_table(head.split("|"), vrows)] if vrows else []),
    )


def verdict_line(report: dict[str, Any]) -> str:
    """The report's first line after its title: the recommendation in one sentence (recommend.recommend's `why`)."""
    rec = recommendation(report)
    if not rec.variant:
        return f"**No variant to serve:** {rec.why}." if rec.why else ""
    head = f"Serve {rec.variant}:"
    return f"**{head}** {(rec.why or '').removeprefix(head).strip()}"


def summary_lines(report: dict[str, Any]) -> list[str]:
    """The first screen: the verdict, then one row per variant with one number per cell and its verdict, and why
    each verdict below it."""
    rows = summary_rows(report)
    b, s = report["headline"]["batch"], report["headline"]["seq"]
    real = str(recommendation(report).shape).startswith("b1 on real")
    head = [
        "variant",
        "b1 on real texts, p50 (ms)" if real else f"b{b}/s{s} p50 (ms)",
        f"b{max(report['config']['batch_sizes'])}/s{s} (seq/s)",
        f"{peak_memory(next(iter(report['variants']), {}))[1]} (MiB)",
        "size (MB)",
        f"agreement vs {report.get('agreement_reference') or 'fp32'}"
        + (f" ({report['agreement_metric']})" if report.get("agreement_metric") else ""),
        "its lower bound",
        "verdict",
    ]
    body = [
        [r.shown, cell(r.b1_ms, 2), cell(r.throughput, 1), cell(r.peak_mem_mib, 0), cell(r.size_mb, 1)]
        + [pct(r.agreement), pct(r.agreement_lo), r.verdict]
        for r in rows
    ]
    return blocks(verdict_line(report), md_table(head, body, ["---"] + ["---:"] * 6 + ["---"])) + _notes(report, rows)


def _notes(report: dict[str, Any], rows: list[Row]) -> list[str]:
    """Why each verdict, one line per kind (a reason shared by all of a kind said once); what the cells are."""
    race, shape = report.get("race") or {}, recommendation(report).shape or "the headline shape"
    by: dict[str, list[tuple[str, str]]] = {}
    for r in rows:
        if r.why:
            by.setdefault(r.verdict, []).append((r.shown, r.why))
    lines = []
    for kind, items in by.items():
        whys = {w for _, w in items}
        shared = len(whys) == 1 and kind != "raced out"
        lead = f" ({whys.pop()})" if shared else ""
        if kind == "raced out":
            lead = f" (in the screen round, over {race.get('factor', 0):g}x the fastest candidate {race.get('best')})"
        each = ", ".join(n for n, _ in items) if shared else "; ".join(f"{n} ({w})" for n, w in items)
        lines.append(f"- **{kind}**{lead}: {each}.")
    once = "; a raced-out variant's, its one round" if "raced out" in by else ""
    return lines + [
        f"- Latency: what the recommendation ranks by ({shape}; the fast mode's "
        f"median where a variant's rounds fell in two){once}. Lower bound: the release gate's (95%) where it ran, "
        "else Wilson's over the bench's texts. The report's details hold the proof.",
        "",
    ]


def render_md(report: dict[str, Any]) -> str:
    cfg, env, rows = report["config"], report["environment"], summary_rows(report)
    cpu = cpu_label(env["cpu"]) if env.get("cpu") else None
    dev = env.get("gpu") if str(cfg["device"]).startswith("cuda") else cpu
    rec, agreed = recommendation(report).variant, any(r.agreement is not None for r in rows if r.status == "ok")
    name = (report.get("model") or {}).get("name") or "variants"
    L = blocks(f"# Benchmark: {name} on {cfg['device']}, threads={cfg['threads']}")
    L += summary_lines(report) + blocks(
        f"Run `{report['run']['name']}`, created {report['created']}, {dev}. "
        + (f"`qserve serve MODEL_DIR` serves {rec} by default. " if rec else "")
        + md_line(report.get("provenance")),
        *([DECISION_PNG] if agreed else []),
        "## Details: how it was measured and chosen",
        f"Latency: fixed-shape batches of real token ids (full attention mask), after warm-up, "
        f"≤{cfg['time_budget_s']:g} s or ≤{cfg['max_iters']} calls per shape (≥{cfg['min_iters']}). "
        + _isolation(report),
        *_suite(report.get("suite") or {}),
    )
    sections = (rounds_lines, _every_variant, _checks, _floor_lines, _execution_lines, _grid, _real_text)
    for section in sections + (long_text_lines, _invariance, _bench_time_lines, _failures, pipeline_md_lines, _env):
        L += section(report)
    L += blocks("## Plots", "![latency vs batch size](latency_vs_batch.png)")
    if any(r.accuracy is not None for r in rows):
        L += blocks("![accuracy vs size](accuracy_vs_size.png)")
    return with_header("\n".join(L).rstrip() + "\n", report.get("provenance"))


def _suite(suite: dict[str, Any]) -> list[str]:
    """The suite that ran this bench (benchmarks/), if one did, and the variants it could not export."""
    if not suite:
        return []
    fails = suite.get("export_failures") or {}
    return [
        f"Suite `{suite.get('script')}`"
        + (": **random weights, speed only** (accuracy is meaningless here)" if suite.get("random_weights") else "")
        + (". Export failed for " + "; ".join(f"{k} ({v})" for k, v in sorted(fails.items())) if fails else "")
        + "."
    ]


def _every_variant(report: dict[str, Any]) -> list[str]:
    """What the summary leaves out, per variant: load time, accuracy, the texts scored, speed-up, batch invariance."""
    b, s = report["headline"]["batch"], report["headline"]["seq"]
    rows = [
        [r.shown, cell(r.load_s, 2), pct(r.accuracy), cell(r.eval_n), cell(r.speedup, 2, "×")]
        + [invariance_cell(v.get("invariance"))]
        for v, r in zip(report["variants"], summary_rows(report))
        if r.status == "ok"
    ]
    head = ["variant", "load (s)", "accuracy", "texts scored", f"speed-up vs {REFERENCES[0]} b{b}/s{s}"]
    notes = []
    if report.get("speedup_reference") is None:
        notes.append(f"no {REFERENCES[0]} result at b{b}/s{s} in this run, so no speed-up")
    moved = [v for v in report["variants"] if shown(v, report) != v["name"]]
    if moved:  # a CUDA run's CPU variants (qserve.placement): every table marks them
        notes.append(
            "measured on another device than the run's, marked so in every table: "
            + "; ".join(f"{shown(v, report)}" + (f" ({v['placement']})" if v.get("placement") else "") for v in moved)
            + "; their floor is not stated (the floor's peaks are the run device's)"
        )
    own = {v["name"]: v.get("long_text") for v in report["variants"] if v.get("long_text")}
    if any(p != "head" for p in own.values()):  # accuracy above is under each variant's own policy
        notes.append("long-text policy per variant: " + ", ".join(f"{k} {p}" for k, p in own.items()))
    return blocks(
        "## Every variant",
        md_table(head + ["batch invariance: max \\|Δprob\\| / label flips"], rows),
        *(["Notes: " + "; ".join(notes) + "."] if notes else []),
    )


def _isolation(report: dict[str, Any]) -> str:
    """How the variants were kept apart (bench --isolation): each in its own process, or some in one worker."""
    together = [shown(v, report) for v in report["variants"] if v.get("isolation") == "shared"]
    if not together:
        return "Each variant ran in its own process, loaded through `load_runtime`, as served."
    alone = len(report["variants"]) - len(together)
    return (
        f"{', '.join(together)} ran one after another in one worker process (`--isolation`: imports and CUDA's "
        "start-up paid once; CUDA's peak memory counters and the peak RSS reset before each, the previous "
        "variant freed after it, so their peak RSS also holds what the libraries and earlier variants left "
        "resident)"
        + (f"; the other {alone} each in its own process" if alone else "")
        + ", every one loaded through `load_runtime`, as served."
    )


def _checks(report: dict[str, Any]) -> list[str]:
    """Targets a suite asked this run to meet (e.g. benchmarks/studies/distilbert_base_speed.py), if any."""
    checks = report.get("checks") or []
    if not checks:
        return []

    def result(c: dict[str, Any]) -> str:
        if c.get("passed") is not None:
            return "**pass**" if c["passed"] else "**FAIL**"
        # A row with no target (context only) has nothing to pass; only a missing value is "not measured".
        return "not measured" if c.get("value") is None else "–"

    rows = [[c["name"], cell(c.get("value"), 2, c.get("unit", "")), c.get("target", ""), result(c)] for c in checks]
    return blocks("## Checks", md_table(["check", "measured", "target", "result"], rows, ["---", "---:", "---", "---"]))


def _execution_lines(report: dict[str, Any]) -> list[str]:
    """On CUDA: each torch variant eager and as it runs (CUDA graphs or torch.compile), side by side on the same
    fixed shapes, and why it runs so (its `execution` record: torch_rt.py). Nothing for a CPU run."""
    cfg = report["config"]
    b, s = report["headline"]["batch"], report["headline"]["seq"]
    bmax = max(cfg["batch_sizes"])
    rows, why = [], []
    for v in report["variants"]:
        ex = v.get("execution")
        if v["status"] != "ok" or not ex:
            continue
        why.append(f"- {v['name']}: **{ex.get('mode')}** ({ex.get('why')})")
        pairs = [("eager", v.get("fixed_eager"))] if v.get("fixed_eager") else []
        pairs.append((str(ex.get("mode")), v.get("fixed")))
        eager_p50 = eager_tp = None
        for mode, recs in pairs:
            st = fixed_shape({"fixed": recs}, b, s)
            big = fixed_shape({"fixed": recs}, bmax, s)
            p50, tp = (st or {}).get("p50"), (big or {}).get("throughput")
            if mode == "eager":
                eager_p50, eager_tp = p50, tp
            gain = [
                cell(eager_p50 / p50 if mode != "eager" and eager_p50 and p50 else None, 2, "×"),
                cell(tp / eager_tp if mode != "eager" and eager_tp and tp else None, 2, "×"),
            ]
            rows.append([f"{v['name']} ({mode})", cell(p50, 3), cell((st or {}).get("p99"), 3), cell(tp, 1), *gain])
    head = ["variant (execution)", f"p50 b{b}/s{s} (ms)", f"p99 b{b}/s{s} (ms)", f"throughput b{bmax}/s{s} (seq/s)"]
    return (
        blocks(
            "## Eager and CUDA graphs (torch variants on CUDA)",
            "The same fixed shapes, eager and as the variant runs (`--cuda-graphs`, default auto: graphs captured "
            "at load per (batch, length) bucket, kept where a short measurement at load finds them faster).",
            md_table(head + ["p50 speed-up", "throughput gain"], rows),
            why,
        )
        if rows
        else []
    )


def rounds_lines(report: dict[str, Any]) -> list[str]:
    """How the latencies were measured (interleaved rounds, the race), the interval each carries, the ranking rule
    and the recommended variant against the runner-up (docs/bench.md, "Rounds" and "Racing")."""
    r = report.get("rounds")
    if not r:
        return []
    rec, race = recommendation(report), report.get("race") or {}
    raced = [v["name"] for v in report["variants"] if v.get("raced_out")]
    lines = [
        "Latencies: every variant loaded once in its own process, then measured in interleaved rounds (A B C ... "
        "A B C ..., one measuring while the others idle)"
        + (
            f"; racing: the first round screened every variant, and those within {race['factor']:g}x of the fastest "
            f"candidate's b1 there ({race['best']}), with the {race['keep']} fastest candidates and the reference, "
            f"ran all {r['asked']} rounds and the full evaluation (accuracy and agreement on every text, batch "
            f"invariance); {len(raced)} were raced out ({', '.join(raced) or 'none'}): measured in that round only, "
            "they decide nothing"
            if race.get("best") and race.get("factor")
            else f": {r['asked']} of them"
        )
        + (f"; {r['extra']} extra round(s) for contenders whose rounds disagreed" if r.get("extra") else "")
        + "; each p50 is the median of the rounds' p50s, in brackets the order-statistic interval of that median "
        f"(about 95%, its coverage in report.json); a number marked unstable has an interval wider than "
        f"{r['stability']:.0%} of it after the extra rounds. The recommendation: the lowest p50 at "
        f"{rec.shape or 'the headline shape'} (the fast mode's median where a variant's rounds fell in two) "
        f"among the variants whose agreement with {report.get('agreement_reference') or 'fp32'} meets the bar for "
        "their bits (int8 >= 99%, 4-bit >= 97%, 16/32-bit >= 99%) and, once a release gate ran, that passed it or "
        "are the reference; the runner-up is the next of them, the reference only when no other qualifies."
    ]
    if (q := rec.ratio) is not None:
        lines[0] += (
            f" {rec.variant} against the runner-up {rec.runner_up}: {rec.ratio_text} "
            f"(the runner-up's latency over the recommended's, {'paired round by round' if q.paired else 'unpaired'}"
            f" over {q.rounds} rounds, {q.level:.0%} interval)"
            + (f", a tie (the interval holds 1), broken by {rec.tie_break}." if rec.tied else ", a difference.")
        )
    return lines + [""]


def _grid(report: dict[str, Any]) -> list[str]:
    cfg = report["config"]
    shapes = [(b, s) for s in cfg["seq_lens"] for b in cfg["batch_sizes"]]
    rows = []
    for v in report["variants"]:
        if v["status"] != "ok":
            continue
        cells = []
        for b, s in shapes:
            st = fixed_shape(v, b, s)
            cells.append(f"{ci_cell(st)} / {st['p99']:.2f}" if st else "error")
        rows.append([shown(v, report)] + cells)
    if not rows:
        return []
    return blocks(
        "## Latency grid (p50 [interval over rounds] / p99 ms)",
        md_table(["variant"] + [f"b{b}/s{s}" for b, s in shapes], rows),
        "Full statistics (count, mean, p90, p95, stdev, throughput) per shape are in report.json and report.csv.",
    )


def _real_text(report: dict[str, Any]) -> list[str]:
    rows = []
    for v in report["variants"]:
        for rt in v.get("real_text") or []:
            stats = [cell(rt.get("p99"), 2), cell(rt.get("throughput"), 1), cell(rt.get("mean_padded_len"), 1)]
            rows.append([shown(v, report), str(rt["batch"]), ci_cell(rt), *stats, str(rt.get("count"))])
    if not rows:
        return []
    ds: dict[str, Any] = next((v["data"] for v in report["variants"] if v.get("data")), {}) or {}
    head = "variant|batch|p50 (ms) [interval over rounds]|p99 (ms)|texts/s|mean padded length|calls"
    return blocks(
        f"## Real text ({ds.get('dataset')} test split, predict() with tokenization and dynamic padding)",
        md_table(head.split("|"), rows),
    ) + _real_text_check(report)


def _real_text_check(report: dict[str, Any]) -> list[str]:
    """The real-text b1 path against the fixed b1 forward + the text's tokenization, timed in turn (realtext.py)."""
    checks = [(shown(v, report), v["real_text_check"]) for v in report["variants"] if v.get("real_text_check")]
    if not checks:
        return []
    c0 = checks[0][1]
    rows = [
        [name]
        + [cell(c[k], 2) for k in ("real_p50", "fixed_p50", "tokenize_p50")]
        + [f"{c['ratio']:.2f}x " + ("✓" if c["within"] else "✗")]
        for name, c in checks
    ]
    head = ["variant", "real-text b1 p50 (ms)", f"fixed b1/s{c0['seq']} p50 (ms)", "tokenize p50 (ms)"]
    return blocks(
        f"What the real-text path costs beyond the model and the tokenizer: predict([text]) against the fixed "
        f"b1/s{c0['seq']} forward plus that text's own tokenization, timed in turn call by call "
        f"({c0['pairs']} each), so both see the same machine; the bound is {c0['bound']}x.",
        md_table(head + ["real / (fixed + tokenize)"], rows),
    )


def _invariance(report: dict[str, Any]) -> list[str]:
    rows: list[list[str]] = []
    checked = [v["invariance"] for v in report["variants"] if v["status"] == "ok" and v.get("invariance")]
    info: dict[str, Any] | None = max(checked, key=lambda inv: inv.get("texts") or 0, default=None)
    for v in report["variants"]:
        inv = v.get("invariance")
        if v["status"] != "ok" or not inv or info is None:
            continue
        by = inv.get("by_batch") or {}
        raw = inv.get("batched_graph")
        rows.append(
            [shown(v, report), "row by row" if inv.get("row_by_row") else "batched"]
            + [f"{by[k]['max_abs_dprob']:.2g} / {by[k]['flips']}" if k in by else "–" for k in ("8", "32")]
            + [f"{raw['max_abs_dprob']:.3g} / {raw['flips']} of {raw['scored']}" if raw else "–"]
        )
    if not rows or info is None:  # rows are only added with an info
        return []
    tl = info.get("token_lengths") or {}
    return blocks(
        "## Batch invariance (one text, one answer)",
        f"{info['texts']} test reviews of varied length (every other one cut to its opening words; {tl.get('min')} "
        f"to {tl.get('max')} tokens, median "
        f"{tl.get('median')}) scored alone with predict([text]), then in shuffled mixed batches of 8 and of 32 "
        "(short reviews padded next to long ones), through the same predict() the server calls: the largest "
        "|Δprobability| and the label flips against the text alone. A variant whose kernels let rows see each "
        "other is run row by row by the runtime; the last column shows what one batched forward of its graph "
        "would answer.",
        md_table(["variant", "runs a batch", "batches of 8", "batches of 32", "if run batched"], rows),
    )


BENCH_STEPS = ("import", "load", "fixed", "real_text", "accuracy", "long_text", "invariance")


def _bench_time_lines(report: dict[str, Any]) -> list[str]:
    """Where the bench stage's time went: each variant's first-pass child, by step (measure.py's stage_s)."""
    timed = [v for v in report["variants"] if v.get("stage_s")]
    if not timed:
        return []
    rows = [
        [shown(v, report), cell(v.get("wall_s"), 1)]
        + [cell(v["stage_s"].get(k), 1) if k in v["stage_s"] else "–" for k in BENCH_STEPS]
        for v in timed
    ]
    return blocks(
        "## Where the bench's time went",
        "Each variant's child, wall seconds by step (`long_text`: the "
        "reference's policy comparison; the recommended variant's policy pass is a second child, not shown).",
        md_table(["variant", "child", *BENCH_STEPS], rows),
    )


def _failures(report: dict[str, Any]) -> list[str]:
    bad = [
        f"- **{shown(v, report)}** ({v['dir']}): {v.get('failure') or 'failed'} in stage `{v.get('stage')}`: "
        f"{(v.get('error') or '').splitlines()[0] if v.get('error') else ''}"
        for v in report["variants"]
        if v["status"] != "ok"
    ]
    return blocks("## Failures", bad) if bad else []


def _env(report: dict[str, Any]) -> list[str]:
    env, cfg = report["environment"], report["config"]
    cpu = env.get("cpu") or {}
    child = env.get("child") or {}
    vers = ", ".join(f"{k} {v}" for k, v in sorted((env.get("versions") or {}).items()))
    return [
        "## Environment",
        "",
        f"- CPU: {cpu.get('model')} ({cpu.get('cores')} logical, {env.get('physical_cores')} physical cores); "
        f"flags: {', '.join(cpu.get('flags') or []) or 'none of interest'}",
        f"- GPU: {env.get('gpu') or 'none'}; device: {cfg['device']}",
        f"- threads: {cfg['threads']} (torch sees {child.get('torch_threads', '–')}, "
        f"OMP_NUM_THREADS={child.get('OMP_NUM_THREADS', '–')}; ONNX Runtime intra-op = {cfg['threads']})",
        f"- load average (1/5/15 min): {_la(env.get('load_avg_start'))} at start, {_la(env.get('load_avg_end'))} "
        f"at end (with {cpu.get('cores')} logical CPUs; a busy machine inflates p50/p99, the per-shape `min` "
        "in report.json is the least disturbed call)",
        f"- Python {env.get('python')} on {env.get('platform')}",
        f"- {vers}",
        "",
    ]


def _la(x: Any) -> str:
    return "/".join(f"{v:.2f}" for v in x) if x else "–"


CSV_FIELDS = (
    "variant device status verdict kind batch seq count mean_ms p50_ms p50_ci_lo_ms p50_ci_hi_ms rounds stable p90_ms "
    "p95_ms p99_ms stdev_ms min_ms throughput size_mb load_s peak_mem_mib accuracy agreement agreement_lo "
    "speedup_vs_torch_fp32 floor_ms p50_over_floor invariance_max_abs_dprob invariance_flips error"
).split()
SUMMARY_CSV = (  # the summary row's fields the csv repeats by name
    "verdict size_mb load_s peak_mem_mib accuracy agreement agreement_lo floor_ms p50_over_floor "
    "invariance_max_abs_dprob invariance_flips"
).split()


def render_csv(report: dict[str, Any]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
    w.writeheader()
    for v, r in zip(report["variants"], summary_rows(report)):
        base = {"variant": v["name"], "device": v.get("device"), "status": v["status"]}
        base.update({k: getattr(r, k) for k in SUMMARY_CSV}, speedup_vs_torch_fp32=r.speedup)
        if v["status"] != "ok":
            w.writerow({**base, "kind": "failed", "error": v.get("error")})
            continue
        for kind in ("fixed", "real_text", "fixed_eager"):  # fixed_eager: CUDA only (a torch variant run eager)
            for rec in v.get(kind) or []:
                row = {**base, "kind": kind, "seq": rec.get("seq", "")}
                row.update({k: rec.get(k) for k in ("batch", "count", "throughput", "error", "rounds", "stable")})
                row.update({f"{k}_ms": rec.get(k) for k in ("mean", "p50", "p90", "p95", "p99", "stdev", "min")})
                ci = rec.get("p50_ci") or [None, None]
                row.update({"p50_ci_lo_ms": ci[0], "p50_ci_hi_ms": ci[1]})
                w.writerow(row)
    return buf.getvalue()


def write_reports(report: dict[str, Any], out: str | Path, write_json: bool = True) -> list[Path]:
    """Write report.json (unless re-rendering), report.csv, report.md and the plots into `out`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if write_json:
        write_json_atomic(out / "report.json", report)
    write_text_atomic(out / "report.csv", render_csv(report))
    md = render_md(report)
    write_text_atomic(out / "report.md", md)
    charts = write_plots(report, out)
    write_text_atomic(out / "report.html", render_html(report, md, {p.name: p.read_bytes() for p in charts}))
    return [out / f for f in FILES] + charts
