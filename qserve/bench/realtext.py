"""The real-text passes of a variant's bench child: predict() on real test texts (tokenization, cutting and
dynamic padding included) per batch size, and the real-text b1 path checked against the fixed b1 forward plus
the text's own tokenization, timed in turn.

    qserve bench models/minilm-l6-distilbert-imdb/variants/onnx-int8 --batch-sizes 1,32 --seq-lens 128
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

from qserve.runtime.buckets import bucket_for


def synthetic_batch(rt, batch: int, seq: int, text: str):
    """Exactly (batch, seq) of real token ids: [CLS] body... [SEP], full attention mask."""
    enc = rt.tokenize([text])
    ids = enc["input_ids"][0][enc["attention_mask"][0] == 1]
    cls_id, sep_id, body = int(ids[0]), int(ids[-1]), ids[1:-1]
    if body.size == 0:
        body = np.array([cls_id], dtype=np.int64)
    rows = []
    for r in range(batch):  # rows start at different offsets so a batch is not one row repeated
        idx = (np.arange(seq - 2) + 7 * r) % body.size
        rows.append(np.concatenate([[cls_id], body[idx], [sep_id]]))
    input_ids = np.asarray(rows, dtype=np.int64)
    return {"input_ids": input_ids, "attention_mask": np.ones_like(input_ids)}


def real_text_round(
    rt, batch: int, texts: list[str], cursor: int, budget_s: float, min_iters: int, max_iters: int, warm: bool
) -> tuple[dict[str, Any], int]:
    """One round of predict() on consecutive batches of real texts from batch `cursor`: ({"batch", "samples", "texts",
    "padded", "tok_ms"}, the next cursor)."""
    batches = [texts[i : i + batch] for i in range(0, len(texts), batch)] or [texts]
    if warm:
        rt.predict(batches[cursor % len(batches)])
        rt.synchronize()
    samples: list[float] = []
    n_texts = 0
    start = time.perf_counter()
    i = cursor
    while len(samples) < max_iters and (len(samples) < min_iters or time.perf_counter() - start < budget_s):
        chunk = batches[i % len(batches)]
        t0 = time.perf_counter()
        rt.predict(chunk)
        rt.synchronize()
        samples.append((time.perf_counter() - t0) * 1e3)
        n_texts += len(chunk)
        i += 1
    padded: list[float] = []
    tok_ms: list[float] = []  # the text's own tokenization (+ cut and padding), timed apart from the model
    for k in range(cursor, min(i, cursor + len(batches))):
        chunk = batches[k % len(batches)]
        t0 = time.perf_counter()
        mask = rt.tokenize(chunk)["attention_mask"]
        tok_ms.append((time.perf_counter() - t0) * 1e3)
        if rt.buckets:  # a length-bucketed variant runs each text at its bucket, not at the batch's longest
            padded.append(sum(bucket_for(int(n), rt.buckets) for n in mask.sum(axis=1)) / len(chunk))
        else:
            padded.append(int(mask.shape[1]))
    return {"batch": batch, "samples": samples, "texts": n_texts, "padded": padded, "tok_ms": tok_ms}, i


CHECK_PAIRS = 12
"""Call pairs of real_text_check: enough for a median, a fraction of a second for a fast variant."""
CHECK_BOUND = 1.15
"""The real-text b1 path within this factor of the fixed-shape b1 forward plus the text's own tokenization."""


def real_text_check(rt, job: dict[str, Any], texts: list[str]) -> dict[str, Any] | None:
    """Real-text b1 against the fixed b1 forward plus that text's tokenization, timed call by call in turn (CHECK_PAIRS
    times, so both see the same machine): what predict() costs beyond the model and the tokenizer."""
    if 1 not in job["batch_sizes"] or not texts:
        return None
    seq = 128 if 128 in job["seq_lens"] else max(job["seq_lens"])
    fixed = synthetic_batch(rt, 1, seq, " ".join(texts[:8]))
    rt.run(fixed)
    rt.synchronize()
    f: list[float] = []
    r: list[float] = []
    tk: list[float] = []
    for k in range(CHECK_PAIRS):
        one = [texts[k % len(texts)]]
        for fn, out in ((lambda: rt.run(fixed), f), (lambda: rt.predict(one), r)):
            t0 = time.perf_counter()
            fn()
            rt.synchronize()
            out.append((time.perf_counter() - t0) * 1e3)
        t0 = time.perf_counter()
        rt.tokenize(one)
        tk.append((time.perf_counter() - t0) * 1e3)

    fm, rm, tm = statistics.median(f), statistics.median(r), statistics.median(tk)
    rec = {"pairs": CHECK_PAIRS, "seq": seq, "fixed_p50": fm, "real_p50": rm, "tokenize_p50": tm}
    return {**rec, "ratio": rm / (fm + tm), "bound": CHECK_BOUND, "within": rm / (fm + tm) <= CHECK_BOUND}
