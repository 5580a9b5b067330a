"""Long-text policies side by side: accuracy, agreement and texts/s on real test texts, per policy.

    qserve bench models/minilm-l6-distilbert-imdb/variants/torch-fp32 --long-text head,head-tail,windows

Each variant's child scores the test split once per policy (predict() in batches of 32, tokenization,
cutting and aggregation included, as served), so texts/s is what the policy costs on real texts. The
parent adds agreement with the reference variant under the same policy, and names two policies for the
served variant: the most accurate whose texts/s is at least half of head's (`fast`, what
`qserve serve MODEL_DIR` serves) and the most accurate overall (`best`). head is always measured: it
is the baseline of the speed rule.
"""

from __future__ import annotations

from typing import Any

from qserve import problemtypes as problems
from qserve.bench import evalpass
from qserve.placement import mark
from qserve.problemtypes import SINGLE, agreement

SPEED_FRACTION = 0.5
"""`fast`: the most accurate policy whose texts/s is at least this fraction of head's."""


def with_head(policies: list[str]) -> list[str]:
    return list(dict.fromkeys(["head", *policies]))


def measure(
    rt: Any,
    ev: dict[str, Any],
    policies: list[str],
    own: dict[str, Any] | None = None,
    batch: int = 32,
    cache: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Child side: one record per policy (resolved for this variant), predictions included for the parent.

    `own` is the variant's accuracy record under its own policy: reused rather than measured twice. Texts are
    scored in length-sorted batches (evalpass.score: the same answers, in the texts' order); the untimed
    piece counts come from the tokenizer's cache when another variant already cut the same texts."""
    texts, labels = ev["texts"], ev["labels"]
    cache = cache or {}
    out = []
    for asked in with_head(policies):
        policy = rt.resolve_policy(asked, "--long-text")
        stats = evalpass.piece_stats(rt, texts, policy, cache.get("dir"), cache.get("tokenizer"))
        if (
            own
            and own.get("policy") == str(policy)
            and own.get("predictions") is not None
            and len(own["predictions"]) == len(texts)
        ):
            preds, seconds = own["predictions"], own["seconds"]
        else:
            preds, seconds = evalpass.score(rt, texts, policy, stats["tokens"], batch)
        quality = problems.metrics(preds, labels, rt.problem_type, len(rt.labels))
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
            }
        )
    return out


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
            r.pop("predictions", None)


def choose(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """{"fast", "best", "head"}: the most accurate policy at >= half head's texts/s, and the most accurate."""
    scored = [r for r in records if r.get("accuracy") is not None]
    head = next((r for r in scored if r["asked"] == "head"), None)
    if not scored or head is None or not head.get("texts_per_s"):
        return None
    # ties go to the faster policy
    rank = sorted(scored, key=lambda r: (-r["accuracy"], -(r.get("texts_per_s") or 0.0)))
    quick = [r for r in rank if (r.get("texts_per_s") or 0.0) >= SPEED_FRACTION * head["texts_per_s"]]
    keep = ("policy", "accuracy", "agreement", "texts_per_s", "mean_windows", "truncated")
    return {
        "fast": {k: quick[0].get(k) for k in keep},
        "best": {k: rank[0].get(k) for k in keep},
        "head": {k: head.get(k) for k in keep},
    }


def finish(report: dict[str, Any]) -> None:
    """report["long_text"]: the two named policies, for the recommended variant (else the reference, else the
    first measured)."""
    variants = [v for v in report["variants"] if v.get("status") == "ok" and v.get("long_text_policies")]
    if not variants:
        return
    rec = (report.get("recommended") or {}).get("variant")
    ref = report.get("agreement_reference")
    v = (
        next((x for x in variants if x["name"] == rec), None)
        or next((x for x in variants if x["name"] == ref), None)
        or variants[0]
    )
    picked = choose(v["long_text_policies"])
    if picked is None:
        return
    f, b = picked["fast"], picked["best"]
    why = (
        f"on {v['name']}: {f['policy']} is the most accurate policy ({f['accuracy']:.2%}) at >= "
        f"{SPEED_FRACTION:.0%} of head's texts/s ({f['texts_per_s']:.1f} vs {picked['head']['texts_per_s']:.1f}); "
        f"the most accurate overall is {b['policy']} ({b['accuracy']:.2%}, {b['texts_per_s']:.1f} texts/s)"
    )
    report["long_text"] = {"variant": v["name"], **picked, "why": why}


def _pct(x: Any) -> str:
    return "–" if x is None else f"{x * 100:.2f}%"


def md_lines(report: dict[str, Any]) -> list[str]:
    rows = []
    top = max((r["n"] for v in report["variants"] for r in v.get("long_text_policies") or []), default=0)
    for v in report["variants"]:
        if v.get("status") != "ok":
            continue
        for r in v.get("long_text_policies") or []:
            few = f" ({r['n']} texts)" if r["n"] < top else ""
            agr = _pct(r.get("agreement")) + (f" ({r['agreement_n']} texts)" if r.get("agreement_n") else few)
            shown = v["name"] + mark(v.get("device"), (report.get("config") or {}).get("device"))
            rows.append(
                f"| {shown} | {r['policy']} | {_pct(r.get('accuracy'))}{few} | {agr} | "
                + ("–" if not r.get("texts_per_s") else f"{r['texts_per_s']:.1f}")
                + f" | {r.get('mean_windows') or 0:.2f} | {_pct(r.get('truncated'))} |"
            )
    if not rows:
        return []
    ref = report.get("agreement_reference") or "fp32"
    n = top
    L = [
        "## Long texts: policies compared",
        "",
        f"The first {n} test texts scored under each long-text policy (predict() in batches of 32: tokenization, "
        f"cutting, every window and the aggregation included); agreement is with {ref} under the same policy; "
        "`truncated` is the share of texts with tokens no piece covered."
        + (
            " Compared on the reference and the recommended variant only, the records the served policy is "
            "qualified and chosen on; every other variant is scored once, under its own policy (docs/bench.md)."
            if any(
                v.get("status") == "ok" and v.get("accuracy") and not v.get("long_text_policies")
                for v in report["variants"]
            )
            else ""
        ),
        "",
        "| variant | policy | accuracy | agreement | texts/s | windows per text | truncated |",
        "|---|---|---:|---:|---:|---:|---:|",
        *rows,
        "",
    ]
    lt = report.get("long_text")
    if lt:
        L += [
            f"**Long-text policy served: {lt['fast']['policy']}** (most accurate overall: {lt['best']['policy']}); "
            f"{lt['why']}. `qserve serve MODEL_DIR` serves {lt['fast']['policy']}.",
            "",
        ]
    return L
