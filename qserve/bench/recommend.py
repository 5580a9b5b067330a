"""The recommended variant: the fastest one on this machine that meets the agreement bar, and every variant's verdict.

    qserve serve models/minilm-l6-distilbert-imdb      # a model dir: serves the report's recommendation

The lowest real-text b1 p50 (else the headline shape's) among the variants whose agreement with fp32 meets the
bar for their bits (bar_for; agreement by problem type: qserve/problemtypes.py), said in one sentence against the
runner-up; race() picks the variants the bench measures to the end. The rules: docs/bench.md.
"""

from __future__ import annotations

from typing import Any

from qserve.bench.rounds import ranked
from qserve.bench.stats import ratio_ci, ratio_text, shape_stats
from qserve.benchreport import real_text_b1
from qserve.variants import bar_for


def recommend(report: dict[str, Any]) -> dict[str, Any]:
    """{"variant", "dir", "p50_ms", "agreement", "bar", "shape", "why", "cpu", "ranking", the runner-up (VERSUS)},
    or {"variant": None, "why"}; `why` is the verdict sentence, each ranking row carries its `verdict`."""
    b, s = report["headline"]["batch"], report["headline"]["seq"]
    ref = report.get("agreement_reference")
    cpu = ((report.get("environment") or {}).get("cpu") or {}).get("model")
    ranking = []
    for v in report["variants"]:
        if v.get("status") != "ok":
            continue
        st, real = shape_stats(v, b, s), real_text_b1(v)
        if st is None and real is None:
            continue
        bits = (v.get("spec") or {}).get("bits")
        agr, bar = v.get("agreement"), bar_for(bits)
        ranking.append(
            {
                "variant": v["name"],
                "dir": v["dir"],
                "p50_ms": None,
                "real_b1_p50_ms": ranked(real)[0] if real else None,
                "fixed_p50_ms": ranked(st)[0] if st else None,
                "agreement": agr,
                "bar": bar,
                "bits": bits,
                # a raced-out variant was measured in the screen round only: it never decides anything
                "meets_bar": agr is not None and agr >= bar and not v.get("raced_out"),
                "footprint_bytes": v.get("weights_bytes") or v.get("disk_bytes"),
                "_real": real,
                "_fixed": st,
                **{k: v[k] for k in ("raced_out", "repair") if v.get(k)},
                **({"gate": v["gate"]["passed"], "gate_record": v["gate"]} if v.get("gate") else {}),
            }
        )
    # Once any variant carries a release gate (`qserve gate`), only gated ones may be recommended: one that passed,
    # or the reference itself (it is what the gate compares with). Without gates, the point-estimate bar as before.
    gated = any("gate" in r for r in ranking)
    if gated:
        for r in ranking:
            r["meets_bar"] = r["meets_bar"] and (r.get("gate") is True or r["variant"] == ref)
    # Real texts at their own length when every candidate has them (what is served); else the headline shape.
    by_real = bool(ranking) and all(r["real_b1_p50_ms"] is not None for r in ranking)
    if not by_real:
        ranking = [r for r in ranking if r["fixed_p50_ms"] is not None]
    for r in ranking:
        rec = r.pop("_real") if by_real else r.pop("_fixed")
        r.pop("_fixed", None)
        r.pop("_real", None)
        r["p50_ms"] = r["real_b1_p50_ms"] if by_real else r["fixed_p50_ms"]
        _, r["p50_ci"], _, r["round_p50"] = ranked(rec) if rec else (None, None, None, None)
        r["median_ms"] = (rec or {}).get("p50")  # over every round: the ranked p50 is the fast mode's, if two
        r["stable"] = (rec or {}).get("stable")
        r["modes"] = (rec or {}).get("modes")
    ranking.sort(key=lambda r: r["p50_ms"])
    shape = "b1 on real test texts, each at its own length" if by_real else f"b{b}/s{s}"
    ok = [r for r in ranking if r["meets_bar"]]
    best, versus = choose(ok, ref) if ok else (None, None)
    for r in ranking:
        r["verdict"], r["verdict_why"] = _verdict(r, best, ref, gated)
    if best is None:
        speed_only = all(r["agreement"] is None for r in ranking)
        why = (
            "no variant has an agreement measurement (speed-only run)"
            if speed_only
            else "no gated variant passed its release gate and meets its agreement bar"
            if gated
            else "no variant meets its agreement bar"
        )
        return {"variant": None, "why": why, "shape": shape, "cpu": cpu, "ranking": ranking}
    where = "b1 on real texts" if by_real else f"b{b}/s{s}"
    return {
        **{k: best[k] for k in ("variant", "dir", "p50_ms", "agreement", "bar", "p50_ci", "stable")},
        **(versus or {}),
        "shape": shape,
        "why": _sentence(best, versus, ref, where),
        "cpu": cpu,
        "reference": ref,
        "ranking": ranking,
    }


TIE_RULE = "the higher gated agreement lower bound (where both are gated), then the smaller footprint, then the name"
"""How a tie between the fastest candidates is broken (docs/bench.md, "Ties")."""


def choose(ok: list[dict[str, Any]], ref: str | None = None) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(the recommended row, its comparison with the runner-up) among rows meeting their bar, fastest first; those
    whose paired ratio to the fastest holds 1 are tied and TIE_RULE picks. The runner-up is the next of them, the
    reference `ref` only when no other qualifies; no comparison with one candidate."""
    fastest = ok[0]
    if len(ok) < 2:
        return fastest, None

    def ratio(slow: dict[str, Any], fast: dict[str, Any]) -> dict[str, Any]:
        a = slow.get("round_p50") or {"-": slow["p50_ms"]}
        b = fast.get("round_p50") or {"-": fast["p50_ms"]}
        return ratio_ci(a, b)

    tied = [fastest] + [r for r in ok[1:] if ratio(r, fastest)["tied"]]
    both_gated = all(r.get("gate_record", {}).get("agreement_lower_bound") is not None for r in tied)
    tied.sort(
        key=lambda r: (
            -r["gate_record"]["agreement_lower_bound"] if both_gated else 0.0,
            r.get("footprint_bytes") or float("inf"),
            r["variant"],
        )
    )
    best = tied[0] if len(tied) > 1 else fastest
    rest = [r for r in tied if r is not best] + [r for r in ok if r not in tied]
    runner = next((r for r in rest if r["variant"] != ref), rest[0])
    cmp = ratio(runner, best)
    return best, {
        "runner_up": runner["variant"],
        "ratio": cmp,
        "ratio_text": ratio_text(cmp),
        "tied": runner in tied,
        "tied_with": [r["variant"] for r in tied if r is not best],
        "tie_break": TIE_RULE if len(tied) > 1 else None,
    }


def _verdict(r: dict[str, Any], best: dict[str, Any] | None, ref: str | None, gated: bool) -> tuple[str, str | None]:
    """(a ranking row's verdict, why): recommended, passed, undecided at n, repaired, failed gate, below bar, raced
    out or not a candidate (the summary table's column; docs/bench.md, "The first screen")."""
    g = r.get("gate_record") or {}
    decision = g.get("decision") or (("passed" if g["passed"] else "failed") if g else None)
    if r is best:
        return "recommended", None
    if r.get("raced_out"):
        return "raced out", f"{r['raced_out']['of_best']:.2f}x"  # of the fastest candidate in the screen round
    if r["agreement"] is None:
        return "not a candidate", "no agreement measured"
    if r["agreement"] < r["bar"]:
        return "below bar", f"agreement {r['agreement']:.2%} < {r['bar']:.0%}"
    if decision == "failed":
        return "failed gate", "; ".join(g.get("reasons") or []) or None
    if decision == "undecided":
        return f"undecided at {g.get('n')}", "; ".join(g.get("reasons") or []) or None
    if decision == "passed" and r.get("repair"):
        return "repaired", f"{len(r['repair'].get('kept') or [])} layer(s) kept in higher precision"
    if gated and not g and r["variant"] != ref:
        return "not a candidate", "not gated; once a gate ran, only a passed variant or the reference is recommended"
    return "passed", "the reference" if r["variant"] == ref else None


def _sentence(best: dict[str, Any], versus: dict[str, Any] | None, ref: str | None, where: str) -> str:
    """The verdict in one sentence of at most 40 words: the variant, its ratio against the runner-up with the
    interval (the reference said so), its gate verdict."""
    if versus is None:
        cmp = "the only variant that qualified"
    else:
        r, run = versus["ratio"], versus["runner_up"]
        n = r["rounds"]
        how = f"paired over {n} round{'s' * (n != 1)}" if r["paired"] else f"unpaired, {r['level']:.0%} interval"
        if versus["tied"]:
            cmp = f"tied with {run} ({versus['ratio_text']}, {how}), chosen by the tie rule"
        else:
            who = f"the reference {run} (nothing else qualified)" if run == ref else run
            cmp = f"{versus['ratio_text']} faster than {who} at {where} ({how})"
    g = best.get("gate_record") or {}
    if best["variant"] == ref:
        gate = "it is the reference (no gate needed)"
    elif g.get("agreement_lower_bound") is not None:
        gate = (
            f"{'repaired, then ' if best.get('repair') else ''}release gate passed: agreement lower bound "
            f"{g['agreement_lower_bound']:.2%} ≥ {g['bar']:.0%}" + (f" on {g['n']:,} texts" if g.get("n") else "")
        )
    elif g:
        gate = "release gate passed"
    else:
        gate = f"not gated: agreement {best['agreement']:.2%} ≥ {best['bar']:.0%}, a point estimate"
    return f"Serve {best['variant']}: {cmp}; {gate}."


RACE_KEEP = 3
"""The fastest candidates on the screen round that run to the end whatever the factor: a recommendation, its
runner-up, and one in reserve for a bar or a gate that fails."""


def race(screen: dict[Any, float], candidates: list[Any], factor: float, always: Any = None) -> set[Any]:
    """The contenders after the screen round (`screen`: variant -> its ranked b1 there): every variant within
    `factor` of the fastest candidate, the RACE_KEEP fastest candidates and `always` (the reference); all of them
    when factor is 0 (docs/bench.md, "Racing")."""
    cands = sorted((c for c in candidates if c in screen), key=screen.__getitem__)
    if not factor or not cands:
        return set(screen)
    bound = factor * screen[cands[0]]
    return {c for c, p in screen.items() if p <= bound} | set(cands[:RACE_KEEP]) | ({always} & set(screen))
