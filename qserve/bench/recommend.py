"""The recommended variant: the fastest one on this machine that meets the agreement bar.

    qserve serve models/minilm-l6-distilbert-imdb      # a model dir: serves the report's recommendation

The lowest real-text b1 p50 (else the headline shape's) among the variants whose agreement with fp32 meets the
bar for their bits (bar_for; agreement by problem type: qserve/problemtypes.py). The rule: docs/bench.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from qserve import QserveError
from qserve.artifact import read_manifest
from qserve.bench.policies import served_policy
from qserve.bench.rounds import ranked
from qserve.bench.stats import ratio_ci, ratio_text, shape_stats
from qserve.devices import cpu_info
from qserve.placement import mark

AGREEMENT_BAR = {4: 0.97, 8: 0.99, 16: 0.99, 32: 0.99}


def bar_for(bits: int | None) -> float:
    return AGREEMENT_BAR.get(int(bits or 8), 0.99)


def real_text_b1(entry: dict[str, Any]) -> dict[str, Any] | None:
    """The variant's batch-1 latency over real test texts (each at its own length), or None if not measured."""
    return next((r for r in entry.get("real_text") or [] if r.get("batch") == 1 and "p50" in r), None)


def recommend(report: dict[str, Any]) -> dict[str, Any]:
    """{"variant", "dir", "p50_ms", "agreement", "bar", "shape", "why", "cpu", "ranking"}, or
    {"variant": None, "why"}."""
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
                "meets_bar": agr is not None and agr >= bar,
                "footprint_bytes": v.get("weights_bytes") or v.get("disk_bytes"),
                "_real": real,
                "_fixed": st,
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
    if not ok:
        speed_only = all(r["agreement"] is None for r in ranking)
        why = (
            "no variant has an agreement measurement (speed-only run)"
            if speed_only
            else "no gated variant passed its release gate and meets its agreement bar"
            if gated
            else "no variant meets its agreement bar"
        )
        return {"variant": None, "why": why, "shape": shape, "cpu": cpu, "ranking": ranking}
    best, versus = choose(ok)
    faster = [r["variant"] for r in ranking if r["p50_ms"] < best["p50_ms"] and not r["meets_bar"]]
    fixed = f"; b{b}/s{s} p50 {best['fixed_p50_ms']:.2f} ms" if by_real and best["fixed_p50_ms"] is not None else ""
    metric = f" ({report['agreement_metric']})" if report.get("agreement_metric") else ""
    phase = "the fast mode's median" if best.get("modes") else "median"
    why = (
        f"fastest at {shape} ({phase} {best['p50_ms']:.2f} ms{fixed}) among variants whose agreement{metric} with "
        f"{ref or 'fp32'} meets the bar (int8 >= 99%, 4-bit >= 97%, 16/32-bit >= 99%): {best['agreement']:.2%} >= "
        f"{best['bar']:.0%}"
        + (_gate_words(best["gate_record"]) if best.get("gate") else "")
        + (
            f"; faster but below the bar{', not gated or failed its gate' if gated else ''}: {', '.join(faster)}"
            if faster
            else ""
        )
        + (_versus_words(best, versus) if versus else "")
    )
    return {
        **{k: best[k] for k in ("variant", "dir", "p50_ms", "agreement", "bar", "p50_ci", "stable")},
        **(versus or {}),
        "shape": shape,
        "why": why,
        "cpu": cpu,
        "reference": ref,
        "ranking": ranking,
    }


VERSUS = ("runner_up", "ratio", "ratio_text", "tied", "tied_with", "tie_break")
"""The comparison with the runner-up that choose() adds to a recommendation (and a selection record carries)."""
TIE_RULE = "the higher gated agreement lower bound (where both are gated), then the smaller footprint, then the name"
"""How a tie between the fastest candidates is broken (docs/bench.md, "Ties")."""


def choose(ok: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(the recommended row, its comparison with the runner-up) among rows meeting their bar, fastest first; those
    whose paired ratio to the fastest holds 1 are tied and TIE_RULE picks. No comparison with one candidate."""
    fastest = ok[0]
    if len(ok) < 2:
        return fastest, None

    def ratio(slow: dict[str, Any], fast: dict[str, Any]) -> dict[str, Any]:
        a = slow.get("round_p50") or {"-": slow["p50_ms"]}
        b = fast.get("round_p50") or {"-": fast["p50_ms"]}
        return ratio_ci(a, b)

    tied = [fastest] + [r for r in ok[1:] if ratio(r, fastest)["tied"]]
    if len(tied) > 1:
        both_gated = all(r.get("gate_record", {}).get("agreement_lower_bound") is not None for r in tied)
        ranked = sorted(
            tied,
            key=lambda r: (
                -r["gate_record"]["agreement_lower_bound"] if both_gated else 0.0,
                r.get("footprint_bytes") or float("inf"),
                r["variant"],
            ),
        )
        best, runner = ranked[0], ranked[1]
    else:
        best, runner = fastest, ok[1]
    cmp = ratio(runner, best)
    return best, {
        "runner_up": runner["variant"],
        "ratio": cmp,
        "ratio_text": ratio_text(cmp),
        "tied": len(tied) > 1,
        "tied_with": [r["variant"] for r in tied if r is not best],
        "tie_break": TIE_RULE if len(tied) > 1 else None,
    }


def _versus_words(best: dict[str, Any], v: dict[str, Any]) -> str:
    r = v["ratio"]
    how = (
        f"paired over {r['rounds']} rounds, {r['level']:.0%} interval"
        if r["paired"]
        else f"unpaired ({r['rounds']} shared rounds), {r['level']:.0%} interval"
    )
    if v["tied"]:
        return (
            f"; tied with {', '.join(v['tied_with'])} ({v['runner_up']} / {best['variant']} = {v['ratio_text']}, "
            f"{how}: the interval holds 1), broken by {TIE_RULE}"
        )
    return f"; {v['ratio_text']} faster than the runner-up {v['runner_up']} ({how})"


def _gate_words(g: dict[str, Any]) -> str:
    """The gate's own evidence, which may rest on more texts than the bench scored this variant on (the eval cut)."""
    if g.get("agreement") is None or g.get("agreement_lower_bound") is None:
        return "; release gate passed"
    return (
        f"; release gate passed: agreement {g['agreement']:.2%}, lower bound {g['agreement_lower_bound']:.2%} >= "
        f"{g['bar']:.0%} on {g['n']} texts"
    )


def md_lines(report: dict[str, Any]) -> list[str]:
    rec = report.get("recommended")
    if not rec:
        return []
    if not rec.get("variant"):
        return [f"**Recommended variant: none** ({rec['why']}).", ""]
    entry: dict[str, Any] = next((v for v in report.get("variants") or [] if v.get("name") == rec["variant"]), {})
    run = (report.get("config") or {}).get("device")
    where = mark(entry.get("device"), run)
    on = f"{((report.get('environment') or {}).get('gpu'))}, " if str(run).startswith("cuda") else ""
    return [
        f"**Recommended variant on this machine ({on}{rec.get('cpu')}): {rec['variant']}{where}**, {rec['why']}. "
        "`qserve serve MODEL_DIR` serves it by default"
        + (f", on the {entry.get('device')} as measured" if where else "")
        + ".",
        "",
    ]


def from_model_dir(model_dir: str | Path) -> tuple[Path, dict[str, Any]]:
    """(variant dir, selection record) for a pipeline run dir: MODEL_DIR/report/report.json + MODEL_DIR/variants/."""
    model_dir = Path(model_dir)
    path = model_dir / "report" / "report.json"
    if not path.is_file():
        raise QserveError(
            f"{model_dir} is neither a variant dir (no manifest.json) nor a model dir with a bench "
            f"report ({path} is missing); pass a variant dir, or run `qserve pipeline` first"
        )
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise QserveError(f"{path} is not valid JSON ({e}); re-run `qserve pipeline`") from None
    rec = report.get("recommended") or recommend(report)
    if not rec.get("variant"):
        raise QserveError(f"{path} recommends no variant ({rec.get('why')}); pass a variant dir instead")
    name = rec["variant"]
    vdir = model_dir / "variants" / name
    if not (vdir / "manifest.json").is_file():
        vdir = Path(rec["dir"])
    if not (vdir / "manifest.json").is_file():
        raise QserveError(
            f"{path} recommends {name}, but neither {model_dir / 'variants' / name} nor {rec['dir']} "
            f"holds it; re-export it or pass a variant dir"
        )
    here = _cpu_model()
    # the long-text policy to serve: the report's choice where its gate verdict covers it (bench/policies.py)
    long_text, long_text_why = served_policy(report, name, read_manifest(vdir))
    return vdir, {
        "variant": name,
        "why": rec["why"],
        "report": str(path),
        "measured_on": rec.get("cpu"),
        "same_cpu": here == rec.get("cpu") if here and rec.get("cpu") else None,
        "long_text": long_text,
        "long_text_why": long_text_why,
        "versus": {k: rec[k] for k in VERSUS if k in rec} or None,
    }


def _cpu_model() -> str | None:
    model = cpu_info().get("model")
    return None if model == "unknown" else model
