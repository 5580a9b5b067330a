"""Intervals shared by the release gate and the bench (a paired bootstrap over the same texts, Wilson's), and the
percentile every latency report uses.

    python -c "import numpy as np; from qserve.intervals import paired_bootstrap; \\
print(paired_bootstrap(np.ones(200), np.zeros(200)))"    # (1.0, 1.0, 1.0)

`paired_bootstrap(a, b)`: an interval for mean(a) - mean(b) over the same texts, resampling texts, so the
pairing is kept (the gate's accuracy delta; the bench's policy-against-policy accuracy difference).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

import numpy as np


def paired_bootstrap(
    a: np.ndarray, b: np.ndarray, confidence: float = 0.95, resamples: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """(mean(a - b), lo, hi): a percentile bootstrap interval of the mean paired difference, texts resampled
    with replacement (a and b: one value per text, the same texts in the same order; seeded, so a gate run
    twice says the same)."""
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    n = len(d)
    if n == 0:
        return 0.0, -1.0, 1.0
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    step = max(1, 2_000_000 // n)  # bounded memory: at most ~2M indices at once
    for i in range(0, resamples, step):
        m = min(step, resamples - i)
        means[i : i + m] = d[rng.integers(0, n, size=(m, n))].mean(axis=1)
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(means, [alpha, 1 - alpha])
    return float(d.mean()), float(lo), float(hi)


Z95 = 1.959963984540054
"""The standard normal's quantile for two-sided 95% intervals."""


def z_for(confidence: float) -> float:
    """The two-sided normal quantile for `confidence` (0.95 -> 1.96)."""
    return Z95 if confidence == 0.95 else NormalDist().inv_cdf(0.5 + confidence / 2)


def wilson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval (lo, hi) of k successes in n trials; (0, 1) for n = 0."""
    if n <= 0:
        return 0.0, 1.0
    z = z_for(confidence)
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


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
