"""Long-text policies side by side: accuracy, agreement and texts/s on real test texts, per policy.

    qserve bench models/minilm-l6-distilbert-imdb/variants/torch-fp32 --long-text head,head-tail,windows

Each policy scores the test split through predict(), as served; the parent adds agreement with the reference
and names `fast` (to serve) and `best`. Another policy replaces the variant's own only when its paired accuracy
gain is wholly above 0 at >= half of head's texts/s (docs/long-texts.md).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from qserve import problemtypes as problems
from qserve.bench import evalpass
from qserve.bench.mdtable import blocks, md_table, pct
from qserve.benchreport import recommendation, shown
from qserve.intervals import paired_bootstrap
from qserve.problemtypes import MULTI, SINGLE, agreement

SPEED_FRACTION = 0.5
"""A policy may replace the variant's own only at >= this fraction of head's texts/s."""
CONFIDENCE = 0.95
"""The two-sided confidence of a policy-against-policy interval."""


def measure(
    rt: Any,
    ev: dict[str, Any],
    policies: list[str],
    own: dict[str, Any] | None = None,
    batch: int = 32,
    cache: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Child side: one record per policy (resolved for this variant), predictions included for the parent; `own`
    (the accuracy record under the variant's own policy) is reused, not measured twice."""
    texts, labels = ev["texts"], ev["labels"]
    cache = cache or {}
    out = []
    for asked in dict.fromkeys(["head", *policies]):  # head first, each policy once
        policy = rt.resolve_policy(asked, "--long-text")
        stats = evalpass.piece_stats(rt, texts, policy, cache.get("dir"), cache.get("tokenizer"))
        mine = own if own and own.get("policy") == str(policy) else {}
        if mine.get("predictions") is not None and len(mine["predictions"]) == len(texts):
            preds, seconds = mine["predictions"], mine["seconds"]
        else:
            preds, seconds = evalpass.score(rt, texts, policy, stats["tokens"], batch)
        quality = problems.metrics(preds, labels, rt.problem_type, len(rt.labels))
        hits = _hits(preds, labels, rt.problem_type, len(rt.labels))
        out.append(
            {
                "asked": asked,
                "policy": str(policy),
                "n": len(texts),
                "accuracy": quality.get("accuracy"),
                "seconds": seconds,
                "texts_per_s": len(texts) / seconds if seconds else None,
                "mean_windows": sum(stats["windows"]) / len(texts) if texts else None,
                "truncated": sum(stats["truncated"]) / len(texts) if texts else None,
                "predictions": preds,
                **({"hits": hits} if hits is not None else {}),
            }
        )
    return out


def _hits(preds: list[Any], labels: list[Any], problem: str, k: int) -> list[int] | None:
    """1 where a text is answered right, else 0 (multi-label: the whole label set), in the texts' order: what
    the paired comparison of two policies reads. None for regression (no right or wrong)."""
    if problem == MULTI:
        return [int([int(x) for x in problems.multi_hot(y, k)] == list(p)) for p, y in zip(preds, labels)]
    if problem == SINGLE:
        return [int(p == y) for p, y in zip(preds, labels)]
    return None


def add_agreement(variants: list[dict[str, Any]], ref: dict[str, Any] | None) -> None:
    """Parent side: agreement of each policy's predictions with the reference variant's under the same policy."""
    ref_preds = {r["policy"]: r.get("predictions") for r in (ref or {}).get("long_text_policies") or []}
    acc = (ref or {}).get("accuracy") or {}
    problem, span = acc.get("problem_type", SINGLE), acc.get("label_range")
    for v in variants:
        for r in v.get("long_text_policies") or []:
            mine, theirs = r.get("predictions"), ref_preds.get(r["policy"])
            if ref is None or mine is None or theirs is None:
                r["agreement"] = None
                continue
            m = min(len(mine), len(theirs))  # the reference scored fewer when it is not the recommended variant
            r["agreement"] = agreement(mine[:m], theirs[:m], problem, span)
            if m < len(mine):
                r["agreement_n"] = m
    for v in variants:
        for r in v.get("long_text_policies") or []:
            r.pop("predictions", None)  # per-text `hits` stay: the paired comparison of choose() reads them


def paired(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any] | None:
    """Accuracy of policy record `a` minus `b` on the same texts, with its paired bootstrap interval
    ({"value", "lo", "hi", "n"}); None when either has no per-text hits or they scored different texts."""
    ha, hb = a.get("hits"), b.get("hits")
    if not ha or not hb or len(ha) != len(hb):
        return None
    value, lo, hi = paired_bootstrap(np.asarray(ha), np.asarray(hb), CONFIDENCE)
    return {"value": round(value, 6), "lo": round(lo, 6), "hi": round(hi, 6), "n": len(ha)}


def choose(records: list[dict[str, Any]], own: str | None = None) -> dict[str, Any] | None:
    """{"fast", "best", "head", "own", "changed", "against_own"}: `fast` is the variant's own policy unless one at >=
    SPEED_FRACTION of head's texts/s is more accurate, the paired interval wholly above 0; `best` the most accurate."""
    scored = [r for r in records if r.get("accuracy") is not None]
    head = next((r for r in scored if r["asked"] == "head"), None)
    if not scored or head is None or not head.get("texts_per_s"):
        return None
    mine = next((r for r in scored if r["policy"] == own), None) or head
    # ties go to the faster policy
    rank = sorted(scored, key=lambda r: (-r["accuracy"], -(r.get("texts_per_s") or 0.0)))
    diffs = {r["policy"]: paired(r, mine) for r in scored if r is not mine}
    quick = [
        r
        for r in rank
        if (r.get("texts_per_s") or 0.0) >= SPEED_FRACTION * head["texts_per_s"]
        and (diffs.get(r["policy"]) or {}).get("lo", 0.0) > 0
    ]
    keep = ("policy", "accuracy", "agreement", "texts_per_s", "mean_windows", "truncated", "n")
    served = quick[0] if quick else mine
    return {
        "fast": {k: served.get(k) for k in keep},
        "best": {k: rank[0].get(k) for k in keep},
        "head": {k: head.get(k) for k in keep},
        "own": mine["policy"],
        "changed": served is not mine,
        "against_own": {p: d for p, d in diffs.items() if d is not None},
    }


def finish(report: dict[str, Any]) -> None:
    """report["long_text"]: the two named policies, from the recommended variant's records (else the reference's,
    else the first measured); `served_variant` says whether a server may take a policy from them."""
    variants = [v for v in report["variants"] if v.get("status") == "ok" and v.get("long_text_policies")]
    if not variants:
        return
    rec = recommendation(report).variant
    ref = report.get("agreement_reference")
    v = (
        next((x for x in variants if x["name"] == rec), None)
        or next((x for x in variants if x["name"] == ref), None)
        or variants[0]
    )
    picked = choose(v["long_text_policies"], v.get("long_text"))
    if picked is None:
        return
    f, b, own = picked["fast"], picked["best"], picked["own"]
    d = picked["against_own"].get(f["policy"]) or picked["against_own"].get(b["policy"])
    if picked["changed"]:
        why = (
            f"on {v['name']} ({f['n']} texts): {f['policy']} beats the variant's own {own} by "
            f"{_pp(d)} at >= {SPEED_FRACTION:.0%} of head's texts/s ({f['texts_per_s']:.1f} vs "
            f"{picked['head']['texts_per_s']:.1f})"
        )
    else:
        why = (
            f"on {v['name']} ({f['n']} texts): no policy at >= {SPEED_FRACTION:.0%} of head's texts/s beats the "
            f"variant's own {own} with the interval of the difference above 0, so it keeps {own}"
            + (f" ({b['policy']} against it: {_pp(d)})" if d and b["policy"] != own else "")
        )
    why += f"; the most accurate overall is {b['policy']} ({b['accuracy']:.2%}, {b['texts_per_s']:.1f} texts/s)"
    report["long_text"] = {"variant": v["name"], "served_variant": v["name"] == rec, **picked, "why": why}


def _pp(d: dict[str, Any] | None) -> str:
    """A paired difference as points with its interval: '+D points [LO, HI] on N texts'."""
    if not d:
        return "an unmeasured difference"
    return f"{d['value'] * 100:+.2f} points [{d['lo'] * 100:+.2f}, {d['hi'] * 100:+.2f}] on {d['n']} texts"


def md_lines(report: dict[str, Any]) -> list[str]:
    """report.md's long-text section: every policy record of every variant, then the policy chosen to serve."""
    top = max((r["n"] for v in report["variants"] for r in v.get("long_text_policies") or []), default=0)
    rows, ok = [], [v for v in report["variants"] if v.get("status") == "ok"]
    for v in ok:
        for r in v.get("long_text_policies") or []:
            few = f" ({r['n']} texts)" if r["n"] < top else ""
            agr = pct(r.get("agreement")) + (f" ({r['agreement_n']} texts)" if r.get("agreement_n") else few)
            speed = "–" if not r.get("texts_per_s") else f"{r['texts_per_s']:.1f}"
            rows.append([shown(v, report), r["policy"], pct(r.get("accuracy")) + few, agr, speed])
            rows[-1] += [f"{r.get('mean_windows') or 0:.2f}", pct(r.get("truncated"))]
    if not rows:
        return []
    once = any(v.get("accuracy") and not v.get("long_text_policies") for v in ok)
    head = "variant|policy|accuracy|agreement|texts/s|windows per text|truncated".split("|")
    L = blocks(
        "## Long texts: policies compared",
        f"The first {top} test texts scored under each long-text policy (predict() in batches of 32: tokenization, "
        f"cutting, every window and the aggregation included); agreement is with "
        f"{report.get('agreement_reference') or 'fp32'} under the same policy; "
        "`truncated` is the share of texts with tokens no piece covered."
        + (
            " Compared on the reference and the recommended variant only, the records the served policy is "
            "qualified and chosen on; every other variant is scored once, under its own policy (docs/bench.md)."
            if once
            else ""
        ),
        md_table(head, rows, ["---"] * 2 + ["---:"] * 5),
    )
    lt = report.get("long_text")
    if lt:
        fast, gate = lt["fast"]["policy"], lt.get("gate")
        L += blocks(
            f"**Long-text policy chosen: {fast}** (the variant's own: {lt.get('own')}; most "
            f"accurate overall: {lt['best']['policy']}); {lt['why']}. `qserve serve MODEL_DIR` serves "
            f"{fast} once a gate verdict for it exists"
            + ("" if fast == lt.get("own") else f" (`qserve gate VARIANT --long-text {fast}`)")
            + ", else the policy its gate verified."
            + (f" The pipeline gated {lt['variant']} under {gate['policy']}: {gate.get('verdict')}." if gate else "")
        )
    return L
