"""Latency statistics (count/mean/p50/p90/p95/p99/stdev, the optimum-benchmark set) and prediction agreement.

    python -c "from qserve.bench.stats import summarize; print(summarize([1.0, 2.0, 3.0, 4.0]))"

Pure Python (reports render without numpy); percentiles interpolate as numpy's default does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from qserve.intervals import percentile

PERCENTILES = (50, 90, 95, 99)


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


CI_LEVEL = 0.95
"""The coverage asked of a median's interval; with few rounds the order statistics give what they can (stated)."""


def median(values: Sequence[float]) -> float:
    return percentile(values, 50)


def median_ci(values: Sequence[float], level: float = CI_LEVEL) -> tuple[float, float, float]:
    """(lo, hi, coverage): the order-statistic interval of a median, the k-th smallest and largest of n values, k the
    largest whose binomial coverage is >= `level` (else 1); one value: (v, v, 0.0)."""
    xs = sorted(float(x) for x in values)
    n = len(xs)
    if n == 0:
        raise ValueError("median_ci of an empty sample")
    if n == 1:
        return xs[0], xs[0], 0.0

    def coverage(k: int) -> float:  # P(x_(k) <= median <= x_(n+1-k))
        return 1.0 - 2.0 * sum(math.comb(n, j) for j in range(k)) / 2.0**n

    k = 1
    while k + 1 <= n // 2 and coverage(k + 1) >= level:
        k += 1
    return xs[k - 1], xs[n - k], coverage(k)


def two_modes(values: Sequence[float], apart: float) -> tuple[list[float], list[float]] | None:
    """(fast, slow): `values` split where the two groups' spread of logs is least (Otsu's rule, so one outlier makes
    no mode of its own), kept when the fast group holds two values at least and the slow group's median is more
    than `apart` (a share) above the fast group's; None for one mode. Values spread evenly and widely split too:
    the fast group is then the faster half, which is what a ranking by the fast mode wants."""
    xs = sorted(float(x) for x in values)
    if len(xs) < 3 or xs[0] <= 0:
        return None
    logs = [math.log(x) for x in xs]

    def spread(part: list[float]) -> float:
        m = sum(part) / len(part)
        return sum((x - m) ** 2 for x in part)

    i = min(range(1, len(xs)), key=lambda j: spread(logs[:j]) + spread(logs[j:]))
    fast, slow = xs[:i], xs[i:]
    return (fast, slow) if len(fast) >= 2 and median(slow) > (1 + apart) * median(fast) else None


def ratio_ci(slow: dict[int | str, float], fast: dict[int | str, float], level: float = CI_LEVEL) -> dict[str, Any]:
    """How many times slower `slow` is than `fast`, `tied` when the interval holds 1: the median of paired per-round
    ratios with median_ci's interval, or, without a shared round or where that interval's coverage is the lower
    (few shared rounds: two modes can leave two), the ratio of the medians with the widest interval their own
    intervals allow, unpaired."""
    keys = [k for k in slow if k in fast]
    s_lo, s_hi, s_cov = median_ci(list(slow.values()), level)
    f_lo, f_hi, f_cov = median_ci(list(fast.values()), level)
    value, lo, hi, cov = (
        median(list(slow.values())) / median(list(fast.values())),
        s_lo / f_hi,
        s_hi / f_lo,
        s_cov * f_cov,
    )
    paired = False
    if keys:
        ratios = [slow[k] / fast[k] for k in keys]
        p_lo, p_hi, p_cov = median_ci(ratios, level)
        if p_cov >= cov:
            value, lo, hi, cov, paired = median(ratios), p_lo, p_hi, p_cov, True
    return {
        "value": value,
        "lo": lo,
        "hi": hi,
        "level": cov,
        "rounds": len(keys),
        "paired": paired,
        "tied": lo <= 1.0 <= hi,
    }


def ratio_text(r: dict[str, Any]) -> str:
    """'Rx [LO, HI]' (the interval's coverage and rounds are said where the ratio is explained)."""
    return f"{r['value']:.2f}x [{r['lo']:.2f}, {r['hi']:.2f}]"
