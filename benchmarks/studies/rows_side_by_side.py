"""How a row-by-row variant (onnx-int8) should run a batch: one forward, rows one at a time, or side by side.

    python -m benchmarks.studies.rows_side_by_side models/minilm-l6-distilbert-imdb/variants/onnx-int8

One process, one variant, three runtimes on it, taking turns round by round:
- batched: the graph forwarded once per batch (RuntimeOptions(batch_dependent="batched"); answers
  move with batchmates, kept for comparison only);
- rows, one at a time: each row alone on the full intra-op pool (row_workers=1);
- rows, side by side: each row alone, `--threads` rows at once on single-threaded workers (the default).
Texts: real test reviews (truncated to max_length) and the load tool's short sentences, at b1 and b32,
texts/s per round, the median over rounds reported. Also checks that both row modes give every text
exactly its alone answer. Writes report.json / report.md to --out. A statement of what was measured.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import ROOT, reviews, write_report
from qserve.devices import cpu_label, usable_cores
from qserve.files import now_iso
from qserve.loadtest import default_texts
from qserve.provenance import provenance
from qserve.runtime import RuntimeOptions, load_runtime

MODES = {"batched": {"batch_dependent": "batched"}, "rows, one at a time": {"row_workers": 1}, "rows, side by side": {}}


def measure(rts: dict[str, Any], sets: dict[str, list[str]], batches: list[int], rounds: int) -> dict[str, Any]:
    rates: dict[str, list[float]] = {}
    for _ in range(rounds):
        for set_name, texts in sets.items():
            for b in batches:
                for mode, rt in rts.items():
                    t0 = time.perf_counter()
                    for i in range(0, len(texts), b):
                        rt.predict(texts[i : i + b])
                    rates.setdefault(f"{set_name}|b{b}|{mode}", []).append(len(texts) / (time.perf_counter() - t0))
    return {k: {"texts_per_s": float(np.median(v)), "rounds": [round(x, 1) for x in v]} for k, v in rates.items()}


def render(rep: dict[str, Any]) -> str:
    L = [
        f"# Row-by-row onnx-int8: one forward, rows one at a time, rows side by side ({rep['variant']})",
        "",
        f"Created {rep['created']} on {rep['cpu']}, {rep['threads']} intra-op threads, {rep['rounds']} rounds "
        "(modes take turns in every round; the median round is shown). One process; nothing else ran.",
        "",
        "| texts | batch | " + " | ".join(MODES) + " | side by side vs one at a time |",
        "|---|---:|" + "---:|" * (len(MODES) + 1),
    ]
    for set_name, n in rep["sets"].items():
        for b in rep["batches"]:
            r = {m: rep["rates"][f"{set_name}|b{b}|{m}"]["texts_per_s"] for m in MODES}
            L.append(
                f"| {set_name} ({n}) | {b} | "
                + " | ".join(f"{r[m]:.1f}" for m in MODES)
                + f" | {r['rows, side by side'] / r['rows, one at a time']:.2f}x |"
            )
    L += [
        "",
        "Texts per second. At batch 1 both row modes are the same call (a batch of one keeps the full "
        "intra-op pool), so their ratio there is noise.",
        "",
        "Answers: max |Δprob| of each row mode against every text scored alone: "
        + ", ".join(f"{m} {v:.3g}" for m, v in rep["max_abs_dprob_vs_alone"].items())
        + ".",
    ]
    return "\n".join(L) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("variant_dir", type=Path)
    p.add_argument("--threads", type=int, default=None, help="intra-op threads (default: the cores)")
    p.add_argument("--reviews", type=int, default=96, help="real test reviews per set")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks" / "reports" / "int8-invariance" / "rows-side-by-side"
    )
    args = p.parse_args(argv)

    threads = args.threads or usable_cores()
    rts = {m: load_runtime(args.variant_dir, "cpu", RuntimeOptions(threads=threads, **kw)) for m, kw in MODES.items()}
    # texts for timing only: any real reviews do
    sets = {"real test reviews": reviews(args.reviews, pool=2000), "short sentences": default_texts(args.reviews)}
    for rt in rts.values():  # warm-up
        rt.predict(sets["short sentences"][:32])
    alone = {k: np.concatenate([rts["rows, one at a time"].predict([t]) for t in v]) for k, v in sets.items()}
    dprob = {
        m: max(
            float(
                np.abs(np.concatenate([rts[m].predict(v[i : i + 32]) for i in range(0, len(v), 32)]) - alone[k]).max()
            )
            for k, v in sets.items()
        )
        for m in MODES
    }
    rep = {
        "created": now_iso(),
        "variant": str(args.variant_dir),
        "cpu": cpu_label(),
        "threads": threads,
        "rounds": args.rounds,
        "batches": [1, 32],
        "sets": {k: len(v) for k, v in sets.items()},
        "rates": measure(rts, sets, [1, 32], args.rounds),
        "max_abs_dprob_vs_alone": dprob,
        "provenance": provenance(),
    }
    write_report(args.out, rep, render(rep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
