"""The ranking rule in one place: the p50 a variant is ranked by, how two compare, the recommendation, the race.

    qserve serve models/minilm-l6-distilbert-imdb      # a model dir: serves the report's recommendation

A record's rounds give a median and, where they fall in two modes, a fast mode, which it is ranked by (ranked); two
variants compare by the median of their paired per-round ratios (ratio_ci: tied where its interval holds 1); the
fastest candidate meeting its agreement bar (bar_for) is recommended, a tie broken by TIE_RULE, against the
runner-up (choose); race() keeps the contenders after the screen round. The rules: docs/bench.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from qserve.bench.stats import CI_LEVEL, median, median_ci
from qserve.benchreport import Ranked, Ratio, Recommendation, fixed_shape, real_text_b1
from qserve.variants import bar_for


def over_rounds(round_p50: dict[str, float], tolerance: float) -> dict[str, Any]:
    """A record's numbers over its rounds: the median with its interval; where the rounds fall in two modes
    (two_modes: a phase of the machine that slows every process at once, docs/bench.md), also the fast mode's
    median and interval, and the slow mode's median and share of the rounds; `stable` where the interval it is
    ranked by is no wider than `tolerance`."""
    vals = list(round_p50.values())
    lo, hi, cov = median_ci(vals)
    p50 = median(vals)
    rec: dict[str, Any] = {
        "p50": p50,
        "p50_ci": [lo, hi],
        "ci_level": cov,
        "round_p50": round_p50,
        "rounds": len(vals),
        "spread": (max(vals) / min(vals)) if min(vals) > 0 else None,
    }
    modes = two_modes(vals, tolerance)
    if modes is not None:
        fast, slow = modes
        f_lo, f_hi, f_cov = median_ci(fast)
        rec["modes"] = {
            "fast_p50": median(fast),
            "fast_ci": [f_lo, f_hi],
            "fast_ci_level": f_cov,
            "fast_rounds": [k for k, v in round_p50.items() if v <= fast[-1]],
            "slow_p50": median(slow),
            "slow_share": len(slow) / len(vals),
        }
    r_p50, r_ci, _, _ = ranked(rec)
    r_lo, r_hi = r_ci or (lo, hi)
    rec["ci_width"] = (r_hi - r_lo) / r_p50 if r_p50 > 0 else 0.0
    rec["stable"] = len(vals) >= 2 and rec["ci_width"] <= tolerance
    return rec


def ranked(rec: dict[str, Any]) -> tuple[float, list[float] | None, float, dict[str, float]]:
    """(p50, interval, its coverage, the round p50s it rests on) that a record is ranked by: its fast mode where
    its rounds fall in two, else its median over every round (a record of one pass: no interval)."""
    m = rec.get("modes")
    if not m:
        return rec["p50"], rec.get("p50_ci"), rec.get("ci_level", 0.0), rec.get("round_p50") or {}
    fast = set(m["fast_rounds"])
    rounds = {k: v for k, v in (rec.get("round_p50") or {}).items() if k in fast}
    return m["fast_p50"], m["fast_ci"], m["fast_ci_level"], rounds


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


def decisive(v: dict[str, Any], headline: tuple[int, int]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(its headline fixed-shape record, its real-text b1 record): what a variant is ranked by, None where not
    measured; a variant whose rounds disagree on them gets more rounds."""
    return fixed_shape(v, *headline), real_text_b1(v)


def screen_p50(v: dict[str, Any], headline: tuple[int, int]) -> float:
    """What the race ranks a variant by: its ranked real-text b1, else its headline shape (inf: neither)."""
    fixed, real = decisive(v, headline)
    rec = real or fixed
    return ranked(rec)[0] if rec else math.inf


def ratio_ci(slow: dict[str, float], fast: dict[str, float], level: float = CI_LEVEL) -> Ratio:
    """How many times slower `slow` is than `fast`: the median of paired per-round ratios with median_ci's interval,
    or, without a shared round or where that interval's coverage is the lower (few shared rounds: two modes can
    leave two), the ratio of the medians with the widest interval their own intervals allow, unpaired."""
    keys = [k for k in slow if k in fast]
    s_lo, s_hi, s_cov = median_ci(list(slow.values()), level)
    f_lo, f_hi, f_cov = median_ci(list(fast.values()), level)
    value, cov = median(list(slow.values())) / median(list(fast.values())), s_cov * f_cov
    lo, hi = s_lo / f_hi, s_hi / f_lo
    paired = False
    if keys:
        ratios = [slow[k] / fast[k] for k in keys]
        p_lo, p_hi, p_cov = median_ci(ratios, level)
        if p_cov >= cov:
            value, lo, hi, cov, paired = median(ratios), p_lo, p_hi, p_cov, True
    return Ratio(value, lo, hi, cov, len(keys), paired, lo <= 1.0 <= hi)


def candidate(gate: dict[str, Any] | None, is_reference: bool, gated: bool) -> bool:
    """Whether a variant may be recommended, its bar aside: any, or once any variant carries a release gate
    (`qserve gate`), one that passed or the reference itself (what the gate compares with)."""
    return not gated or is_reference or (gate or {}).get("passed") is True


RACE_KEEP = 3
"""The fastest candidates on the screen round that run to the end whatever the factor: a recommendation, its
runner-up, and one in reserve for a bar or a gate that fails."""


def race(screen: dict[Any, float], candidates: list[Any], factor: float, always: Any = None) -> set[Any]:
    """The contenders after the screen round (`screen`: variant -> its screen_p50): every variant within `factor`
    of the fastest candidate, the RACE_KEEP fastest candidates and `always` (the reference); all of them when
    factor is 0 (docs/bench.md, "Racing")."""
    cands = sorted((c for c in candidates if c in screen), key=screen.__getitem__)
    if not factor or not cands:
        return set(screen)
    bound = factor * screen[cands[0]]
    return {c for c, p in screen.items() if p <= bound} | set(cands[:RACE_KEEP]) | ({always} & set(screen))


TIE_RULE = "the higher gated agreement lower bound (where both are gated), then the smaller footprint, then the name"
"""How a tie between the fastest candidates is broken (docs/bench.md, "Ties")."""


def _rounds(r: Ranked) -> dict[str, float]:
    return r.round_p50 or {"-": r.p50_ms or 0.0}


def choose(ok: list[Ranked], ref: str | None = None) -> tuple[Ranked, Ranked | None, list[Ranked]]:
    """(the recommended, the runner-up, those tied) among rows meeting their bar, fastest first: those whose
    ratio to the fastest holds 1 are tied and TIE_RULE picks. The runner-up is the next of them, the reference
    `ref` only when no other qualifies; none with one candidate."""
    if len(ok) < 2:
        return ok[0], None, [ok[0]]
    tied = [ok[0]] + [r for r in ok[1:] if ratio_ci(_rounds(r), _rounds(ok[0])).tied]
    both_gated = all((r.gate_record or {}).get("agreement_lower_bound") is not None for r in tied)
    tied.sort(
        key=lambda r: (
            -(r.gate_record or {})["agreement_lower_bound"] if both_gated else 0.0,
            r.footprint_bytes or float("inf"),
            r.variant,
        )
    )
    best = tied[0]
    rest = tied[1:] + [r for r in ok if all(r is not t for t in tied)]
    return best, next((r for r in rest if r.variant != ref), rest[0]), tied


def recommend(report: dict[str, Any]) -> dict[str, Any]:
    """report["recommended"] as JSON (a Recommendation, qserve.benchreport): rank()'s."""
    return rank(report).to_json()


def rank(report: dict[str, Any]) -> Recommendation:
    """Every measured variant ranked by its p50 (real-text b1 where every one has it, else the headline shape), with
    its verdict; the recommended one against its runner-up, and `why` in one sentence (None: why none)."""
    headline = report["headline"]["batch"], report["headline"]["seq"]
    ref = report.get("agreement_reference")
    cpu = ((report.get("environment") or {}).get("cpu") or {}).get("model")
    found = [(v, *decisive(v, headline)) for v in report["variants"] if v.get("status") == "ok"]
    found = [(v, fixed, real) for v, fixed, real in found if fixed or real]
    gated = any(v.get("gate") for v, _, _ in found)
    by_real = bool(found) and all(real for _, _, real in found)
    ranking = [
        _ranked(v, fixed, real, by_real, candidate(v.get("gate"), v["name"] == ref, gated))
        for v, fixed, real in found
        if by_real or fixed
    ]
    ranking.sort(key=lambda r: r.p50_ms or 0.0)
    ok = [r for r in ranking if r.meets_bar]
    best, runner, tied = choose(ok, ref) if ok else (None, None, [])
    for r in ranking:
        r.verdict, r.verdict_why = _verdict(r, best, ref, gated)
    shape = "b1 on real test texts, each at its own length" if by_real else "b{}/s{}".format(*headline)
    if best is None:
        why = (
            "no variant has an agreement measurement (speed-only run)"
            if all(r.agreement is None for r in ranking)
            else "no gated variant passed its release gate and meets its agreement bar"
            if gated
            else "no variant meets its agreement bar"
        )
        return Recommendation(why=why, shape=shape, cpu=cpu, ranking=ranking)
    out = Recommendation(best.variant, best.dir, best.p50_ms, best.agreement, best.bar, best.p50_ci, best.stable)
    if runner is not None:
        out.runner_up, out.ratio = runner.variant, ratio_ci(_rounds(runner), _rounds(best))
        out.ratio_text, out.tied = out.ratio.text(), any(r is runner for r in tied)
        out.tied_with, out.tie_break = [r.variant for r in tied[1:]], TIE_RULE if len(tied) > 1 else None
    out.shape, out.cpu, out.reference, out.ranking = shape, cpu, ref, ranking
    out.why = _sentence(out, best, "b1 on real texts" if by_real else shape)
    return out


def _ranked(v: dict[str, Any], fixed: dict | None, real: dict | None, by_real: bool, can_win: bool) -> Ranked:
    """A variant's ranking row, ranked by its real-text b1 record (by_real) or its headline fixed-shape one."""
    rec = (real if by_real else fixed) or {}
    p50, ci, _, rounds = ranked(rec)
    bits, agr, gate = (v.get("spec") or {}).get("bits"), v.get("agreement"), v.get("gate")
    bar = bar_for(bits)
    return Ranked(
        variant=v["name"],
        dir=v["dir"],
        p50_ms=p50,
        real_b1_p50_ms=ranked(real)[0] if real else None,
        fixed_p50_ms=ranked(fixed)[0] if fixed else None,
        agreement=agr,
        bar=bar,
        bits=bits,
        # a raced-out variant was measured in the screen round only: it never decides anything
        meets_bar=agr is not None and agr >= bar and not v.get("raced_out") and can_win,
        footprint_bytes=v.get("weights_bytes") or v.get("disk_bytes"),
        raced_out=v.get("raced_out") or None,
        repair=v.get("repair") or None,
        gate=gate["passed"] if gate else None,
        gate_record=gate or None,
        p50_ci=ci,
        round_p50=rounds,
        median_ms=rec.get("p50"),  # over every round: the ranked p50 is the fast mode's, if two
        stable=rec.get("stable"),
        modes=rec.get("modes"),
    )


def _verdict(r: Ranked, best: Ranked | None, ref: str | None, gated: bool) -> tuple[str, str | None]:
    """(a ranking row's verdict, why): recommended, passed, undecided at n, repaired, failed gate, below bar, raced
    out or not a candidate (the summary table's column; docs/bench.md, "The first screen")."""
    g = r.gate_record or {}
    decision = g.get("decision") or (("passed" if g["passed"] else "failed") if g else None)
    if r is best:
        return "recommended", None
    if r.raced_out:
        return "raced out", f"{r.raced_out['of_best']:.2f}x"  # of the fastest candidate in the screen round
    if r.agreement is None:
        return "not a candidate", "no agreement measured"
    if r.agreement < r.bar:
        return "below bar", f"agreement {r.agreement:.2%} < {r.bar:.0%}"
    if decision == "failed":
        return "failed gate", "; ".join(g.get("reasons") or []) or None
    if decision == "undecided":
        return f"undecided at {g.get('n')}", "; ".join(g.get("reasons") or []) or None
    if decision == "passed" and r.repair:
        return "repaired", f"{len(r.repair.get('kept') or [])} layer(s) kept in higher precision"
    if gated and not g and r.variant != ref:
        return "not a candidate", "not gated; once a gate ran, only a passed variant or the reference is recommended"
    return "passed", "the reference" if r.variant == ref else None


def _sentence(rec: Recommendation, best: Ranked, where: str) -> str:
    """The verdict in one sentence of at most 40 words: the variant, its ratio against the runner-up with the
    interval (the reference said so), its gate verdict."""
    r, run = rec.ratio, rec.runner_up
    if r is None:
        cmp = "the only variant that qualified"
    else:
        how = (
            f"paired over {r.rounds} round{'s' * (r.rounds != 1)}" if r.paired else f"unpaired, {r.level:.0%} interval"
        )
        if rec.tied:
            cmp = f"tied with {run} ({rec.ratio_text}, {how}), chosen by the tie rule"
        else:
            who = f"the reference {run} (nothing else qualified)" if run == rec.reference else run
            cmp = f"{rec.ratio_text} faster than {who} at {where} ({how})"
    g = best.gate_record or {}
    if best.variant == rec.reference:
        gate = "it is the reference (no gate needed)"
    elif g.get("agreement_lower_bound") is not None:
        gate = (
            f"{'repaired, then ' if best.repair else ''}release gate passed: agreement lower bound "
            f"{g['agreement_lower_bound']:.2%} ≥ {g['bar']:.0%}" + (f" on {g['n']:,} texts" if g.get("n") else "")
        )
    elif g:
        gate = "release gate passed"
    else:
        gate = f"not gated: agreement {best.agreement:.2%} ≥ {best.bar:.0%}, a point estimate"
    return f"Serve {best.variant}: {cmp}; {gate}."
