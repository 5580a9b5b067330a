"""Render the README's and docs' measured tables from the committed reports' JSON.

    python -m benchmarks.render_tables            # rewrite every table between its markers
    python -m benchmarks.render_tables --check    # exit 1 and print a diff when a table disagrees with its JSON

A table lives in a markdown file between `<!-- table:NAME -->` and `<!-- /table -->`, a passage of prose
that quotes measurements between `<!-- text:NAME -->` and `<!-- /text -->`; NAME is a key of TABLES below, and
the same block may appear in several files, and may sit indented inside a list item (its lines then keep that
indent). Only the lines between the markers are written, so the prose around a block stays hand-written; a prose
block names its report and the CPU that report records; measured numbers are never copied by hand
(tests/unit/test_docs.py also flags a measured-looking number typed in prose, see hand_numbers() and
tests/unit/docs_numbers.txt). `make reports` runs this after every stage; tests/unit/test_docs.py runs it with --check.

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
from benchmarks.byo_bert import BAR
from benchmarks.flood_bench import SLOW_IDLE, SLOW_TRICKLING, _med
from benchmarks.harness import ROOT
from benchmarks.ov_breakdown import ATTENTION, bound
from benchmarks.serve_protocol_cost import ROUTES, TITLES
from qserve.bench.floor import peak_for
from qserve.provenance import recorded_cpu
from qserve.training.study import SEED, seed_table

REPORTS = ROOT / "benchmarks" / "reports"
MARKER = re.compile(
    r"^(?P<indent>[ ]*)<!-- (?P<kind>table|text):(?P<name>[a-z0-9-]+) -->\n(?P<body>.*?)"
    r"^(?P=indent)<!-- /(?P=kind) -->$",
    re.M | re.S,
)
"""A block between its markers; indented as a whole (inside a list item), its lines are written with that indent."""
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
    return (f"{d:.1e} / {inv['flips']}" if d else f"0 / {inv['flips']}") + (
        " (row by row)" if inv.get("row_by_row") else ""
    )


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
        rows.append(
            [
                name,
                _num(v["disk_bytes"] / 1e6, 1),
                _num(b1 and b1["p50"]),
                *real,
                _num(b32 and b32["throughput"], 1),
                _pct(acc.get("accuracy"), 1) + few,
                _pct(v.get("agreement"), 1) + few,
                *verdict,
                _inv(v.get("invariance")),
            ]
        )
    head = [
        "variant",
        "size MB",
        "p50 b1/s128 ms",
        *(["p50 b1 real text ms"] if gate else []),
        "b32/s128 seq/s",
        f"accuracy ({n:,})",
        f"agreement with fp32 ({n:,})",
        *(["release gate: agreement lower bound"] if gate else []),
        "max \\|Δprob\\| alone vs batched / flips",
    ]
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
    lead = (
        f"`make demo`'s pipeline (`{prov.get('command')}`, commit `{str(prov.get('commit'))[:7]}`, "
        f"{r['created'][:10]}) on a {r['environment'].get('physical_cores', '?')}-core **{pipe.get('machine')}**: "
        f"trained in {training.get('precision')} ({choice}), {training.get('optimizer_steps')} steps, test "
        f"accuracy {_pct(training.get('test_accuracy'))}; {_minutes(stage_s['total'])} min ({stages} min). "
        f"Latency at b1 and b32, s128, {cfg.get('threads')} threads; accuracy and agreement on the first "
        f"{cfg['max_eval_samples']:,} test reviews, or {cfg.get('slow_eval_samples')}, marked, for a variant the "
        f"recommendation provably cannot pick (slower on real text than one already meeting its bar); batch "
        f"invariance on "
        f"{cfg.get('invariance_samples')} reviews; the release gate on the candidates' "
        f"{(r.get('gate') or {}).get('data', {}).get('n', '?'):,} test reviews:"
    )
    head, rows = pipeline_rows(r, gate=True)
    rec = r.get("recommended") or {}
    after = (
        f"\n\nRecommended, and what `qserve serve {RUN_DIR}` serves on that machine: **{rec.get('variant')}**, "
        f"{rec.get('why')}."
    )
    return lead + "\n\n" + _table(head, rows) + after + _src(rel)


def main_job_long_text() -> str:
    """What the main job serves a long review as, and every policy on the variant that compared them on every text."""
    rel = f"{MAIN_JOB}/report.json"
    r = _load(rel)
    lt = r.get("long_text") or {}
    rec = (r.get("recommended") or {}).get("variant")
    own = next((v.get("long_text") for v in r["variants"] if v["name"] == rec), None)
    compared = max(
        (v for v in r["variants"] if v.get("long_text_policies")),
        key=lambda v: v["long_text_policies"][0].get("n") or 0,
    )
    pols = compared["long_text_policies"]
    n = pols[0].get("n")
    rows = [
        [
            p["policy"],
            _pct(p["accuracy"]),
            _num(p["texts_per_s"], 1),
            _num(p.get("mean_windows")),
            _pct(p.get("truncated")),
        ]
        for p in pols
    ]
    lead = (
        f"In the main job's report, `qserve serve {RUN_DIR}` serves **{(lt.get('fast') or {}).get('policy')}** "
        f"({lt.get('why')}), a variant dir its own policy (**{own}** for {rec}). {compared['name']} on the first "
        f"{n:,} test reviews, under every policy:"
    )
    head = ["policy", f"accuracy ({n:,})", "texts/s", "windows per text", "texts with unseen tokens"]
    return lead + "\n\n" + _table(head, rows) + _src(rel)


def embedded_default_amd() -> str:
    """The same pipeline on the AMD EPYC (another checkpoint), with agreement on all 2,000 test reviews."""
    pipe_rel, full_rel = "embedded-default-amd/report.json", "embedded-default-full-test/report.json"
    pipe, full = _load(pipe_rel), _load(full_rel)
    by_full = {v["name"]: v for v in full["variants"]}
    rows = []
    names = [v["name"] for v in pipe["variants"]] + [
        n for n in by_full if n not in {v["name"] for v in pipe["variants"]}
    ]
    by_pipe = {v["name"]: v for v in pipe["variants"]}
    for name in names:
        p, f = by_pipe.get(name) or {}, by_full.get(name) or {}
        b1 = _shape(p, 1, 128) if p else None
        size = (p or f).get("disk_bytes")
        rows.append(
            [
                name if p else f"{name} (not in the pipeline on CPU)",
                _num(size and size / 1e6, 1),
                _num(b1 and b1["p50"]),
                _pct((p.get("accuracy") or {}).get("accuracy"), 1),
                _pct(p.get("agreement"), 1),
                _pct(f.get("agreement"), 2),
            ]
        )
    head = ["variant", "size MB", "p50 b1/s128 ms", "accuracy (1,000)", "agreement with fp32 (1,000)", "(2,000)"]
    return _table(head, rows) + _src(pipe_rel, full_rel)


def int8_invariance() -> str:
    """The candidate fixes for onnx-int8's batch dependence, side by side."""
    rel = "int8-invariance/embedded-default/report.json"
    r = _load(rel)
    names = list(dict.fromkeys([*r["timing"], *r["invariance"], *(r.get("agreement") or {})]))
    rows = []
    for name in names:
        t, a, inv = (
            r["timing"].get(name) or {},
            (r.get("agreement") or {}).get(name) or {},
            r["invariance"].get(name) or {},
        )
        rows.append(
            [
                name,
                _pct(a.get("agreement")),
                _num(t.get("b1_p50_ms"), 2, " ms"),
                _num(t.get("b1_ratio_to_today"), 3, "x"),
                _num(t.get("real_b32_texts_per_s"), 1),
                "–" if not inv else f"{inv['max_abs_dprob']:.2g}",
                "–" if not inv else f"{inv['flips']} of {inv['scored']}",
            ]
        )
    n = next(iter((r.get("agreement") or {}).values()), {}).get("n")
    head = [
        "candidate",
        f"agreement with onnx-fp32 ({n:,})" if n else "agreement",
        "b1/s128 p50",
        "vs today's graph, batched",
        "real reviews b32 texts/s",
        "max \\|Δprob\\| alone vs batched",
        "label flips",
    ]
    return _table(head, rows) + _src(rel)


def variants_invariance() -> str:
    """Batch invariance bound per variant of the embedded default (each text alone vs in batches of 8 and 32)."""
    rel = "int8-invariance/embedded-default/variants-invariance.json"
    r = _load(rel)
    rows = [
        [name, f"{v['max_abs_dprob']:.2g}", f"{v['flips']} of {v['scored']}", "yes" if v.get("row_by_row") else "no"]
        for name, v in r["variants"].items()
    ]
    return _table(["variant", "max \\|Δprob\\|", "label flips", "run row by row"], rows) + _src(rel)


def rows_side_by_side() -> str:
    """How a row-by-row variant runs a batch: one forward, rows one at a time, rows side by side (texts/s)."""
    rel = "int8-invariance/rows-side-by-side/report.json"
    r = _load(rel)
    modes = ["batched", "rows, one at a time", "rows, side by side"]
    rows = []
    for texts, n in r["sets"].items():
        for b in r["batches"]:
            rows.append(
                [f"{n} {texts}", str(b)]
                + [_num((r["rates"].get(f"{texts}|b{b}|{m}") or {}).get("texts_per_s"), 1) for m in modes]
            )
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
        rows.append(
            [
                run["label"],
                str(run.get("optimizer")),
                _num(run.get("train_time_s") and run["train_time_s"] / 60, 1),
                _num(run.get("step_time_median_s"), 3),
                _num(run.get("step_interleaved_vs_bf16_mixed"), 2, "x"),
                _num(run.get("optimizer_state_bytes") and run["optimizer_state_bytes"] / 1e6, 0),
                _pct(run.get("val_accuracy")),
                _pct(run.get("test_accuracy")),
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
    return _table(head, rows, ["---", "---"] + ["---:"] * 6) + _src(rel)


def serve() -> str:
    """Serving onnx-int8 over HTTP: unbatched vs batched server, concurrency 1 and 32."""
    rel = "serve/serve_report.json"
    r = _load(rel)
    rows = []
    for key, label in (
        ("unbatched", "max batch 1"),
        ("batched", f"max batch {r['settings']['batched_max_batch_size']}"),
    ):
        for lv in r["runs"][key]["levels"]:
            rows.append(
                [
                    label,
                    str(lv["concurrency"]),
                    _num(lv["throughput_rps"], 1),
                    _num(lv["p50_ms"]),
                    _num(lv["p99_ms"]),
                    _num(lv.get("mean_batch_size"), 1),
                    str(lv["mismatched"]),
                ]
            )
    s, c = r["summary"], r["model_ceiling"]
    rows.append(
        [
            "the model alone, in process",
            "",
            f"{c['texts_per_s_b1']:.1f} (b1) / {c['texts_per_s_batched']:.1f} (b{c['batch']})",
            _num(s["model_b1_p50_ms"]),
            "",
            "",
            "",
        ]
    )
    head = ["server", "concurrency", "req/s", "p50 ms", "p99 ms", "mean batch", "mismatched answers"]
    return _table(head, rows) + _src(rel)


NOT_MEASURED = "not measured"
# The checkpoints of the long-text policies table: (report dir, column label); each its own `make reports` stage.
LONG_TEXT_RUNS = (
    ("long-text-head", "trained head"),  # 6,000 reviews, 1 epoch
    ("long-text", "trained head-tail"),  # the same recipe: the pipeline's checkpoint
    ("long-text-full", "full data"),
)  # head-tail, all 19,922 training reviews, 2 epochs


def _maybe(rel: str) -> dict[str, Any] | None:
    """A report's JSON, or None while its stage has not run (a pending stage's table says "not measured")."""
    return _load(rel) if (REPORTS / rel).is_file() else None


def _src_some(rels: list[str]) -> str:
    """_src of the reports that exist, naming the stage that writes each missing one."""
    have = [r for r in rels if (REPORTS / r).is_file()]
    missing = [f"`{r}` (`make reports STAGE={r.split('/')[0]}`)" for r in rels if r not in have]
    src = _src(*have) if have else "\n\n<sub>Rendered by `benchmarks/render_tables.py`.</sub>"
    return src[: -len("</sub>")] + (f" Not measured yet: {', '.join(missing)}.</sub>" if missing else "</sub>")


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
    head = (
        ["policy"]
        + [h for _, label in LONG_TEXT_RUNS for h in (f"{label}: accuracy", "texts/s")]
        + ["windows per text", "texts with unseen tokens"]
    )
    return _table(head, rows) + _src_some(rels)


def long_text_summary() -> str:
    """The README's short form: the pipeline's checkpoint, every policy's accuracy and texts/s from one run."""
    rel = "long-text/report.json"
    run = _policies(_maybe(rel))
    rows = [
        [name, _pct(p["accuracy"]), _num(p["texts_per_s"], 1), _num(p.get("mean_windows"))] for name, p in run.items()
    ] or [[NOT_MEASURED, "–", "–", "–"]]
    return _table(["policy", "test accuracy (2,000)", "texts/s", "windows per text"], rows) + _src_some([rel])


def serve_windows() -> str:
    """Windows served at concurrency 32: answers against each text alone, texts/s against the window ceiling."""
    rel = "serve-windows/report.json"
    r = _maybe(rel)
    conc = (r or {}).get("settings", {}).get("concurrency", 32)
    head = [
        "policy",
        "c1 texts/s",
        f"c{conc} texts/s",
        "windows per text",
        "ceiling texts/s (head / windows)",
        f"c{conc} / ceiling",
        f"label changes c{conc} vs c1",
        "max \\|Δprob\\|",
    ]
    if r is None:
        return _table(head, [[NOT_MEASURED] + ["–"] * (len(head) - 1)]) + _src_some([rel])
    rows = []
    for name, p in r["summary"]["policies"].items():
        ch = p["c32_vs_c1"]
        rows.append(
            [
                name,
                _num(p["c1_texts_per_s"], 1),
                _num(p["c32_texts_per_s"], 1),
                _num(p["windows_per_text"]),
                _num(p.get("ceiling_texts_per_s"), 1),
                _num(p.get("ratio_to_ceiling"), 2, "x"),
                f"{ch['label_changes']} of {ch['compared']:,}",
                f"{ch['max_abs_dprob']:.1e}",
            ]
        )
    return _table(head, rows) + _src_some([rel])


def checkpoint_cost() -> str:
    """What one resumable training checkpoint costs (benchmarks/checkpoint_cost.py), per precision."""
    rel = "checkpoint_cost/checkpoint_cost.json"
    r = _maybe(rel)
    head = ["precision", "checkpoint (MB)", "wall s / checkpoint", "CPU s / checkpoint", "share at ~300 s interval"]
    if r is None:
        return _table(head, [[NOT_MEASURED] * 5]) + _src_some([rel]).replace("checkpoint_cost`)", "checkpoint-cost`)")
    rows = [
        [
            x["precision"],
            _num(x["bytes"] / 1e6, 0),
            _num(x["wall_s_median"]),
            _num(x["cpu_s_median"]),
            _pct(x["share_at_default_interval"]),
        ]
        for x in r["runs"]
    ]
    return _table(head, rows) + _src(rel)


def gate_multilabel() -> str:
    """docs/gate.md: per-label thresholds against one 0.5 on the two multi-label models qserve trained and gated."""
    rels = ["gate-multilabel/gate.json", "gate-multilabel-aspects/gate.json"]
    rows = []
    for rel in rels:
        r = _load(rel)
        res, run = r["results"][0], r["run"]
        f1, g = res["gate"]["calibration"]["macro_f1"], run["macro_f1_gain"]
        rows.append(
            [
                f"`benchmarks/reports/{rel.split('/')[0]}/`",
                ", ".join(run["data"]["labels"]),
                str(g["n"]),
                f"{f1['at_0.5']:.4f}",
                f"{f1['at_thresholds']:.4f}",
                f"{g['value']:+.4f} [{g['lo']:+.4f}, {g['hi']:+.4f}]" + ("" if g["lo"] > 0 else ": noise"),
                "passed" if res["gate"]["passed"] else "failed",
            ]
        )
    head = [
        "report",
        "labels",
        "test texts",
        "macro F1 at 0.5",
        "at per-label thresholds",
        "gain [95% interval]",
        "onnx-int8's gate",
    ]
    return _table(head, rows, ["---", "---", "---:", "---:", "---:", "---", "---"]) + _src(*rels)


def flood() -> str:
    """docs/serving.md's overload paragraph: refusals, the first admitted answer, a normal client beside slow ones."""
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

    return (
        f"Measured (`benchmarks/reports/flood/`, {r['environment']['cpu']['model']}, `{cfg['variant_dir']}`, "
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
        f"{SLOW_IDLE} idle and {SLOW_TRICKLING} trickling sockets were open (ratio {span(ratios, 2)})." + _src(rel)
    )


def stages() -> str:
    """The `make reports` stages: what each re-runs, the CPU its reports record, and how long it takes."""
    rows = []
    for st in rebuild_reports.STAGES:
        cpus = sorted({c or "not recorded" for c in rebuild_reports.recorded(st).values()}) or [
            f"no report yet ({st.pending})" if st.pending else "no report yet"
        ]
        reports = ", ".join(f"`{Path(r.json).relative_to('benchmarks/reports')}`" for r in st.reports)
        rows.append(
            [
                f"`{st.name}`",
                st.what + ("" if not st.notes else " (" + " ".join(st.notes) + ")"),
                reports,
                ", ".join(cpus),
                rebuild_reports.stage_duration(st),
            ]
        )
    head = ["STAGE", "what it re-runs", "reports (under benchmarks/reports/)", "measured on", "duration on 2 cores"]
    return _table(head, rows, ["---"] * 5) + (
        "\n\n<sub>Rendered from `benchmarks/rebuild_reports.py`, the CPU each report's JSON records, and the measured "
        f"times in its pipeline record or `{rebuild_reports.STAGE_TIMES}`.</sub>"
    )


def seed_precision() -> str:
    """The seed project's precision study (not measured here): rendered from its one copy, qserve's SEED table."""
    return (
        f"{SEED['setup']}.\n\n" + seed_table() + "\n\n<sub>Rendered from `qserve/training/study.py` SEED (the seed "
        f"project's [published figures]({SEED['source']}), not measured by qserve) by "
        "`benchmarks/render_tables.py`.</sub>"
    )


# -- prose blocks: each quotes one report (or a few of one run), names its machine, and says nothing the JSON
# does not hold; the hand-written text around a block says why the measurement was made and what it means.


def _x(v: float | None, nd: int = 2) -> str:
    return "–" if v is None else f"{v:.{nd}f}x"


def _span(xs: list[float], nd: int = 2, suffix: str = "") -> str:
    lo, hi = min(xs), max(xs)
    return f"{lo:.{nd}f}{suffix}" if f"{lo:.{nd}f}" == f"{hi:.{nd}f}" else f"{lo:.{nd}f}-{hi:.{nd}f}{suffix}"


def _cpu(rel: str) -> str:
    """The CPU a report's JSON says it was measured on."""
    return recorded_cpu(_load(rel)) or "CPU not recorded"


def _on(rel: str) -> str:
    """`benchmarks/reports/<its dir>/` on <the CPU it records>: how a prose block names its report and machine."""
    where = rel.rsplit("/", 1)[0] + "/" if "/" in rel else rel
    return f"`benchmarks/reports/{where}` on {_cpu(rel)}"


def _train(d: str) -> dict[str, Any]:
    """The train_metrics.json a pipeline stage copies beside its report."""
    return _load(f"{d}/train_metrics.json")


# the pipeline runs, one per machine (report dir, what it is); README's headline is MAIN_JOB
PIPELINE_RUNS = (
    ("embedded-default", "`make demo`'s pipeline after issue 30"),
    ("embedded-default-amd", "`make demo`'s pipeline before issue 30, from a fresh clone"),
    ("pipeline-fast-amd", "`make demo`'s pipeline after issue 30"),
    (MAIN_JOB, "the current main job (after issues 46-49: `auto`, transformers 5, the release gate)"),
)


def pipelines_by_cpu() -> str:
    """docs/measurements.md: each machine's own pipeline run: training, wall time by stage, what it recommends."""
    rows = []
    for d, what in PIPELINE_RUNS:
        r, t = _load(f"{d}/report.json"), _train(d)
        stage_s = (r.get("pipeline") or {}).get("stage_s") or {}
        stages = (
            (
                f"{_minutes(stage_s['total'])} min ("
                + ", ".join(f"{k} {_minutes(v)}" for k, v in stage_s.items() if k != "total")
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
                _cpu(f"{d}/report.json"),
                r["created"][:10],
                f"{t['precision']}, {t['optimizer_steps']} steps, {_num(t['train_time_s'], 0)} s, test "
                f"{_pct(t['test_accuracy'])}",
                stages,
                rec,
            ]
        )
    head = ["report (benchmarks/reports/)", "run", "CPU", "date", "training", "pipeline wall time", "recommended"]
    return _table(head, rows, ["---"] * 7) + _src(*[f"{d}/report.json" for d, _ in PIPELINE_RUNS])


def embedded_default_amd_run() -> str:
    """The AMD pipeline's training and the torch-fp16 row the table marks as outside the pipeline."""
    t = _train("embedded-default-amd")
    full = {v["name"]: v for v in _load("embedded-default-full-test/report.json")["variants"]}
    fp16 = _shape(full.get("torch-fp16") or {}, 1, 128)
    return (
        f"{_on('embedded-default-amd/report.json')}: training ({t['precision']}, {t['sizes']['train']:,} reviews, "
        f"{t['optimizer_steps']} steps) took {_num(t['train_time_s'], 0)} s and read {_pct(t['test_accuracy'])} "
        f"test accuracy on {t['sizes']['test']:,} held-out reviews. torch-fp16 (not in `--all` on a CPU) ran "
        f"b1/s128 at {_num(fp16 and fp16['p50'])} ms in {_on('embedded-default-full-test/report.json')}."
    )


def embedded_default_run() -> str:
    """The AMX Xeon's pipeline: its training and stage times, then what it recommends and why, in ratios."""
    rel = "embedded-default/report.json"
    r, t = _load(rel), _train("embedded-default")
    st = r["pipeline"]["stage_s"]
    cfg = r["config"]
    return (
        f"{_on(rel)}, {r['created'][:10]}: training {t['precision']}, {t['sizes']['train']:,} reviews, test "
        f"accuracy {_pct(t['test_accuracy'])}; {_minutes(st['total'])} min wall ("
        + ", ".join(f"{k} {_minutes(v)}" for k, v in st.items() if k != "total")
        + f" min); b1/s128 and b32/s128, "
        f"{cfg.get('threads')} threads; accuracy and agreement on the first {cfg['max_eval_samples']:,} test "
        f"reviews, or on the first {cfg.get('slow_eval_samples')}, marked, for a variant slower on real text than "
        f"one already meeting its bar, which cannot be recommended; batch invariance on "
        f"{cfg.get('invariance_samples')} reviews alone vs shuffled batches of 8 and 32."
    )


def embedded_default_choice() -> str:
    """Why the Xeon's report recommends what it does: its p50 and throughput against the runners-up, same run."""
    rel = "embedded-default/report.json"
    r = _load(rel)
    rec = r["recommended"]
    by = {v["name"]: v for v in r["variants"] if v["status"] == "ok"}
    me = by[rec["variant"]]
    b1, b32 = _shape(me, 1, 128), _shape(me, 32, 128)

    def vs(name: str) -> str:
        o = by.get(name)
        ob1, ob32 = _shape(o or {}, 1, 128), _shape(o or {}, 32, 128)
        if not (o and ob1 and ob32 and b1 and b32):
            return ""
        return (
            f"{_x(b1['p50'] / ob1['p50'])} {name}'s b1/s128 p50 and {_x(b32['throughput'] / ob32['throughput'])} "
            f"its b32 throughput"
        )

    others = [x for x in ("onnx-int8", "ov-bf16") if x in by and x != rec["variant"]]
    checks = [v["real_text_check"]["ratio"] for v in by.values() if (v.get("real_text_check") or {}).get("ratio")]
    bound = next(v["real_text_check"]["bound"] for v in by.values() if v.get("real_text_check"))
    return (
        f"On this Xeon ({_on(rel)}) the report recommends **{rec['variant']}** (fastest at b1 on real text among "
        f"the variants meeting their bar, {_num(rec['p50_ms'])} ms), served under "
        f"{(r.get('long_text') or {}).get('fast', {}).get('policy')}: "
        + "; ".join(vs(o) for o in others)
        + f", in the same run. Every variant's real-text b1 path is within {_span(checks)}x of the fixed-shape "
        f"forward plus the text's tokenization (the report's real-text check; bound {bound:g}x)."
    )


def pipeline_fast_amd() -> str:
    """`make demo` after issue 30 on the AMD EPYC: wall time by stage, what it recommends and serves."""
    rel = "pipeline-fast-amd/report.json"
    r = _load(rel)
    st = r["pipeline"]["stage_s"]
    lt = r.get("long_text") or {}
    return (
        f"{_on(rel)}, {r['created'][:10]}: **{_minutes(st['total'])} min** wall ("
        + ", ".join(f"{k} {_minutes(v)}" for k, v in st.items() if k != "total")
        + f" min). Recommended **{r['recommended']['variant']}**, served policy "
        f"**{(lt.get('fast') or {}).get('policy')}** ({lt.get('why')})."
    )


def _met(ok: bool) -> str:
    return "target met" if ok else "target missed"


def _serve_overhead(d: str) -> str:
    """One serve-overhead report: served minus in-process at one client (two processes, one process, the bare
    server's floor), 32 clients served over in-process b32 (two processes; one process where measured), the
    server's CPU per request against the model's per text, and where a lone request's time goes."""
    rel = f"{d}/report.json"
    r = _load(rel)
    st = r["settings"]
    tgt = st["targets"]
    c1, c32, steps = [], [], []
    for v in r["variants"]:
        b, a = v["codes"]["before"], v["codes"]["after"]
        n = v["name"]
        one = v.get("same_process") or {}
        floor = (v.get("floor") or {}).get("overhead_ms")
        in_one = (
            f", {_num(one['overhead_ms'])} ms in one process where the bare uvloop + httptools server reads "
            f"{_num(floor)} ms (qserve {_num(one['overhead_ms'] - floor)} ms above it)"
            if one and floor is not None
            else ""
        )
        c1.append(
            f"{n} {_num(b['summary']['overhead_ms'])} -> **{_num(a['summary']['overhead_ms'])} ms** "
            f"({_met(a['summary']['overhead_ok'])}) across two processes{in_one}"
        )
        ca = a["served"]["levels"]["32"]
        c32.append(
            f"{n} {_x(b['summary']['throughput_ratio'])} -> **{_x(a['summary']['throughput_ratio'])}** "
            f"({_met(a['summary']['throughput_ok'])})"
            + (
                f" across two processes, **{_x(one['c32_ratio'])}** "
                f"({_met(one['c32_ratio'] >= tgt['throughput_ratio'])}) in one (rounds "
                + " / ".join(_num(x["c32_ratio"]) for x in one["rounds"])
                + ")"
                if one.get("c32_ratio")
                else ""
            )
            + f"; server CPU {_num(ca['server_cpu_ms_per_req'])} ms per request against "
            f"{_num(a['in_process']['b32']['cpu_ms_per_text'])} per text in process, mean batch "
            f"{_num(ca['mean_batch'], 1)}"
        )
        us = (v.get("steps") or {}).get("us") or {}
        if us:
            steps.append(
                f"{n}: "
                + ", ".join(
                    f"{k} {us[k]:,.0f}"
                    for k in (
                        "receive",
                        "queue wait",
                        "tokenize",
                        "inference",
                        "hop back",
                        "respond",
                        "outside the spans",
                    )
                    if k in us
                )
            )
    return (
        f"{_on(rel)}, {r['created'][:10]}, {st['rounds']} rounds, before = `{st['baseline_ref']}`, after = the "
        f"code of the run; targets <= {tgt['overhead_ms']:g} ms at one client and >= {tgt['throughput_ratio']:g}x "
        f"at 32. **One client**, served p50 minus in-process p50: " + "; ".join(c1) + ". **32 clients**, served "
        "req/s over in-process b32 texts/s: "
        + "; ".join(c32)
        + "."
        + (
            " **A lone request's steps** (the server's own trace spans, median microseconds): " + "; ".join(steps) + "."
            if steps
            else ""
        )
    )


def serve_overhead() -> str:
    return _serve_overhead("serve-overhead")


def serve_overhead_xeon() -> str:
    return _serve_overhead("serve-overhead-xeon")


def serving_lanes() -> str:
    """docs/serving.md: what lanes did at 32 clients, the before / after ratios of the Xeon's serve-overhead run."""
    rel = "serve-overhead-xeon/report.json"
    r = _load(rel)
    parts = [
        f"{v['name']} {_x(v['codes']['before']['summary']['throughput_ratio'])} -> "
        f"{_x(v['codes']['after']['summary']['throughput_ratio'])}"
        for v in r["variants"]
    ]
    return (
        "At 32 clients on 2 cores, served req/s over the in-process b32 texts/s went "
        + ", ".join(parts)
        + f" with lanes ({_on(rel)}, `make reports STAGE=serve-overhead-xeon`)."
    )


OV_FLOOR_TARGETS = {1: 2.0, 32: 1.6}
"""Issue 32's targets for ov-int8 over the int8 floor at b1 and b32 (targets, not measurements)."""


def _ov_hint() -> tuple[float, float, dict[str, Any], dict[str, Any]]:
    """ov-int8 exported with the bf16 hint against the default, ov-breakdown-xeon's rounds and agreement bench:
    (b1 time ratio, b32 time ratio, the default's agreement row, the hint's)."""
    by = {Path(v["variant"]).name: v for v in _load("ov-breakdown-xeon/report.json")["variants"]}
    v = by["ov-int8"]
    h = next(x for n, x in by.items() if n != "ov-int8" and x["name"] == "ov-int8")
    agree = {Path(x["dir"]).name: x for x in _load("ov-breakdown-xeon/agreement/report.json")["variants"]}
    return (
        h["timing"][h["b1_key"]]["p50_ms"] / v["timing"][v["b1_key"]]["p50_ms"],
        h["timing"][h["b32_key"]]["p50_ms"] / v["timing"][v["b32_key"]]["p50_ms"],
        agree["ov-int8"],
        agree[Path(h["variant"]).name],
    )


def ov_breakdown_xeon() -> str:
    """ov-int8 against the int8 floor on the AMX Xeon: the ratios, the bound with every GEMM at the peak, the
    per-node shares, the thread settings and the bf16 hint, one run's rounds."""
    rel = "ov-breakdown-xeon/report.json"
    r = _load(rel)
    f = r["flops"]
    by = {Path(v["variant"]).name: v for v in r["variants"]}
    v = by["ov-int8"]
    _, peak = peak_for(v["dtype"], r["peaks"]) or ("int8", float("nan"))
    floor1 = f["total"] / (peak * 1e9) * 1e3
    out = {}
    for b, key in ((1, v["b1_key"]), (32, v["b32_key"])):
        wall = v["timing"][key]["p50_ms"]
        bd = bound(wall, v["profiles"][f"b{b}"], f["linear"] * b / 1e9, peak)
        out[b] = (
            wall / (floor1 * b),
            bd["bound_ms"] / (floor1 * b),
            bd["gemm_share"],
            v["profiles"][f"b{b}"]["classes"].get(ATTENTION, {}).get("ms", 0) / v["profiles"][f"b{b}"]["wall_ms"],
        )
    t = v["timing"]
    above = out[1][1] > OV_FLOOR_TARGETS[1] and out[32][1] > OV_FLOOR_TARGETS[32]
    text = (
        f"{_on(rel)}, {r['created'][:10]}: the int8 peak measured in the run was {peak:,.0f} GOP/s. ov-int8 "
        f"b1/s128 **{_x(out[1][0])}** the int8 floor, b32/s128 **{_x(out[32][0])}** (targets "
        f"{_x(OV_FLOOR_TARGETS[1], 1)} / {_x(OV_FLOOR_TARGETS[32], 1)}). The int8 GEMMs "
        f"are {_pct(out[1][2], 0)} (b1) and {_pct(out[32][2], 0)} (b32) of the forward, the int8 attention "
        f"Subgraph {_pct(out[1][3], 0)} and {_pct(out[32][3], 0)}; with every GEMM at the peak and everything else "
        f"as measured the forward would still take **{_x(out[1][1])}** the floor at b1 and **{_x(out[32][1])}** "
        f"at b32"
        + (
            ": above both targets, so they need the attention and the elementwise work fused or made "
            "cheaper, not faster GEMMs"
            if above
            else ""
        )
        + ". Thread settings in the same rounds: b1 on one 2-thread stream "
        f"{_num(t['b1, one stream of 2 threads']['p50_ms'])} ms against "
        f"{_num(t['b1, one stream of 1 thread']['p50_ms'])} on one thread; b32 as the runtime runs it "
        f"{_num(t[v['b32_key']]['p50_ms'], 0)} ms against {_num(t['b32, one stream of 2 threads']['p50_ms'], 0)} "
        "on one 2-thread stream."
    )
    b1, b32, a, ah = _ov_hint()
    text += (
        f" ov-int8 exported with `--inference-precision bf16`, same rounds: b1 {_x(b1)} and b32 {_x(b32)} the "
        f"default's time; agreement with torch-fp32 on {a['accuracy']['n']:,} test reviews {_pct(a['agreement'])} "
        f"(default) and {_pct(ah['agreement'])} (bf16 hint), label flips alone vs batched "
        f"{a['invariance']['flips']} and {ah['invariance']['flips']} "
        f"({_on('ov-breakdown-xeon/agreement/report.json')})."
    )
    return text


def export_ov_bf16_hint() -> str:
    """docs/export.md: the bf16 hint's speed and agreement against ov-int8's default, from ov-breakdown-xeon."""
    b1, b32, a, ah = _ov_hint()
    return (
        f"Measured side by side ({_on('ov-breakdown-xeon/report.json')}, `make reports STAGE=ov-breakdown-xeon`): "
        f"b1/s128 {_x(b1)} and b32/s128 {_x(b32)} the default's time; agreement with torch-fp32 on "
        f"{a['accuracy']['n']:,} test reviews {_pct(a['agreement'])} (default) and {_pct(ah['agreement'])} (hint); "
        f"label flips alone vs batched {a['invariance']['flips']} and {ah['invariance']['flips']}."
    )


def distilbert_base_dims() -> str:
    """Speed at DistilBERT-base size: onnx-int8 against torch-fp32 and the int8 floor, one bench run."""
    rel = "distilbert-base-dims/report.json"
    r = _load(rel)
    by = {v["name"]: v for v in r["variants"]}
    i8, f32 = _shape(by["onnx-int8"], 1, 128), _shape(by["torch-fp32"], 1, 128)
    peak = r["floor"]["peaks"]["int8"]
    gflop = r["floor"]["flops_per_sequence"]["128"]["total"] / 1e9
    floor_ms = gflop / peak["gflops"] * 1e3
    return (
        f"{_on(rel)} (66M parameters, random weights, speed only): onnx-int8 **{_num(i8['p50'], 1)} ms** against "
        f"torch-fp32's {_num(f32['p50'], 1)} ms at b1/s128 (**{_x(f32['p50'] / i8['p50'])}**), "
        f"{_x(i8['p50'] / floor_ms)} the int8 compute floor ({_num(floor_ms, 1)} ms: {gflop:.1f} GFLOP at the "
        f"{peak['gflops']:,.0f} GOP/s int8 peak measured in the same run)."
    )


def int8_breakdown() -> str:
    """Where onnx-int8's time goes at DistilBERT-base dims, the other int8 graphs in quiet rounds, and what turning
    smoothing off costs in agreement on the embedded default."""
    rel, agree_rel = "int8-breakdown/report.json", "int8-breakdown/smooth-off-agreement/report.json"
    r = _load(rel)
    f, t, prof = r["flops"], r["timing"], r["profile"]
    floor = f["total"] / (r["peaks"]["int8"]["gflops"] * 1e9) * 1e3
    best = t["shipped onnx-int8"]["best_round_ms"]
    gemm = prof["classes"]["int8 GEMMs (with activation quantization)"]["ms"] * best / prof["profiled_ms_per_run"]
    attn = f["attention"] / (r["peaks"]["fp32"]["gflops"] * 1e9) * 1e3
    others = "; ".join(
        f"{name} {g['ratio_quiet']:.2f}x (best round {g['best_round_ms'] / floor:.2f}x the floor)"
        for name, g in t.items()
        if name != "shipped onnx-int8"
    )
    agree = {v["name"]: v for v in _load(agree_rel)["variants"]}
    plain = next(v for n, v in agree.items() if "nosmooth" in n)
    n = (plain.get("accuracy") or {}).get("n")
    return (
        f"{_on(rel)}, `benchmarks/int8_breakdown.py` (ORT's profiler, the other graphs timed interleaved; "
        f"{t['shipped onnx-int8']['quiet_rounds']} of {len(t['shipped onnx-int8']['rounds_ms'])} rounds quiet): "
        f"the int8 GEMM kernels take {_num(gemm, 1)} ms of the shipped graph's best round ({_num(best, 1)} ms, "
        f"{_x(best / floor)} the floor), {_x(gemm / floor)} the whole model's floor on their own; with fp32 "
        f"attention at the fp32 peak and every other op free it would be {_x((gemm + attn) / floor)}. Against the "
        f"shipped graph in quiet rounds: {others}. Without smoothing, onnx-int8 of the embedded default agrees "
        f"{_pct(plain['agreement'])} with fp32 on {n:,} test reviews, {_pct(agree['onnx-int8']['agreement'])} with "
        f"it ({_on(agree_rel)})."
    )


def crosscheck() -> str:
    """qserve bench against plain onnxruntime / torch loops, each variant judged by its median round."""
    rel = "crosscheck.json"
    r = _load(rel)
    ratios = ", ".join(
        f"{_num(x['ratio'])} {n} (qserve {_num(x['qserve_p50'], 1)} ms; per round {_span(x['round_ratios'])})"
        for n, x in r["rows"].items()
    )
    return (
        f"{_on(rel)}, {r['rounds']} rounds of plain-bench-plain: "
        f"median-round ratios (qserve / plain) {ratios}. {r['verdict']}"
    )


def serve_text() -> str:
    """Serving onnx-int8 on short sentences: overhead at one client, what batching buys at 32, against the model."""
    rel = "serve/serve_report.json"
    r = _load(rel)
    s, c, st = r["summary"], r["model_ceiling"], r["settings"]
    levels = {(k, lv["concurrency"]): lv for k in ("unbatched", "batched") for lv in r["runs"][k]["levels"]}
    hi = levels[("batched", st["concurrency_high"])]
    mism = sum(lv["mismatched"] for lv in levels.values())
    return (
        f"{_on(rel)}, {r['created'][:10]}, {st['duration_s']:g} s per level: {_num(s['overhead_c1_ms'])} ms of "
        f"HTTP + queue over the model's own b1 ({_num(s['model_b1_p50_ms'])} ms) at concurrency 1; {mism} "
        f"mismatched answers at c1 and c{st['concurrency_high']} with batching on and off; dynamic batching gave "
        f"**{_x(s['throughput_ratio'])}** throughput at c{st['concurrency_high']} "
        f"({_num(s['rps_high_batched'], 1)} vs {_num(s['rps_high_unbatched'], 1)} req/s) against a ceiling of "
        f"{_x(s['ratio_bound'])} that run allowed (the model alone, {_num(c['texts_per_s_batched'], 1)} texts/s "
        f"at b{c['batch']}, over the unbatched server), p99 {_num(hi['p99_ms'], 0)} ms, "
        f"{_num(s['mean_batch_high_batched'], 1)} texts a forward. Served c{st['concurrency_high']} is "
        f"{_x(s['rps_high_batched'] / c['texts_per_s_batched'])} the model alone at b{c['batch']} (which computed "
        f"{_num(c['texts_per_s_b1'], 1)} texts/s at batch 1)."
    )


def serve_protocols() -> str:
    """The same texts through every protocol, alone and concurrently; /v1 c32 new over old."""
    rel = "serve-protocols/report.json"
    r = _load(rel)
    a, t = r["answers"], r["throughput"]
    same = all(x[k]["bit_identical"] == a["texts"] for x in a["by_protocol"].values() for k in ("alone", "concurrent"))
    rounds = t["summary"]["rps_ratio_per_round"]
    return (
        f"{_on(rel)}: {a['texts']} real reviews through "
        + ", ".join(a["by_protocol"])
        + f", alone and {a['workers']} in flight: "
        + (f"{a['texts']}/{a['texts']} bit-identical on every protocol" if same else "answers differ, see the report")
        + f"; /v1 c{t['concurrency']} new / old ({r['old_ref']}) {_x(t['summary']['rps_ratio_new_over_old'], 3)} "
        f"median ({_span(rounds, 3)} over {t['rounds']} rounds)."
    )


def predict_text() -> str:
    """`qserve predict` over the corpus: rows/s against the in-process ceiling, memory, Ray Data."""
    rel = "predict/report.json"
    r = _load(rel)
    loc, ra = r["local"], r["ratios"]
    r1, r2 = r["ray_1_node"], r["ray_2_nodes"]
    return (
        f"{_on(rel)}: all {r['rows']:,} reviews with {Path(r['variant']).name} ({r['long_text']}): local "
        f"{_num(loc['rows_per_s'], 1)} rows/s = {_x(ra['local_vs_ceiling'])} the in-process b32 ceiling "
        f"({_num(r['ceiling']['rows_per_s'], 1)}), peak RSS {loc['peak_rss_mib']:,.0f} MiB = "
        f"{_x(ra['rss_big_vs_small'], 3)} the {r['small_rows']:,}-row run; Ray Data on 1 node "
        f"{_num(r1['rows_per_s'], 1)} rows/s ({_x(ra['ray_1_node_vs_local'])} local), a {r2['nodes']}-node "
        f"cluster on this machine {_num(r2['rows_per_s'], 1)} rows/s ("
        + " / ".join(f"{n:,}" for n in r2["rows_per_node"].values())
        + " rows per node)."
    )


def checkpoint_cost_text() -> str:
    """One resumable checkpoint's cost per precision, as a sentence (the table is checkpoint-cost)."""
    rel = "checkpoint_cost/checkpoint_cost.json"
    r = _load(rel)
    runs = r["runs"]
    share = _span([x["share_at_default_interval"] * 100 for x in runs])
    return (
        f"{_on(rel)}: "
        + " / ".join(_num(x["wall_s_median"]) for x in runs)
        + " s per resumable checkpoint ("
        + " / ".join(x["precision"] for x in runs)
        + f"), {share}% of training at the default ~5-minute interval "
        "(goal < 2%)."
    )


def _amx(rel: str) -> str:
    """`" (AMX)"` where a report's provenance says its CPU has AMX: what makes bf16 native on a Xeon."""
    return " (AMX)" if (_load(rel).get("provenance") or {}).get("amx") else ""


def main_job_precision_probe() -> str:
    """docs/training.md: the line `--precision auto` printed in the main job, and the CPU probe's timings behind it."""
    rel = f"{MAIN_JOB}/report.json"
    c = _train(MAIN_JOB)["precision_choice"]
    pr = c.get("probe") or {}
    return (
        f"In the main job (`make demo`'s pipeline, {_on(rel)}) the choice read `precision: {c['precision']} "
        f"({c['reason']})`: the probe's "
        f"block ({pr.get('block')}, {pr.get('threads')} threads) took {_num(pr['bf16_mixed_s'] * 1e3, 1)} ms "
        f"under bf16 autocast against {_num(pr['fp32_s'] * 1e3, 1)} ms in fp32."
    )


def _study_runs(r: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {run["label"]: run for run in r["runs"] if run.get("ok")}


def precision_findings() -> str:
    """docs/training.md: the precision study's accuracy against its seed noise, and its step times three ways."""
    rel = "precision/precision_study.json"
    r = _load(rel)
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
        f"{_on(rel)}{_amx(rel)}, {cfg['max_samples']:,} reviews, {epochs}, "
        f"{first['sizes']['val']:,} val / {first['sizes']['test']:,} test, one process per run: test accuracy "
        + ", ".join(
            f"{x['label']} **{_pct(x['test_accuracy'])}**"
            if x["precision"] == "bf16-true"
            else f"{x['label']} {_pct(x['test_accuracy'])}"
            for x in runs.values()
            if x is not seed2
        )
        + f"; a second {noise['label']} seed read {_pct(seed2['test_accuracy'])}, so run-to-run noise is "
        f"{noise['test_accuracy_abs_diff'] * 100:.2f} points. Against {noise['label']}: {gaps}. Step time in "
        f"{r['step_rounds']['rounds']} interleaved rounds after the full runs: {mixed['label']} "
        f"{_x(mixed['step_interleaved_vs_32_true'])} of 32-true; {comp['label']} "
        f"**{_x(comp['step_interleaved_vs_bf16_mixed'])}** of {mixed['label']} by median step, "
        f"{_x(comp['step_round_ratio_median_vs_bf16_mixed'])} as the median of its per-round ratios ("
        + " / ".join(_num(x) for x in comp["step_round_ratios_vs_bf16_mixed"])
        + f"); {plain['label']} {_x(plain['step_interleaved_vs_bf16_mixed'])}. The sequential full runs, minutes "
        f"apart, read {comp['label']} at {_x(comp['step_time_median_s'] / mixed['step_time_median_s'])} "
        f"{mixed['label']}'s median step, on a machine whose speed drifts between runs (the two {mixed['label']} "
        f"seeds: {_num(mixed['step_time_median_s'], 3)} and {_num(seed2['step_time_median_s'], 3)} s)."
    )


def optimizer_step() -> str:
    """docs/training.md: each precision's optimizer step alone (benchmarks/optimizer_step.py), against fp32 AdamW."""
    rel = "precision/optimizer_step.json"
    r = _load(rel)
    ms = {k: v["median"] for k, v in r["ms"].items()}

    def one(*words: str, foreach: bool = False) -> float:
        return next(v for k, v in ms.items() if all(w in k for w in words) and ("foreach" in k) == foreach)

    fp32, plain, kahan = one("fp32 weights"), one("bf16 weights, torch"), one("bf16 weights, optimi")
    return (
        f"{_on(rel)}{_amx(rel)}, the {r['parameters']:,} parameters of the embedded model, {r['rounds']} "
        f"interleaved rounds, {r['threads']} threads: optimi's Kahan AdamW on bf16 weights {_num(kahan, 1)} ms "
        f"({_x(kahan / fp32)}), torch's AdamW on bf16 weights {_num(plain, 1)} ms ({_x(plain / fp32)}), against "
        f"{_num(fp32, 1)} ms for torch's AdamW on fp32 weights; their foreach paths on bf16 weights "
        f"{_num(one('bf16 weights, optimi', foreach=True), 1)} ms (optimi) and "
        f"{_num(one('bf16 weights, torch', foreach=True), 1)} ms (torch)."
    )


def _protocol_cost(d: str) -> str:
    rel = f"{d}/report.json"
    r = _load(rel)
    b, a = r["median"]["before"], r["median"]["after"]
    rows = [
        [
            TITLES[k],
            _num(b[k]["event_loop_cpu_ms_per_req"]),
            f"**{_num(a[k]['event_loop_cpu_ms_per_req'])}**",
            _num(b[k]["p50_ms"], 1),
            _num(a[k]["p50_ms"], 1),
            f"{a[k]['errors']}, {a[k]['label_mismatches_vs_v1']}",
        ]
        for k in ROUTES
        if k in a
    ]
    head = [
        "route",
        f"event-loop CPU ms/req before ({r['baseline_ref']})",
        "after",
        "p50 ms before",
        "after",
        "errors, label mismatches vs /v1",
    ]
    return (
        f"{r['rounds']} rounds of {r['duration_s']:g} s per route at one client, {r['created'][:10]}:\n\n"
        + _table(head, rows)
        + _src(rel)
    )


def serve_protocol_cost() -> str:
    return _protocol_cost("serve-protocol-cost")


def serve_protocol_cost_xeon() -> str:
    return _protocol_cost("serve-protocol-cost-xeon")


def openvino() -> str:
    """OpenVINO against onnx-int8, one process, rounds interleaved: the embedded default and DistilBERT-base dims,
    and the served comparison."""
    rel, dims_rel = "openvino/embedded-default/report.json", "openvino/distilbert-base-dims/report.json"
    r, dims = _load(rel), _load(dims_rel)
    sp, q = r["speed"], r["quality"]
    parts = [
        f"{n} {_x(sp[n]['b1_p50_vs_baseline'])} / {_x(sp[n]['b32_vs_baseline'])} / {_pct(q[n]['agreement'])}"
        for n in sp
        if n.startswith("ov-")
    ]
    ds = dims["speed"]["ov-int8"]
    goals = [c for c in r["goals"]["checks"] if c["name"].startswith("ov-int8 ")]
    srv = {n: _load(f"serve-openvino/{n}/serve_report.json")["summary"] for n in ("onnx-int8", "ov-int8")}
    return (
        f"{_on(rel)}, {r['config']['rounds']} interleaved rounds, agreement with torch-fp32 on "
        f"{q['onnx-int8']['n']:,} test reviews. Against onnx-int8 (b1/s128 p50 / b32/s128 throughput / "
        "agreement): "
        + "; ".join(parts)
        + "; ov-int8 against the goals: "
        + ", ".join(f"{c['target']} ({'met' if c['passed'] else 'missed'})" for c in goals)
        + f"; onnx-int8 itself agreed {_pct(q['onnx-int8']['agreement'])} on "
        f"this checkpoint. At DistilBERT-base dims ({_on(dims_rel)}, random weights): ov-int8 "
        f"{_x(ds['b1_p50_vs_baseline'])} / {_x(ds['b32_vs_baseline'])} onnx-int8. Served on short sentences "
        f"({_on('serve-openvino/ov-int8/serve_report.json')}, two back-to-back runs, batching on): ov-int8 "
        f"{_num(srv['ov-int8']['rps_high_batched'], 1)} against onnx-int8's "
        f"{_num(srv['onnx-int8']['rps_high_batched'], 1)} req/s at c32 "
        f"({_x(srv['ov-int8']['rps_high_batched'] / srv['onnx-int8']['rps_high_batched'])})."
    )


def export_ov_invariance() -> str:
    """docs/export.md: each OpenVINO variant's (and onnx-int8's, batched) answers alone vs in batches of 32."""
    rel = "openvino/embedded-default/report.json"
    q = _load(rel)["quality"]
    n = next(iter(q.values()))["invariance"]["n"]
    parts = []
    for name, x in q.items():
        if name in ("ov-int8", "ov-fp32", "ov-bf16", "onnx-int8"):
            inv = x["invariance"]
            parts.append(
                (f"{name} {inv['max_abs_dprob']:.1e}" if inv["max_abs_dprob"] else f"{name} 0")
                + (f" ({inv['label_flips']} flips)" if inv["label_flips"] else "")
            )
    return (
        f"Measured on the embedded default ({_on(rel)}, {n} test reviews alone vs in batches of 32, max "
        f"|Δprob|): " + ", ".join(parts) + " (onnx-int8 when it still ran batched)."
    )


def serve_buckets() -> str:
    """Length buckets, gRPC and tracing served: ratios of req/s, every server at once, rounds interleaved."""
    rel = "serve-buckets/report.json"
    r = _load(rel)
    s, st = r["summary"], r["settings"]

    def cell(x: dict[str, Any] | None) -> str:
        return "–" if not x or x["ratio"] is None else f"{x['ratio']:.2f}x ({_span(x['rounds'])})"

    rows = [
        [
            tail.split(" | ")[0],
            tail.split(" | ")[1][1:],
            cell(c["ov_buckets_over_onnx_int8"]),
            cell(c["ov_buckets_over_ov_padded"]),
            cell(c["grpc_over_http"]),
            cell(c["tracing_off_over_baseline"]),
        ]
        for tail, c in s["comparisons"].items()
    ]
    head = [
        "texts",
        "conc",
        "ov-int8 buckets / onnx-int8",
        "ov-int8 buckets / ov-int8 padded",
        "gRPC / HTTP (ov-int8)",
        f"onnx-int8 today / at {st['baseline_ref']}",
    ]
    return (
        f"{st['rounds']} interleaved rounds of {st['duration_s']:g} s per cell, threads {st['threads']}; errors / "
        f"lost / mismatched answers over every cell: {s['errors']} / {s['lost']} / {s['mismatched']}. Ratios of "
        "req/s (per-round range in brackets):\n\n" + _table(head, rows) + _src(rel)
    )


def lifecycle() -> str:
    """Several models per server: shadowing's throughput cost, a hot swap's latency and memory."""
    rel = "lifecycle/report.json"
    r = _load(rel)
    s, st, sh = r["summary"], r["settings"], r["shadow_state"]
    during = [x["latency"]["during"]["p99_ms"] for x in r["swap_rounds"]]
    return (
        f"{_on(rel)}, {r['created'][:10]}: shadowing at rate {st['shadow_rate']:g} costs "
        f"**{_pct(s['shadow_cost'], 1)}** of the throughput at {st['concurrency']} clients "
        f"({_num(s['rps_plain'], 1)} vs {_num(s['rps_shadowed'], 1)} req/s, {sh['samples']:,} texts re-scored, "
        f"{sh['dropped']} dropped, rolling agreement {_pct(sh['agreement'], 0)}); a hot swap "
        f"({_num(s['swap_load_s'])} s to load, warm, switch and release) moves p99 at {st['swap_concurrency']} "
        f"clients from {_num(s['swap_p99_before_ms'], 1)} to {_num(s['swap_p99_during_ms'], 1)} ms while it runs "
        f"({_span(during, 0)} ms over the {len(during)} swaps), with {s['errors']} errors and "
        f"{s['other_versions']} answers naming a version other than the old or the new; server RSS "
        f"{s['rss_before_mb']:,.0f} MiB before, {s['rss_peak_during_mb']:,.0f} at the peak, "
        f"{s['rss_after_mb']:,.0f} after."
    )


def byo_bert() -> str:
    """A BertForSequenceClassification brought as it is: export --all, agreement per variant, the served answer."""
    rel, bench_rel = "byo-bert/report.json", "byo-bert/bench/report.json"
    r, b = _load(rel), _load(bench_rel)
    ag = r["agreement"]
    order = sorted(ag, key=lambda n: -ag[n]["agreement"])
    rec = b["recommended"]
    by = {v["name"]: v for v in b["variants"]}
    return (
        f"{_on(rel)}: trained on {r['max_samples']:,} reviews ({r['long_text']}), test accuracy "
        f"{_pct(r['test_accuracy'])}; `qserve export --all` exit {r['export']['exit']}, {len(ag)} variants; "
        f"agreement with the checkpoint's fp32 on the {r['samples']:,} test reviews: "
        + ", ".join(
            f"{n} {_pct(ag[n]['agreement'])}" + (f" (bar {_pct(BAR[n], 0)})" if n in BAR else "") for n in order
        )
        + f". The served {r['serve']['variant']} answer {'equals' if r['serve']['match'] else 'differs from'} the "
        f"in-process one; the variants' bench (`byo-bert/bench/`) recommends {rec['variant']} (b1 on real texts "
        f"{_num(rec['p50_ms'], 1)} ms median, {_x(by[rec['variant']]['speedup_vs_torch_fp32'], 1)} torch-fp32's "
        "speed at b1/s128)."
    )


def _int8_candidates(r: dict[str, Any]) -> tuple[str, str, str]:
    """(batched, row by row, ...) names of the int8-invariance report: today's graph batched and row by row."""
    names = list(r["timing"])
    batched = next(n for n in names if n.startswith("today's graph, batched"))
    rows = next(n for n in names if n.startswith("today's graph, row by row"))
    return batched, rows, next(n for n in names if n.startswith("static QDQ"))


def int8_invariance_picked() -> str:
    """Why today's graph run row by row was picked, in the report's own numbers."""
    rel = "int8-invariance/embedded-default/report.json"
    r = _load(rel)
    ag, t = r["agreement"], r["timing"]
    batched, rows, qdq = _int8_candidates(r)
    nbits = next(n for n in t if n.startswith("MatMulNBits"))
    amd = {v["name"]: v for v in _load("embedded-default-full-test/report.json")["variants"]}["onnx-int8"]
    return (
        f"In this run ({_on(rel)}) served alone its texts agree with fp32 more often than batched "
        f"({_pct(ag[rows]['agreement'])} vs {_pct(ag[batched]['agreement'])}: the padded batch's shared scale "
        f"costs accuracy too); MatMulNBits is {_x(t[nbits]['b1_ratio_to_today'])} today's graph's b1 time; static "
        f"per-tensor scales lose {(ag[rows]['agreement'] - ag[qdq]['agreement']) * 100:.1f} points of agreement. "
        f"`{batched}` agreed {_pct(ag[batched]['agreement'])} in batches of 32, not the "
        f"{_pct(amd['agreement'])} of the AMD run's onnx-int8 "
        f"({_on('embedded-default-full-test/report.json')}: another checkpoint, another machine)."
    )


def rows_side_by_side_text() -> str:
    """What running a batch's rows side by side bought over the one batched forward, and what that forward moved."""
    rel = "int8-invariance/rows-side-by-side/report.json"
    r = _load(rel)
    texts = next(iter(r["sets"]))
    big = max(r["batches"])

    def rate(mode: str) -> float:
        return r["rates"][f"{texts}|b{big}|{mode}"]["texts_per_s"]

    gain = rate("rows, side by side") / rate("batched")
    return (
        f"Side by side beats even the batched forward it replaced here ({_x(gain)} on {texts} at b{big}, "
        f"{_on(rel)}), which also moved a probability by up to "
        f"{r['max_abs_dprob_vs_alone']['batched']:.2g}; both row modes moved nothing."
    )


def int8_invariance_base_dims() -> str:
    """The same candidates at DistilBERT-base dims: b1 against today's batched graph, b32 throughput, invariance."""
    rel = "int8-invariance/distilbert-base-dims/report.json"
    r = _load(rel)
    t, inv = r["timing"], r["invariance"]
    batched, rows, _ = _int8_candidates(r)
    emb = _load("int8-invariance/embedded-default/report.json")["timing"]
    eb, er, _ = _int8_candidates({"timing": emb})
    others = ", ".join(
        f"{n} {_x(x['b1_ratio_to_today'], 3)}" for n, x in t.items() if n not in (batched, rows, "onnx-fp32")
    )
    moved = [n for n, x in inv.items() if x["max_abs_dprob"] and n != batched]
    return (
        f"{_on(rel)}, {r['rounds']} interleaved rounds (random weights, speed and invariance only): today's graph "
        f"run row by row read **{_x(t[rows]['b1_ratio_to_today'], 3)}** its batched self at b1/s128 "
        f"({_num(t[rows]['b1_p50_ms'])} vs {_num(t[batched]['b1_p50_ms'])} ms); {others}. On real reviews at b32 "
        f"row by row gives up throughput ({_num(t[rows]['real_b32_texts_per_s'], 1)} vs "
        f"{_num(t[batched]['real_b32_texts_per_s'], 1)} texts/s, "
        f"{_x(t[rows]['real_b32_texts_per_s'] / t[batched]['real_b32_texts_per_s'])}), the price of exact answers, "
        f"as on the embedded default ({_num(emb[er]['real_b32_texts_per_s'], 1)} vs "
        f"{_num(emb[eb]['real_b32_texts_per_s'], 1)}). Batched, today's graph moved a probability by up to "
        f"{inv[batched]['max_abs_dprob']:.1e} there; "
        + ("every other candidate by 0." if not moved else "also moved: " + ", ".join(moved) + ".")
    )


def serve_ray_sizing() -> str:
    """docs/serving.md's cost and sizing: Ray Serve's proxy hop, one replica against uvicorn, per-replica rates."""
    rel = "serve-ray/report.json"
    r = _load(rel)
    s, cells = r["summary"], r["summary"]["cells"]
    triv = s["trivial_c32-t1"]
    hop = triv["ms_per_request_ray"] - triv["ms_per_request_uvicorn"]
    per2, per1 = cells["ray-1"]["c32-t1"]["rps"], cells["ray-2"]["c32-t1"]["rps"] / 2
    diff = max(c["max_score_diff"] for e in cells.values() for c in e.values())
    return (
        f"({_on(rel)}, quiet, one interleaved run, onnx-int8 row by row on real reviews): every engine answers "
        f"every text identically (max score difference {diff:g}). Ray's proxy hop costs {_num(hop, 1)} ms of CPU "
        f"per request (trivial app: {_num(triv['ray_rps'], 0)} vs {_num(triv['uvicorn_rps'], 0)} req/s under plain "
        f"uvicorn at c32). At concurrency 32, one Ray replica keeps {_num(s['ray1_over_uvicorn_c32-t1'])} of "
        f"uvicorn's throughput with 1 text per request and {_num(s['ray1_over_uvicorn_c32-t32'])} with 32; at "
        f"concurrency 1, {_num(s['ray1_over_uvicorn_c1-t1'])} (the hop's latency). Measured here: "
        f"{_num(per2, 0)} req/s per 2-core replica ({_num(per1, 0)} per 1-core replica) at c32, plus the hop's "
        f"{_num(hop, 1)} ms of proxy CPU per request."
    )


LONG_TEXT_BARS = {"fast": 0.86, "windows": 0.875, "full windows": 0.90}
"""Issue 28's bars for the long-text policies (targets, not measurements): the served default on the pipeline's
recipe, windows on it, windows on all the data."""


def _long_text_runs() -> dict[str, tuple[dict[str, dict[str, Any]], dict[str, Any], dict[str, Any]]]:
    """{report dir: (its policies, its long_text choice, its train_metrics)} of the three long-text checkpoints."""
    out = {}
    for d, _ in LONG_TEXT_RUNS:
        r = _load(f"{d}/report.json")
        out[d] = (_policies(r), r.get("long_text") or {}, _train(d))
    return out


def long_text_default() -> str:
    """docs/long-texts.md: the training default, chosen on validation between the checkpoints trained each way."""
    runs = _long_text_runs()
    head_t, ht_t = runs["long-text-head"][2], runs["long-text"][2]
    return (
        f"**The training default is chosen on validation:** head-tail read **{_pct(ht_t['val_accuracy'])}** on "
        f"the {ht_t['sizes']['val']:,} validation reviews, against **{_pct(head_t['val_accuracy'])}** for head "
        f"(the same recipe trained each way: the train_metrics.json of {_on('long-text/report.json')} and of "
        f"{_on('long-text-head/report.json')}). So `qserve train` and `qserve pipeline` train with `head-tail` "
        "(`head-tail:64` at 128 tokens)."
    )


def long_text_findings() -> str:
    """docs/long-texts.md: the policies against the issue's bars, the head-trained checkpoint, the full data, and
    windows against the ceiling their window count sets."""
    runs = _long_text_runs()
    acc = {d: {p: x["accuracy"] for p, x in pol.items()} for d, (pol, _, _) in runs.items()}
    ht_p, ht_lt, ht_t = runs["long-text"]
    head_lt, full_t = runs["long-text-head"][1], runs["long-text-full"][2]
    win = next(p for p in ht_p if p.startswith("windows"))
    ht = next(p for p in ht_p if p.startswith("head-tail"))
    fast, hfast = ht_lt["fast"]["policy"], head_lt["fast"]["policy"]
    gains = [(acc["long-text-full"][p] - acc["long-text"][p]) * 100 for p in acc["long-text"]]
    ratios = [
        pol[win]["texts_per_s"] / (pol["head"]["texts_per_s"] / pol[win]["mean_windows"]) for pol, _, _ in runs.values()
    ]
    seed = next(r["test_accuracy"] for r in SEED["runs"] if r["precision"] == "bf16-mixed" and r["matmul"] == "highest")
    return (
        f"- Against the issue's bars, on the pipeline's recipe (trained head-tail): the served default (`fast`: "
        f"{fast}, the most accurate at >= half head's texts/s) reads **{_pct(acc['long-text'][fast])}** (bar "
        f"{_pct(LONG_TEXT_BARS['fast'], 1)}); windows read **{_pct(acc['long-text'][win])}** (bar "
        f"{_pct(LONG_TEXT_BARS['windows'], 1)}).\n"
        f"- The same recipe trained with `head` reads **{_pct(acc['long-text-head'][win])}** with windows, "
        f"{_pct(acc['long-text-head'][hfast])} under its own `fast` policy ({hfast}) and "
        f"{_pct(acc['long-text-head']['head'])} under head. Training picks its policy on validation, never on "
        f"test, so the default stays head-tail: under the policy most servers run ({fast}) it reads "
        f"{_pct(acc['long-text'][fast])} against {_pct(acc['long-text-head'][fast])}, under {ht} "
        f"{_pct(acc['long-text'][ht])} against {_pct(acc['long-text-head'][ht])}, and windows recover most of the "
        "rest.\n"
        f"- **All the data** ({full_t['sizes']['train']:,} training reviews, "
        f"{len(full_t['val_accuracy_per_epoch'])} epochs, head-tail; {_minutes(full_t['train_time_s'])} min of "
        "training on 2 cores, validation "
        + ", ".join(f"{_pct(v)} after epoch {i}" for i, v in enumerate(full_t["val_accuracy_per_epoch"], 1))
        + f"): **{_pct(acc['long-text-full'][win])}** with windows (goal >= "
        f"{_pct(LONG_TEXT_BARS['full windows'], 0)}), "
        + ", ".join(f"{_pct(acc['long-text-full'][p])} {p}" for p in acc["long-text-full"] if p != win)
        + f": {_span(gains)} points over the {ht_t['sizes']['train']:,}-review recipe per policy. The seed "
        f"study's DistilBERT-base read {_pct(seed, 1)} (`SEED` in qserve/training/study.py, not measured "
        "by qserve): a model three times larger, trained on more reviews.\n"
        f"- Windowed texts/s in the bench's own loop (`predict()` in batches of 32) is {_span(ratios)}x the "
        "ceiling its window count sets (head's texts/s / windows per text); served, below, the server keeps "
        "all of it." + _src(*[f"{d}/report.json" for d, _ in LONG_TEXT_RUNS])
    )


BENCH_DECIDING = ("embedded-default", "pipeline-fast-amd", MAIN_JOB)
"""The pipeline reports whose bench scores a deciding variant on all its eval texts (after issue 30)."""


def bench_eval_cut() -> str:
    """docs/bench.md's reason for 1,000 texts: where the int8 variants sit, and how far apart the policies are."""
    sits = []
    for d in BENCH_DECIDING:
        r = _load(f"{d}/report.json")
        n = r["config"]["max_eval_samples"]
        sits += [
            f"{v['name']} {_pct(v['agreement'], 1)} (`{d}/`, {_cpu(f'{d}/report.json')})"
            for v in r["variants"]
            if v["status"] == "ok" and "int8" in v["name"] and (v.get("accuracy") or {}).get("n") == n
        ]
    lt_rel = "long-text/report.json"
    pol = _policies(_load(lt_rel))
    n_lt = next(iter(pol.values())).get("n")
    order = sorted(pol, key=lambda p: -pol[p]["accuracy"])
    return (
        "The int8 variants scored on all 1,000 reviews of a pipeline report read: "
        + ", ".join(sits)
        + ". Policy accuracies differ by points ("
        + " vs ".join(f"{p} {_pct(pol[p]['accuracy'])}" for p in order)
        + f" on {n_lt:,} reviews, {_on(lt_rel)})."
    )


def export_smoothing() -> str:
    """docs/export.md: what smoothing buys in agreement on the embedded default, and costs at DistilBERT-base dims."""
    agree_rel, rel = "int8-breakdown/smooth-off-agreement/report.json", "int8-breakdown/report.json"
    agree = {v["name"]: v for v in _load(agree_rel)["variants"]}
    plain = next(v for n, v in agree.items() if "nosmooth" in n)
    off = _load(rel)["timing"]["smooth off"]
    return (
        f"On the embedded default onnx-int8 agrees {_pct(agree['onnx-int8']['agreement'])} with fp32 on "
        f"{plain['accuracy']['n']:,} test reviews with smoothing and {_pct(plain['agreement'])} without "
        f"({_on(agree_rel)}); at DistilBERT-base dims the graph without smoothing ran at "
        f"{_x(off['ratio_quiet'])} the shipped graph's time in quiet rounds ({_on(rel)})."
    )


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
    "pipelines-by-cpu": pipelines_by_cpu,
    "embedded-default-amd-run": embedded_default_amd_run,
    "embedded-default-run": embedded_default_run,
    "embedded-default-choice": embedded_default_choice,
    "pipeline-fast-amd": pipeline_fast_amd,
    "serve-overhead": serve_overhead,
    "serve-overhead-xeon": serve_overhead_xeon,
    "serving-lanes": serving_lanes,
    "ov-breakdown-xeon": ov_breakdown_xeon,
    "export-ov-bf16-hint": export_ov_bf16_hint,
    "distilbert-base-dims": distilbert_base_dims,
    "int8-breakdown": int8_breakdown,
    "crosscheck": crosscheck,
    "serve-text": serve_text,
    "serve-protocols": serve_protocols,
    "predict": predict_text,
    "checkpoint-cost-text": checkpoint_cost_text,
    "main-job-precision-probe": main_job_precision_probe,
    "precision-findings": precision_findings,
    "optimizer-step": optimizer_step,
    "serve-protocol-cost": serve_protocol_cost,
    "serve-protocol-cost-xeon": serve_protocol_cost_xeon,
    "openvino": openvino,
    "export-ov-invariance": export_ov_invariance,
    "serve-buckets": serve_buckets,
    "lifecycle": lifecycle,
    "byo-bert": byo_bert,
    "int8-invariance-picked": int8_invariance_picked,
    "rows-side-by-side-text": rows_side_by_side_text,
    "int8-invariance-base-dims": int8_invariance_base_dims,
    "serve-ray-sizing": serve_ray_sizing,
    "long-text-default": long_text_default,
    "long-text-findings": long_text_findings,
    "bench-eval-cut": bench_eval_cut,
    "export-smoothing": export_smoothing,
}


UNITS = r"(?:ms|s|min|h|%|x|×|MB|MiB|GB|GiB|KB|req/s|texts/s|rows/s|seq/s|sequences/s|samples/s|GOP/s|points)"
NUMBER = r"\d[\d,]*(?:\.\d+)?"
# A figure with a unit (a range counts once: "0.97-1.06x"), one in scientific notation (an error, a Δprob) or
# with three decimals or more (an F1, a threshold, a logit error); not a version (1.45.2) or a date.
HAND_NUMBER = re.compile(
    rf"(?<![\w.,/-])(?:{NUMBER}(?:\s?[-–]\s?{NUMBER})?\s?{UNITS}(?![\w/])|{NUMBER}e-?\d+"
    rf"|\d+\.\d{{3,}}(?!\d|\.\d))"
)
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
        ind = m["indent"]
        body = "\n".join(ind + line if line else line for line in rendered[name].split("\n"))
        return f"{ind}<!-- {m['kind']}:{name} -->\n{body}\n{ind}<!-- /{m['kind']} -->"

    return MARKER.sub(sub, text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 with a diff if any table is stale")
    p.add_argument(
        "--hand-numbers",
        action="store_true",
        help="print the measured-looking numbers typed in prose, one `FILE<TAB>NUMBER` line each (the "
        "format of tests/unit/docs_numbers.txt); write nothing",
    )
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
            sys.stdout.writelines(
                difflib.unified_diff(
                    text.splitlines(True),
                    new.splitlines(True),
                    f"{path} (committed)",
                    f"{path} (from the reports' JSON)",
                )
            )
        else:
            path.write_text(new, encoding="utf-8")
            print(f"updated {path}")
    if stale:
        print(
            f"\n{len(stale)} file(s) hold tables that disagree with their reports' JSON: "
            f"{', '.join(map(str, stale))}; run `python -m benchmarks.render_tables`",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
