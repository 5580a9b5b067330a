"""Latency statistics (count/mean/p50/p90/p95/p99/stdev, the optimum-benchmark set) and a median's interval.

    python -c "from qserve.bench.stats import summarize; print(summarize([1.0, 2.0, 3.0, 4.0]))"

Pure Python (reports render without numpy); percentiles interpolate as numpy's default does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

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
    out.update(stdev=stdev(xs), min=min(xs), max=max(xs))
    return out


def throughput(items: int, seconds: float) -> float:
    """Items per second; 0.0 when nothing was timed."""
    return items / seconds if seconds > 0 else 0.0


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
