"""Interleaved rounds: what one round of a variant measures, and how its rounds become one latency with an interval.

    python -m pytest tests/unit/test_bench_stats.py -q

A record's p50 and its interval are over the rounds' p50s (recommend.over_rounds: the fast mode's too, where the
rounds fall in two); the other statistics are over every call (docs/bench.md, "Rounds").
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from qserve.bench.recommend import over_rounds
from qserve.bench.stats import median, summarize, throughput


def per_round(total: float, rounds: int) -> float:
    """A round's share of a per-shape time budget (`--time-budget` is the whole of it, over every round)."""
    return total / max(1, rounds)


def round_iters(min_iters: int, max_iters: int, rounds: int) -> tuple[int, int]:
    """(min, max) timed calls per shape in one round: together the rounds make at least --min-iters and at most
    --max-iters calls (one call a round, at least)."""
    lo = max(1, math.ceil(min_iters / max(1, rounds)))
    return lo, max(lo, max_iters // max(1, rounds))


def merge_fixed(rounds: Sequence[dict[str, Any]], tolerance: float) -> list[dict[str, Any]]:
    """Fixed-shape records from a variant's rounds (each {"id", "fixed": [{"batch", "seq", "samples"} | error]})."""
    order: list[tuple[int, int]] = []
    calls: dict[tuple[int, int], list[float]] = {}
    p50s: dict[tuple[int, int], dict[str, float]] = {}
    errors: dict[tuple[int, int], str] = {}
    for r in rounds:
        for one in r.get("fixed") or []:
            k = (one["batch"], one["seq"])
            if k not in order:
                order.append(k)
            if one.get("samples"):
                calls.setdefault(k, []).extend(one["samples"])
                p50s.setdefault(k, {})[str(r["id"])] = median(one["samples"])
            elif one.get("error"):
                errors.setdefault(k, one["error"])
    out = []
    for b, s in order:
        rec: dict[str, Any] = {"batch": b, "seq": s}
        if (b, s) in calls:
            xs = calls[(b, s)]
            rec.update(summarize(xs))
            rec.update(over_rounds(p50s[(b, s)], tolerance))
            rec["throughput"] = throughput(b * len(xs), sum(xs) / 1e3)
            rec["tokens_per_s"] = rec["throughput"] * s
        else:
            rec["error"] = errors.get((b, s), "not measured")
        out.append(rec)
    return out


def merge_real(rounds: Sequence[dict[str, Any]], tolerance: float) -> list[dict[str, Any]]:
    """Real-text records from a variant's rounds (each {"id", "real_text": [{"batch", "samples", "texts",
    "padded", "tok_ms"}]}): the texts continue from round to round (each round picks up where the last stopped)."""
    by: dict[int, dict[str, Any]] = {}
    for r in rounds:
        for rec in r.get("real_text") or []:
            if not rec.get("samples"):
                continue
            acc = by.setdefault(rec["batch"], {"samples": [], "texts": 0, "padded": [], "tok_ms": [], "p50": {}})
            acc["samples"].extend(rec["samples"])
            acc["texts"] += rec["texts"]
            acc["padded"].extend(rec.get("padded") or [])
            acc["tok_ms"].extend(rec.get("tok_ms") or [])
            acc["p50"][str(r["id"])] = median(rec["samples"])
    out = []
    for b in sorted(by):
        acc = by[b]
        out.append(
            {
                "batch": b,
                **summarize(acc["samples"]),
                **over_rounds(acc["p50"], tolerance),
                "texts": acc["texts"],
                "throughput": throughput(acc["texts"], sum(acc["samples"]) / 1e3),
                "mean_padded_len": sum(acc["padded"]) / len(acc["padded"]) if acc["padded"] else None,
                # real-text p50 vs fixed-shape p50 + this: what the real-text path costs beyond tokenizing
                "tokenize_p50_ms": statistics.median(acc["tok_ms"]) if acc["tok_ms"] else None,
            }
        )
    return out


def unstable_cell(rec: dict[str, Any] | None) -> str:
    """' (two modes: fast F ms, slow S ms in N% of rounds)' and/or ' (unstable: rounds LO-HI ms)' beside a number,
    else '' (and for one round: a raced-out variant's)."""
    if not rec or len(rec.get("round_p50") or {}) < 2:
        return ""
    m = rec.get("modes")
    out = (
        f" (two modes: fast {m['fast_p50']:.2f} [{m['fast_ci'][0]:.2f}, {m['fast_ci'][1]:.2f}], slow "
        f"{m['slow_p50']:.2f} ms in {m['slow_share']:.0%} of rounds)"
        if m
        else ""
    )
    if not rec.get("stable", True):
        vals = list(rec["round_p50"].values())
        out += f" (unstable: rounds {min(vals):.2f}-{max(vals):.2f} ms)"
    return out


def ci_cell(rec: dict[str, Any] | None, digits: int = 2) -> str:
    """'7.30 [7.10, 7.55]' (p50 and its interval over rounds), '7.30' for a record of one round or none, '—' for
    no record."""
    if not rec or rec.get("p50") is None:
        return "—"
    ci = rec.get("p50_ci") if len(rec.get("round_p50") or {}) > 1 else None
    body = f"{rec['p50']:.{digits}f}" + (f" [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]" if ci else "")
    return body + unstable_cell(rec)
