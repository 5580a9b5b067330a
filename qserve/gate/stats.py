"""The gate's statistics: confidence intervals, calibration error and the two calibrations qserve fits.

    python -c "from qserve.gate.stats import wilson; print(wilson(200, 200))"    # (0.981..., 1.0)

Plain numpy on arrays the gate has scored: the Wilson interval, a paired bootstrap and McNemar's test, min_n, ECE,
temperature scaling and per-label F1 thresholds (docs/gate.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from qserve.intervals import paired_bootstrap as paired_bootstrap  # the gate reads them here
from qserve.intervals import wilson as wilson
from qserve.intervals import z_for


def min_n(bar: float, confidence: float = 0.95) -> int:
    """The fewest texts whose Wilson lower bound at 100% agreement (n / (n + z^2)) reaches `bar`."""
    z2 = z_for(confidence) ** 2
    return max(1, math.ceil(z2 * bar / (1 - bar) - 1e-9)) if bar < 1 else 10**9


def looks(first: int, pool: int, most: int) -> list[int]:
    """The sequential gate's planned look sizes, fixed before any text is scored: `first` texts, doubled at each
    look, the last at most the whole `pool`, at most `most` looks."""
    sizes = [min(first, pool)]
    while len(sizes) < most and sizes[-1] < pool:
        sizes.append(min(2 * sizes[-1], pool))
    return sizes


def look_confidence(confidence: float, n_looks: int) -> float:
    """Each look's two-sided confidence under the alpha split: the one-sided (1 - confidence) / 2 at each bar is
    shared equally by the planned looks (Bonferroni), so no sequence of looks passes a variant at the bar more
    often than one look at `confidence` would."""
    return 1 - (1 - confidence) / n_looks


def mcnemar(a: np.ndarray, b: np.ndarray) -> dict[str, float | int]:
    """The exact McNemar test of paired 0/1 outcomes: the discordant counts (a right / b wrong, and the other
    way) and the two-sided binomial p-value that they differ only by chance."""
    a, b = np.asarray(a, dtype=bool), np.asarray(b, dtype=bool)
    only_a, only_b = int((a & ~b).sum()), int((~a & b).sum())
    m = only_a + only_b
    if m == 0:
        return {"only_variant": only_a, "only_reference": only_b, "p_value": 1.0}
    k = min(only_a, only_b)
    tail = sum(math.comb(m, i) for i in range(k + 1)) / 2.0**m
    return {"only_variant": only_a, "only_reference": only_b, "p_value": min(1.0, 2 * tail)}


def ece(confidence: np.ndarray, correct: np.ndarray, bins: int = 15) -> float:
    """Expected calibration error: over `bins` equal-width confidence bins, the share of items in each bin times
    |its accuracy - its mean confidence|, summed."""
    conf = np.asarray(confidence, dtype=np.float64).ravel()
    hit = np.asarray(correct, dtype=np.float64).ravel()
    if conf.size == 0:
        return 0.0
    idx = np.minimum((conf * bins).astype(int), bins - 1)
    total = 0.0
    for b in range(bins):
        sel = idx == b
        if sel.any():
            total += sel.mean() * abs(hit[sel].mean() - conf[sel].mean())
    return float(total)


def softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    z = np.asarray(logits, dtype=np.float64) / temperature
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def sigmoid(logits: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.asarray(logits, dtype=np.float64)))


def nll(logits: np.ndarray, labels: np.ndarray, temperature: float = 1.0) -> float:
    """Mean negative log-likelihood of the true classes under softmax(logits / T)."""
    z = np.asarray(logits, dtype=np.float64) / temperature
    z = z - z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return float(-logp[np.arange(len(labels)), np.asarray(labels, dtype=int)].mean())


def fit_temperature(logits: np.ndarray, labels: np.ndarray, lo: float = 0.05, hi: float = 100.0) -> float:
    """The temperature in [lo, hi] minimising the NLL of softmax(logits / T) on (held-out) labelled texts: a
    golden-section search on log T (the NLL is unimodal in T for fixed logits)."""
    a, b = math.log(lo), math.log(hi)
    g = (math.sqrt(5) - 1) / 2
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = nll(logits, labels, math.exp(c)), nll(logits, labels, math.exp(d))
    for _ in range(80):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = nll(logits, labels, math.exp(c))
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = nll(logits, labels, math.exp(d))
    return float(round(math.exp((a + b) / 2), 6))


def f1(pred: np.ndarray, truth: np.ndarray) -> float:
    """F1 of one label's 0/1 decisions against the truth (1.0 when both are all 0: nothing to find, none found)."""
    p, t = np.asarray(pred, dtype=bool), np.asarray(truth, dtype=bool)
    tp = int((p & t).sum())
    denom = int(p.sum()) + int(t.sum())
    return 1.0 if denom == 0 else 2 * tp / denom


def macro_f1(scores: np.ndarray, truth: np.ndarray, thresholds: np.ndarray | float) -> float:
    """Mean over labels of F1 at `thresholds` (one for all, or one per label)."""
    s = np.asarray(scores, dtype=np.float64)
    thr = np.broadcast_to(np.asarray(thresholds, dtype=np.float64), (s.shape[1],))
    return float(np.mean([f1(s[:, j] >= thr[j], truth[:, j]) for j in range(s.shape[1])]))


def fit_thresholds(scores: np.ndarray, truth: np.ndarray, default: float = 0.5) -> list[float]:
    """Per label, the threshold with the best F1 among the midpoints of its distinct scores and `default`, ties
    nearest `default`."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(truth, dtype=bool)
    out = []
    for j in range(s.shape[1]):
        u = np.unique(s[:, j])
        cands = np.concatenate([[default], (u[:-1] + u[1:]) / 2]) if len(u) > 1 else np.array([default])
        best = max(cands, key=lambda t: (round(f1(s[:, j] >= t, y[:, j]), 12), -abs(t - default)))
        out.append(float(round(best, 6)))
    return out


@dataclass(frozen=True)
class Interval:
    """A point estimate and its confidence interval."""

    value: float
    lo: float
    hi: float

    def to_json(self) -> dict[str, float]:
        return {"value": round(self.value, 6), "lo": round(self.lo, 6), "hi": round(self.hi, 6)}
