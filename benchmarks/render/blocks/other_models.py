"""Models other than the embedded sentiment classifier: the multi-label checkpoints qserve trained and gated
(per-label thresholds against one 0.5), and a BertForSequenceClassification brought as it is through export --all,
agreement, bench and serving.

    python -c "from benchmarks.render.blocks.other_models import byo_bert; print(byo_bert())"
"""

from __future__ import annotations

from benchmarks.render.blocks.cells import num, pct, ratio, table
from benchmarks.render.blocks.reports import load, on, rendered_from
from benchmarks.studies.byo_bert import BAR


def gate_multilabel() -> str:
    """docs/gate.md: per-label thresholds against one 0.5 on the two multi-label models qserve trained and gated."""
    rels = ["gate-multilabel/gate.json", "gate-multilabel-aspects/gate.json"]
    rows = []
    for rel in rels:
        r = load(rel)
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
    return table(head, rows, ["---", "---", "---:", "---:", "---:", "---", "---"]) + rendered_from(*rels)


def byo_bert() -> str:
    """A BertForSequenceClassification brought as it is: export --all, agreement per variant, the served answer."""
    rel, bench_rel = "byo-bert/report.json", "byo-bert/bench/report.json"
    r, b = load(rel), load(bench_rel)
    ag = r["agreement"]
    order = sorted(ag, key=lambda n: -ag[n]["agreement"])
    rec = b["recommended"]
    by = {v["name"]: v for v in b["variants"]}
    return (
        f"{on(rel)}: trained on {r['max_samples']:,} reviews ({r['long_text']}), test accuracy "
        f"{pct(r['test_accuracy'])}; `qserve export --all` exit {r['export']['exit']}, {len(ag)} variants; "
        f"agreement with the checkpoint's fp32 on the {r['samples']:,} test reviews: "
        + ", ".join(f"{n} {pct(ag[n]['agreement'])}" + (f" (bar {pct(BAR[n], 0)})" if n in BAR else "") for n in order)
        + f". The served {r['serve']['variant']} answer {'equals' if r['serve']['match'] else 'differs from'} the "
        f"in-process one; the variants' bench (`byo-bert/bench/`) recommends {rec['variant']} (b1 on real texts "
        f"{num(rec['p50_ms'], 1)} ms median, {ratio(by[rec['variant']]['speedup_vs_torch_fp32'], 1)} torch-fp32's "
        "speed at b1/s128)."
    )
