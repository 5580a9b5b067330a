"""Latency statistics (count/mean/p50/p90/p95/p99/stdev, the optimum-benchmark set) and prediction agreement.

    python -c "from qserve.bench.stats import summarize; print(summarize([1.0, 2.0, 3.0, 4.0]))"

Pure Python on purpose: the parent process renders reports without numpy/torch, and
percentiles use linear interpolation between closest ranks (numpy's default
`method="linear"`), so numbers here match what a reader gets from numpy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

PERCENTILES = (50, 90, 95, 99)


def percentile(samples: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation, as numpy.percentile(samples, q)."""
    if not samples:
        raise ValueError("percentile of an empty sample")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be within 0..100 (got {q})")
    xs = sorted(float(x) for x in samples)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    frac = pos - lo
    return xs[lo] + (xs[hi] - xs[lo]) * frac


def stdev(samples: Sequence[float]) -> float:
    """Sample standard deviation (n-1); 0.0 for fewer than two samples."""
    n = len(samples)
    if n < 2:
        return 0.0
    m = sum(samples) / n
    return math.sqrt(sum((x - m) ** 2 for x in samples) / (n - 1))


def summarize(samples_ms: Sequence[float]) -> dict[str, float | int]:
    """count, mean, p50, p90, p95, p99, stdev, min, max of latencies in milliseconds."""
    if not samples_ms:
        return {"count": 0}
    xs = [float(x) for x in samples_ms]
    out: dict[str, float | int] = {"count": len(xs), "mean": sum(xs) / len(xs)}
    for q in PERCENTILES:
        out[f"p{q}"] = percentile(xs, q)
    out["stdev"] = stdev(xs)
    out["min"] = min(xs)
    out["max"] = max(xs)
    return out


def throughput(items: int, seconds: float) -> float:
    """Items per second; 0.0 when nothing was timed."""
    return items / seconds if seconds > 0 else 0.0


def shape_stats(entry: dict[str, Any], batch: int, seq: int) -> dict[str, Any] | None:
    """A report entry's latency summary at one fixed shape (batch, seq), or None if it was not measured."""
    for rec in entry.get("fixed") or []:
        if rec.get("batch") == batch and rec.get("seq") == seq and "p50" in rec:
            return rec
    return None


def agreement(preds: list[int] | None, ref: list[int] | None) -> float | None:
    """Share of predictions equal to the reference's, text by text (None unless both cover the same texts)."""
    if not preds or not ref or len(preds) != len(ref):
        return None
    return sum(int(a == b) for a, b in zip(preds, ref)) / len(preds)
