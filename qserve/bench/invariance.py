"""Batch invariance: does a text's answer depend on what it is batched with?

    qserve bench models/minilm-l6-distilbert-imdb/variants/onnx-int8 --batch-sizes 1 --seq-lens 128

Each text is scored alone, then in shuffled mixed batches of 8 and 32: the largest |Δprobability| and the label
flips, plus, for a variant run row by row, what one batched forward would have answered.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np

BATCH_SIZES = (8, 32)


def select_texts(texts: list[str], n: int) -> list[str]:
    """`n` texts spread evenly over the length range of `texts`, every other one cut to its first 3-120 words, so
    short texts get padded beside long ones (where a batch-dependent kernel shows)."""
    if n <= 0 or not texts:
        return []
    ranked = sorted(range(len(texts)), key=lambda i: (len(texts[i]), i))
    if n >= len(ranked):
        picks = ranked
    else:
        picks = [ranked[round(k * (len(ranked) - 1) / (n - 1))] for k in range(n)] if n > 1 else [ranked[0]]
    picks = list(dict.fromkeys(picks))
    random.Random(0).shuffle(picks)  # mixed order: neighbours in the list are not of similar length
    out = []
    for k, i in enumerate(picks):
        words = texts[i].split()
        out.append(" ".join(words[: 3 + (k * 37) % 118]) if k % 2 else texts[i])
    return out


def compare(predict, texts: list[str], sizes: tuple[int, ...] = BATCH_SIZES, seed: int = 0) -> dict[str, Any]:
    """Score `texts` alone, then in shuffled batches of each size; the worst |Δprob| and the flips."""
    alone = np.concatenate([np.asarray(predict([t]), dtype=np.float64) for t in texts])
    rng = random.Random(seed)
    per: dict[str, Any] = {}
    for b in sizes:
        order = list(range(len(texts)))
        rng.shuffle(order)
        got = np.empty_like(alone)
        for i in range(0, len(order), b):
            idx = order[i : i + b]
            got[idx] = np.asarray(predict([texts[j] for j in idx]), dtype=np.float64)
        delta = np.abs(got - alone).max(axis=1)
        per[str(b)] = {
            "max_abs_dprob": float(delta.max()),
            "flips": int((got.argmax(1) != alone.argmax(1)).sum()),
            "scored": len(texts),
        }
    return {
        "max_abs_dprob": max(r["max_abs_dprob"] for r in per.values()),
        "flips": sum(r["flips"] for r in per.values()),
        "scored": sum(r["scored"] for r in per.values()),
        "by_batch": per,
    }


def measure(rt, texts: list[str], sizes: tuple[int, ...] = BATCH_SIZES) -> dict[str, Any]:
    """The bench's invariance record for one loaded runtime (served behaviour, plus the raw graph's if it differs)."""
    lens = [int(n) for n in rt.tokenize(texts)["attention_mask"].sum(axis=1)] if texts else []
    out: dict[str, Any] = {
        "texts": len(texts),
        "batch_sizes": list(sizes),
        "row_by_row": rt.row_by_row,
        "token_lengths": {"min": min(lens), "median": float(np.median(lens)), "max": max(lens)} if lens else None,
        **compare(rt.predict, texts, sizes),
    }
    if rt.row_by_row:
        # What serving this graph with plain batching would answer: the reason it runs row by row.
        mode = rt.options.batch_dependent
        rt.options.batch_dependent = "batched"
        try:
            out["batched_graph"] = compare(rt.predict, texts, sizes)
        finally:
            rt.options.batch_dependent = mode
    return out


def cell(inv: dict[str, Any] | None) -> str:
    """The report's one-cell summary: max |Δprob| / label flips (and 'row by row' where that is how it runs)."""
    if not inv:
        return "–"
    d = inv["max_abs_dprob"]
    text = f"{d:.1e} / {inv['flips']}" if d else f"0 / {inv['flips']}"
    return text + (" (row by row)" if inv.get("row_by_row") else "")
