"""Render the README's and docs' measured tables from the committed reports' JSON.

    python -m benchmarks.render_tables            # rewrite every table between its markers
    python -m benchmarks.render_tables --check    # exit 1 and print a diff when a table disagrees with its JSON

A table lives in a markdown file between `<!-- table:NAME -->` and `<!-- /table -->`, a passage of prose
that quotes measurements between `<!-- text:NAME -->` and `<!-- /text -->`; NAME is a key of TABLES below, and
the same block may appear in several files. Only the lines between the markers are written, so the prose
around a block stays hand-written; measured numbers are never copied by hand (tests/unit/test_docs.py also
flags a measured-looking number typed in prose, see hand_numbers() and tests/unit/docs_numbers.txt). `make
reports` runs this after every stage; tests/unit/test_docs.py runs it with --check.

    python -m benchmarks.render_tables --hand-numbers   # the measured-looking numbers typed in prose, per file
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from pathlib import Path
from typing import Any, Callable

from benchmarks import rebuild_reports
from qserve.provenance import recorded_cpu
from benchmarks.harness import ROOT

REPORTS = ROOT / "benchmarks" / "reports"
MARKER = re.compile(r"^<!-- (?P<kind>table|text):(?P<name>[a-z0-9-]+) -->\n(?P<body>.*?)^<!-- /(?P=kind) -->$",
                    re.M | re.S)
MAIN_JOB = "pipeline-auto-zen4"
"""The current main job's report (`make demo`'s pipeline, `make reports STAGE=pipeline-auto-zen4`): README's
headline."""
RUN_DIR = "models/minilm-l6-distilbert-imdb"


def _load(rel: str) -> dict[str, Any]:
    return json.loads((REPORTS / rel).read_text(encoding="utf-8"))


def _table(header: list[str], rows: list[list[str]], align: list[str] | None = None) -> str:
    align = align or ["---"] + ["---:"] * (len(header) - 1)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def _num(x: float | None, nd: int = 2, suffix: str = "") -> str:
    return "–" if x is None else f"{x:,.{nd}f}{suffix}"


def _pct(x: float | None, nd: int = 2) -> str:
    return "–" if x is None else f"{x * 100:.{nd}f}%"


def _src(*rels: str) -> str:
    """The line under a table naming the JSON it came from and the CPU that measured it."""
    parts = [f"`benchmarks/reports/{r}` ({recorded_cpu(_load(r)) or 'CPU not recorded'})" for r in rels]
    return "\n\n<sub>Rendered from " + ", ".join(parts) + " by `benchmarks/render_tables.py`.</sub>"


def _shape(v: dict[str, Any], b: int, s: int) -> dict[str, Any] | None:
    return next((r for r in v.get("fixed") or [] if r.get("batch") == b and r.get("seq") == s and "p50" in r), None)


def _inv(inv: dict[str, Any] | None) -> str:
    if not inv:
        return "–"
    d = inv["max_abs_dprob"]
    return (f"{d:.1e} / {inv['flips']}" if d else f"0 / {inv['flips']}") + (" (row by row)" if inv.get("row_by_row") else "")


def pipeline_rows(r: dict[str, Any], gate: bool = False) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of every variant of a pipeline report: size, b1/s128 p50, b32/s128 seq/s, accuracy and
    agreement (on fewer texts, marked, for a variant under the eval cut), batch invariance; with `gate`, the b1
    p50 on real text the recommendation ranks by and the release gate's verdict on its lower bound."""
    rec = (r.get("recommended") or {}).get("variant")
    ranking = {x["variant"]: x for x in (r.get("recommended") or {}).get("ranking") or []}
    n = r["config"].get("max_eval_samples")
    rows = []
    for v in r["variants"]:
        if v["status"] != "ok":
            rows.append([f"{v['name']} (failed)"] + ["–"] * (8 if gate else 6))
            continue
        b1, b32 = _shape(v, 1, 128), _shape(v, 32, 128)
        name = f"**{v['name']}** (recommended)" if v["name"] == rec else v["name"]
        acc = v.get("accuracy") or {}
        # the pipeline scores a variant that cannot be recommended on fewer texts (its eval cut): say how many
        few = f" ({acc['n']:,})" if acc.get("n") and n and acc["n"] < n else ""
        rank = ranking.get(v["name"]) or {}
        real = [_num(rank.get("real_b1_p50_ms"))] if gate else []
        verdict = [_gate_verdict(rank.get("gate_record"))] if gate else []
        rows.append([name, _num(v["disk_bytes"] / 1e6, 1), _num(b1 and b1["p50"]), *real,
                     _num(b32 and b32["throughput"], 1), _pct(acc.get("accuracy"), 1) + few,
                     _pct(v.get("agreement"), 1) + few, *verdict, _inv(v.get("invariance"))])
    head = ["variant", "size MB", "p50 b1/s128 ms", *(["p50 b1 real text ms"] if gate else []), "b32/s128 seq/s",
            f"accuracy ({n:,})", f"agreement with fp32 ({n:,})",
            *(["release gate: agreement lower bound"] if gate else []), "max \\|Δprob\\| alone vs batched / flips"]
    return head, rows


def _gate_verdict(rec: dict[str, Any] | None) -> str:
    if not rec:
        return "not gated"
    lo, bar = _pct(rec["agreement_lower_bound"]), _pct(rec["bar"], 0)
    if rec["passed"]:
        return f"passed: {lo} ≥ {bar} ({rec['n']:,} texts)"
    return f"failed: {'; '.join(rec.get('reasons') or [f'{lo} < {bar}'])}"


def embedded_default() -> str:
    """Every variant of the pipeline's checkpoint, the reference bench (AMX Xeon)."""
    rel = "embedded-default/report.json"
    head, rows = pipeline_rows(_load(rel))
    return _table(head, rows) + _src(rel)


def _minutes(s: float) -> str:
    return f"{s / 60:.1f}"


def main_job() -> str:
    """README's headline: the current main job's every variant, with the machine, its choices and its stage times."""
    rel = f"{MAIN_JOB}/report.json"
    r = _load(rel)
    prov, pipe = r.get("provenance") or {}, r.get("pipeline") or {}
    training, stage_s = pipe.get("training") or {}, pipe.get("stage_s") or {}
    cfg = r["config"]
    choice = (training.get("precision_choice") or {}).get("reason")
    stages = ", ".join(f"{k} {_minutes(v)}" for k, v in stage_s.items() if k != "total")
    lead = (f"`make demo`'s pipeline (`{prov.get('command')}`, commit `{str(prov.get('commit'))[:7]}`, "
            f"{r['created'][:10]}) on a {r['environment'].get('physical_cores', '?')}-core **{pipe.get('machine')}**: "
            f"trained in {training.get('precision')} ({choice}), {training.get('optimizer_steps')} steps, test "
            f"accuracy {_pct(training.get('test_accuracy'))}; {_minutes(stage_s['total'])} min ({stages} min). "
            f"Latency at b1 and b32, s128, {cfg.get('threads')} threads; accuracy and agreement on the first "
            f"{cfg['max_eval_samples']:,} test reviews, or {cfg.get('slow_eval_samples')}, marked, for a variant the "
            f"recommendation provably cannot pick (slower on real text than one already meeting its bar); batch "
            f"invariance on "
            f"{cfg.get('invariance_samples')} reviews; the release gate on the candidates' "
            f"{(r.get('gate') or {}).get('data', {}).get('n', '?'):,} test reviews:")
    head, rows = pipeline_rows(r, gate=True)
    rec = r.get("recommended") or {}
    after = (f"\n\nRecommended, and what `qserve serve {RUN_DIR}` serves on that machine: **{rec.get('variant')}**, "
             f"{rec.get('why')}.")
    return lead + "\n\n" + _table(head, rows) + after + _src(rel)


def main_job_long_text() -> str:
    """What the main job serves a long review as, and every policy on the variant that compared them on every text."""
    rel = f"{MAIN_JOB}/report.json"
    r = _load(rel)
    lt = r.get("long_text") or {}
    rec = (r.get("recommended") or {}).get("variant")
    own = next((v.get("long_text") for v in r["variants"] if v["name"] == rec), None)
    compared = max((v for v in r["variants"] if v.get("long_text_policies")),
                   key=lambda v: v["long_text_policies"][0].get("n") or 0)
    pols = compared["long_text_policies"]
    n = pols[0].get("n")
    rows = [[p["policy"], _pct(p["accuracy"]), _num(p["texts_per_s"], 1), _num(p.get("mean_windows")),
             _pct(p.get("truncated"))] for p in pols]
    lead = (f"In the main job's report, `qserve serve {RUN_DIR}` serves **{(lt.get('fast') or {}).get('policy')}** "
            f"({lt.get('why')}), a variant dir its own policy (**{own}** for {rec}). {compared['name']} on the first "
            f"{n:,} test reviews, under every policy:")
    head = ["policy", f"accuracy ({n:,})", "texts/s", "windows per text", "texts with unseen tokens"]
    return lead + "\n\n" + _table(head, rows) + _src(rel)


def embedded_default_amd() -> str:
    """The same pipeline on the AMD EPYC (another checkpoint), with agreement on all 2,000 test reviews."""
    pipe_rel, full_rel = "embedded-default-amd/report.json", "embedded-default-full-test/report.json"
    pipe, full = _load(pipe_rel), _load(full_rel)
    by_full = {v["name"]: v for v in full["variants"]}
    rows = []
    names = [v["name"] for v in pipe["variants"]] + [n for n in by_full if n not in {v["name"] for v in pipe["variants"]}]
    by_pipe = {v["name"]: v for v in pipe["variants"]}
    for name in names:
        p, f = by_pipe.get(name) or {}, by_full.get(name) or {}
        b1 = _shape(p, 1, 128) if p else None
        size = (p or f).get("disk_bytes")
        rows.append([name if p else f"{name} (not in the pipeline on CPU)", _num(size and size / 1e6, 1),
                     _num(b1 and b1["p50"]), _pct((p.get("accuracy") or {}).get("accuracy"), 1),
                     _pct(p.get("agreement"), 1), _pct(f.get("agreement"), 2)])
    head = ["variant", "size MB", "p50 b1/s128 ms", "accuracy (1,000)", "agreement with fp32 (1,000)", "(2,000)"]
    return _table(head, rows) + _src(pipe_rel, full_rel)


def int8_invariance() -> str:
    """The candidate fixes for onnx-int8's batch dependence, side by side."""
    rel = "int8-invariance/embedded-default/report.json"
    r = _load(rel)
    names = list(dict.fromkeys([*r["timing"], *r["invariance"], *(r.get("agreement") or {})]))
    rows = []
    for name in names:
        t, a, inv = r["timing"].get(name) or {}, (r.get("agreement") or {}).get(name) or {}, r["invariance"].get(name) or {}
        rows.append([name, _pct(a.get("agreement")), _num(t.get("b1_p50_ms"), 2, " ms"),
                     _num(t.get("b1_ratio_to_today"), 3, "x"), _num(t.get("real_b32_texts_per_s"), 1),
                     "–" if not inv else f"{inv['max_abs_dprob']:.2g}",
                     "–" if not inv else f"{inv['flips']} of {inv['scored']}"])
    n = next(iter((r.get("agreement") or {}).values()), {}).get("n")
    head = ["candidate", f"agreement with onnx-fp32 ({n:,})" if n else "agreement", "b1/s128 p50",
            "vs today's graph, batched", "real reviews b32 texts/s", "max \\|Δprob\\| alone vs batched", "label flips"]
    return _table(head, rows) + _src(rel)


def variants_invariance() -> str:
    """Batch invariance bound per variant of the embedded default (each text alone vs in batches of 8 and 32)."""
    rel = "int8-invariance/embedded-default/variants-invariance.json"
    r = _load(rel)
    rows = [[name, f"{v['max_abs_dprob']:.2g}", f"{v['flips']} of {v['scored']}", "yes" if v.get("row_by_row") else "no"]
            for name, v in r["variants"].items()]
    return _table(["variant", "max \\|Δprob\\|", "label flips", "run row by row"], rows) + _src(rel)


def rows_side_by_side() -> str:
    """How a row-by-row variant runs a batch: one forward, rows one at a time, rows side by side (texts/s)."""
    rel = "int8-invariance/rows-side-by-side/report.json"
    r = _load(rel)
    modes = ["batched", "rows, one at a time", "rows, side by side"]
    rows = []
    for texts, n in r["sets"].items():
        for b in r["batches"]:
            rows.append([f"{n} {texts}", str(b)] + [_num((r["rates"].get(f"{texts}|b{b}|{m}") or {}).get("texts_per_s"), 1)
                                                    for m in modes])
    rows.append(["max \\|Δprob\\| vs each text alone", ""] + [f"{r['max_abs_dprob_vs_alone'][m]:.2g}" for m in modes])
    head = ["texts", "batch", "one forward (answers move)", "rows, one at a time", "rows, side by side"]
    return _table(head, rows) + _src(rel)


def precision() -> str:
    """The precision study: one fine-tune per precision, plus a second seed for the noise."""
    rel = "precision/precision_study.json"
    r = _load(rel)
    rows = []
    for run in r["runs"]:
        if not run.get("ok"):
            rows.append([run["label"], "failed"] + ["–"] * 6)
            continue
        rows.append([run["label"], str(run.get("optimizer")), _num(run.get("train_time_s") and run["train_time_s"] / 60, 1),
                     _num(run.get("step_time_median_s"), 3), _num(run.get("step_interleaved_vs_bf16_mixed"), 2, "x"),
                     _num(run.get("optimizer_state_bytes") and run["optimizer_state_bytes"] / 1e6, 0),
                     _pct(run.get("val_accuracy")), _pct(run.get("test_accuracy"))])
    head = ["run", "optimizer", "train time (min)", "median step (s)", "interleaved step vs bf16-mixed",
            "optimizer state (MB)", "val acc", "test acc"]
    return _table(head, rows, ["---", "---"] + ["---:"] * 6) + _src(rel)


def serve() -> str:
    """Serving onnx-int8 over HTTP: unbatched vs batched server, concurrency 1 and 32."""
    rel = "serve/serve_report.json"
    r = _load(rel)
    rows = []
    for key, label in (("unbatched", "max batch 1"), ("batched", f"max batch {r['settings']['batched_max_batch_size']}")):
        for lv in r["runs"][key]["levels"]:
            rows.append([label, str(lv["concurrency"]), _num(lv["throughput_rps"], 1), _num(lv["p50_ms"]),
                         _num(lv["p99_ms"]), _num(lv.get("mean_batch_size"), 1), str(lv["mismatched"])])
    s, c = r["summary"], r["model_ceiling"]
    rows.append(["the model alone, in process", "", f"{c['texts_per_s_b1']:.1f} (b1) / {c['texts_per_s_batched']:.1f} "
                 f"(b{c['batch']})", _num(s["model_b1_p50_ms"]), "", "", ""])
    head = ["server", "concurrency", "req/s", "p50 ms", "p99 ms", "mean batch", "mismatched answers"]
    return _table(head, rows) + _src(rel)


NOT_MEASURED = "not measured"
# The checkpoints of the long-text policies table: (report dir, column label); each its own `make reports` stage.
LONG_TEXT_RUNS = (("long-text-head", "trained head"),  # 6,000 reviews, 1 epoch
                  ("long-text", "trained head-tail"),  # the same recipe: the pipeline's checkpoint
                  ("long-text-full", "full data"))  # head-tail, all 19,922 training reviews, 2 epochs


def _maybe(rel: str) -> dict[str, Any] | None:
    """A report's JSON, or None while its stage has not run (a pending stage's table says "not measured")."""
    return _load(rel) if (REPORTS / rel).is_file() else None


def _src_some(rels: list[str]) -> str:
    """_src of the reports that exist, naming the stage that writes each missing one."""
    have = [r for r in rels if (REPORTS / r).is_file()]
    missing = [f"`{r}` (`make reports STAGE={r.split('/')[0]}`)" for r in rels if r not in have]
    src = _src(*have) if have else "\n\n<sub>Rendered by `benchmarks/render_tables.py`.</sub>"
    return src[:-len("</sub>")] + (f" Not measured yet: {', '.join(missing)}.</sub>" if missing else "</sub>")


def _policies(report: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """{written-out policy: its row} of the first variant a `qserve bench --long-text` report measured."""
    for v in (report or {}).get("variants") or []:
        if v.get("long_text_policies"):
            return {p["policy"]: p for p in v["long_text_policies"]}
    return {}


def long_text_policies() -> str:
    """Every long-text policy on the 2,000 test reviews, per checkpoint: accuracy and texts/s of one bench run."""
    rels = [f"{d}/report.json" for d, _ in LONG_TEXT_RUNS]
    runs = [_policies(_maybe(r)) for r in rels]
    names = list(dict.fromkeys(p for run in runs for p in run))
    rows = []
    for name in names:
        first = next(run[name] for run in runs if name in run)  # same texts, same tokenizer: same cut
        cells = []
        for run in runs:
            p = run.get(name)
            cells += [_pct(p["accuracy"]), _num(p["texts_per_s"], 1)] if p else [NOT_MEASURED, NOT_MEASURED]
        rows.append([name, *cells, _num(first.get("mean_windows")), _pct(first.get("truncated"))])
    if not rows:
        rows.append([NOT_MEASURED] + ["–"] * (2 * len(runs) + 2))
    head = ["policy"] + [h for _, label in LONG_TEXT_RUNS for h in (f"{label}: accuracy", "texts/s")] + [
        "windows per text", "texts with unseen tokens"]
    return _table(head, rows) + _src_some(rels)


def long_text_summary() -> str:
    """The README's short form: the pipeline's checkpoint, every policy's accuracy and texts/s from one run."""
    rel = "long-text/report.json"
    run = _policies(_maybe(rel))
    rows = [[name, _pct(p["accuracy"]), _num(p["texts_per_s"], 1), _num(p.get("mean_windows"))]
            for name, p in run.items()] or [[NOT_MEASURED, "–", "–", "–"]]
    return _table(["policy", "test accuracy (2,000)", "texts/s", "windows per text"], rows) + _src_some([rel])


def serve_windows() -> str:
    """Windows served at concurrency 32: answers against each text alone, texts/s against the window ceiling."""
    rel = "serve-windows/report.json"
    r = _maybe(rel)
    conc = (r or {}).get("settings", {}).get("concurrency", 32)
    head = ["policy", "c1 texts/s", f"c{conc} texts/s", "windows per text", "ceiling texts/s (head / windows)",
            f"c{conc} / ceiling", f"label changes c{conc} vs c1", "max \\|Δprob\\|"]
    if r is None:
        return _table(head, [[NOT_MEASURED] + ["–"] * (len(head) - 1)]) + _src_some([rel])
    rows = []
    for name, p in r["summary"]["policies"].items():
        ch = p["c32_vs_c1"]
        rows.append([name, _num(p["c1_texts_per_s"], 1), _num(p["c32_texts_per_s"], 1), _num(p["windows_per_text"]),
                     _num(p.get("ceiling_texts_per_s"), 1), _num(p.get("ratio_to_ceiling"), 2, "x"),
                     f"{ch['label_changes']} of {ch['compared']:,}", f"{ch['max_abs_dprob']:.1e}"])
    return _table(head, rows) + _src_some([rel])


def checkpoint_cost() -> str:
    """What one resumable training checkpoint costs (benchmarks/checkpoint_cost.py), per precision."""
    rel = "checkpoint_cost/checkpoint_cost.json"
    r = _maybe(rel)
    head = ["precision", "checkpoint (MB)", "wall s / checkpoint", "CPU s / checkpoint", "share at ~300 s interval"]
    if r is None:
        return _table(head, [[NOT_MEASURED] * 5]) + _src_some([rel]).replace("checkpoint_cost`)", "checkpoint-cost`)")
    rows = [[x["precision"], _num(x["bytes"] / 1e6, 0), _num(x["wall_s_median"]), _num(x["cpu_s_median"]),
             _pct(x["share_at_default_interval"])] for x in r["runs"]]
    return _table(head, rows) + _src(rel)


def gate_multilabel() -> str:
    """docs/gate.md: per-label thresholds against one 0.5 on the two multi-label models qserve trained and gated."""
    rels = ["gate-multilabel/gate.json", "gate-multilabel-aspects/gate.json"]
    rows = []
    for rel in rels:
        r = _load(rel)
        res, run = r["results"][0], r["run"]
        f1, g = res["gate"]["calibration"]["macro_f1"], run["macro_f1_gain"]
        rows.append([f"`benchmarks/reports/{rel.split('/')[0]}/`", ", ".join(run["data"]["labels"]),
                     str(g["n"]), f"{f1['at_0.5']:.4f}", f"{f1['at_thresholds']:.4f}",
                     f"{g['value']:+.4f} [{g['lo']:+.4f}, {g['hi']:+.4f}]" + ("" if g["lo"] > 0 else ": noise"),
                     "passed" if res["gate"]["passed"] else "failed"])
    head = ["report", "labels", "test texts", "macro F1 at 0.5", "at per-label thresholds", "gain [95% interval]",
            "onnx-int8's gate"]
    return _table(head, rows, ["---", "---", "---:", "---:", "---:", "---", "---"]) + _src(*rels)


def flood() -> str:
    """docs/serving.md's overload paragraph: refusals, the first admitted answer, a normal client beside slow ones."""
    from benchmarks.flood_bench import SLOW_IDLE, SLOW_TRICKLING, _med

    rel = "flood/report.json"
    r = _load(rel)
    cfg = r["config"]

    def side(name: str, key: str, fld: str) -> float | None:
        return _med([(f[key] or {}).get(fld) for f in r["floods"] if f["side"] == name])

    cur, base = "current", "baseline"
    quiet = [s["p50_ms"] for s in r["slow_clients"] if s["condition"] == "quiet"]
    slow = {s["round"]: s["p50_ms"] for s in r["slow_clients"] if s["condition"] == "slow"}
    ratios = [slow[s["round"]] / s["p50_ms"] for s in r["slow_clients"] if s["condition"] == "quiet"]

    def span(xs: list[float], nd: int = 1) -> str:
        return f"{min(xs):.{nd}f}-{max(xs):.{nd}f}"

    return (f"Measured (`benchmarks/reports/flood/`, {r['environment']['cpu']['model']}, `{cfg['variant_dir']}`, "
            f"{cfg['requests']} simultaneous one-text requests, `--max-inputs {cfg['max_inputs']} --max-queue "
            f"{cfg['max_queue']}`, {cfg['rounds']} rounds alternating with the server of {cfg['baseline_ref']}, "
            f"medians over the rounds; server times are its histograms' bucket bounds): refusals took <= "
            f"{side(cur, 'server_rejection', 'p50_le_ms'):g} ms each at the median (p99 <= "
            f"{side(cur, 'server_rejection', 'p99_le_ms'):g} ms); the first admitted answer reached the client after "
            f"{side(cur, 'client_200_ms', 'first'):.1f} ms against {side(base, 'client_200_ms', 'first'):.1f} ms "
            f"before (the last {side(cur, 'client_200_ms', 'last'):.1f} against "
            f"{side(base, 'client_200_ms', 'last'):.1f} ms), with {side(cur, 'server_inference', 'count'):.0f} forward "
            f"passes against {side(base, 'server_inference', 'count'):.0f} and "
            f"{side(cur, 'statuses', '200'):.0f} admitted requests against {side(base, 'statuses', '200'):.0f}. A "
            f"normal client's p50 read {span(quiet)} ms on the quiet server and {span(list(slow.values()))} ms while "
            f"{SLOW_IDLE} idle and {SLOW_TRICKLING} trickling sockets were open (ratio {span(ratios, 2)})."
            + _src(rel))


def stages() -> str:
    """The `make reports` stages: what each re-runs, the CPU its reports record, and how long it takes."""
    rows = []
    for st in rebuild_reports.STAGES:
        cpus = sorted({c or "not recorded" for c in rebuild_reports.recorded(st).values()}) or [
            f"no report yet ({st.pending})" if st.pending else "no report yet"]
        reports = ", ".join(f"`{Path(r.json).relative_to('benchmarks/reports')}`" for r in st.reports)
        rows.append([f"`{st.name}`", st.what + ("" if not st.notes else " (" + " ".join(st.notes) + ")"), reports,
                     ", ".join(cpus), rebuild_reports.stage_duration(st)])
    head = ["STAGE", "what it re-runs", "reports (under benchmarks/reports/)", "measured on", "duration on 2 cores"]
    return _table(head, rows, ["---"] * 5) + (
        "\n\n<sub>Rendered from `benchmarks/rebuild_reports.py`, the CPU each report's JSON records, and the measured "
        f"times in its pipeline record or `{rebuild_reports.STAGE_TIMES}`.</sub>")


def seed_precision() -> str:
    """The seed project's precision study (not measured here): rendered from its one copy, qserve's SEED table."""
    from qserve.training.study import SEED, seed_table

    return (f"{SEED['setup']}.\n\n" + seed_table() + "\n\n<sub>Rendered from `qserve/training/study.py` SEED (the seed "
            f"project's [published figures]({SEED['source']}), not measured by qserve) by "
            "`benchmarks/render_tables.py`.</sub>")


TABLES: dict[str, Callable[[], str]] = {
    "main-job": main_job,
    "main-job-long-text": main_job_long_text,
    "embedded-default": embedded_default,
    "embedded-default-amd": embedded_default_amd,
    "int8-invariance": int8_invariance,
    "variants-invariance": variants_invariance,
    "rows-side-by-side": rows_side_by_side,
    "precision": precision,
    "serve": serve,
    "long-text-policies": long_text_policies,
    "long-text-summary": long_text_summary,
    "serve-windows": serve_windows,
    "stages": stages,
    "flood": flood,
    "gate-multilabel": gate_multilabel,
    "checkpoint-cost": checkpoint_cost,
    "seed-precision": seed_precision,
}


UNITS = r"(?:ms|s|min|h|%|x|×|MB|MiB|GB|GiB|KB|req/s|texts/s|rows/s|seq/s|sequences/s|samples/s|GOP/s|points)"
NUMBER = r"\d[\d,]*(?:\.\d+)?"
# A figure with a unit (a range counts once: "0.97-1.06x"), one in scientific notation (an error, a Δprob) or
# with three decimals or more (an F1, a threshold, a logit error); not a version (1.45.2) or a date.
HAND_NUMBER = re.compile(rf"(?<![\w.,/-])(?:{NUMBER}(?:\s?[-–]\s?{NUMBER})?\s?{UNITS}(?![\w/])|{NUMBER}e-?\d+"
                         rf"|\d+\.\d{{3,}}(?!\d|\.\d))")
_NOT_PROSE = re.compile(r"^```.*?^```[^\n]*$|<!--.*?-->|`[^`\n]*`", re.M | re.S)


def hand_numbers(text: str) -> list[str]:
    """The measured-looking numbers typed in a page's prose and hand-written tables: figures with a unit or in
    scientific notation, outside rendered blocks, code (fenced or inline) and HTML comments."""
    prose = _NOT_PROSE.sub(" ", MARKER.sub(" ", text))
    return [re.sub(r"\s+", " ", m.group(0)) for m in HAND_NUMBER.finditer(prose)]


def markdown_files(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def render_file(text: str, rendered: dict[str, str], where: str = "") -> str:
    def sub(m: re.Match[str]) -> str:
        name = m["name"]
        if name not in TABLES:
            raise SystemExit(f"{where}: unknown table {name!r}; known: {', '.join(TABLES)}")
        if name not in rendered:
            rendered[name] = TABLES[name]()
        return f"<!-- {m['kind']}:{name} -->\n{rendered[name]}\n<!-- /{m['kind']} -->"

    return MARKER.sub(sub, text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 with a diff if any table is stale")
    p.add_argument("--hand-numbers", action="store_true",
                   help="print the measured-looking numbers typed in prose, one `FILE<TAB>NUMBER` line each (the "
                        "format of tests/unit/docs_numbers.txt); write nothing")
    p.add_argument("files", nargs="*", type=Path, help="markdown files (default: README.md and docs/**/*.md)")
    args = p.parse_args(argv)
    if args.hand_numbers:
        for path in args.files or markdown_files():
            for n in hand_numbers(path.read_text(encoding="utf-8")):
                print(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}\t{n}")
        return 0
    rendered: dict[str, str] = {}
    stale = []
    for path in args.files or markdown_files():
        text = path.read_text(encoding="utf-8")
        new = render_file(text, rendered, str(path))
        if new == text:
            continue
        if args.check:
            stale.append(path)
            sys.stdout.writelines(difflib.unified_diff(text.splitlines(True), new.splitlines(True),
                                                       f"{path} (committed)", f"{path} (from the reports' JSON)"))
        else:
            path.write_text(new, encoding="utf-8")
            print(f"updated {path}")
    if stale:
        print(f"\n{len(stale)} file(s) hold tables that disagree with their reports' JSON: "
              f"{', '.join(map(str, stale))}; run `python -m benchmarks.render_tables`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
