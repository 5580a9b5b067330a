"""onnx-int8: its speed at DistilBERT-base dims against torch-fp32 and the int8 floor, where its time goes, what
smoothing buys, and one text, one answer (the candidate fixes for its batch dependence, rows side by side).

    python -c "from benchmarks.render.blocks.int8 import int8_invariance; print(int8_invariance())"
"""

from __future__ import annotations

from typing import Any

from benchmarks.render.blocks.cells import num, pct, ratio, table
from benchmarks.render.blocks.reports import load, on, rendered_from
from qserve.benchreport import fixed_shape


def int8_invariance() -> str:
    """The candidate fixes for onnx-int8's batch dependence, side by side."""
    rel = "int8-invariance/embedded-default/report.json"
    r = load(rel)
    names = list(dict.fromkeys([*r["timing"], *r["invariance"], *(r.get("agreement") or {})]))
    rows = []
    for name in names:
        t, a, inv = (
            r["timing"].get(name) or {},
            (r.get("agreement") or {}).get(name) or {},
            r["invariance"].get(name) or {},
        )
        rows.append(
            [
                name,
                pct(a.get("agreement")),
                num(t.get("b1_p50_ms"), 2, " ms"),
                num(t.get("b1_ratio_to_today"), 3, "x"),
                num(t.get("real_b32_texts_per_s"), 1),
                "–" if not inv else f"{inv['max_abs_dprob']:.2g}",
                "–" if not inv else f"{inv['flips']} of {inv['scored']}",
            ]
        )
    n = next(iter((r.get("agreement") or {}).values()), {}).get("n")
    head = [
        "candidate",
        f"agreement with onnx-fp32 ({n:,})" if n else "agreement",
        "b1/s128 p50",
        "vs today's graph, batched",
        "real reviews b32 texts/s",
        "max \\|Δprob\\| alone vs batched",
        "label flips",
    ]
    return table(head, rows) + rendered_from(rel)


def variants_invariance() -> str:
    """Batch invariance bound per variant of the embedded default (each text alone vs in batches of 8 and 32)."""
    rel = "int8-invariance/embedded-default/variants-invariance.json"
    r = load(rel)
    rows = [
        [name, f"{v['max_abs_dprob']:.2g}", f"{v['flips']} of {v['scored']}", "yes" if v.get("row_by_row") else "no"]
        for name, v in r["variants"].items()
    ]
    return table(["variant", "max \\|Δprob\\|", "label flips", "run row by row"], rows) + rendered_from(rel)


def rows_side_by_side() -> str:
    """How a row-by-row variant runs a batch: one forward, rows one at a time, rows side by side (texts/s)."""
    rel = "int8-invariance/rows-side-by-side/report.json"
    r = load(rel)
    modes = ["batched", "rows, one at a time", "rows, side by side"]
    rows = []
    for texts, n in r["sets"].items():
        for b in r["batches"]:
            rows.append(
                [f"{n} {texts}", str(b)]
                + [num((r["rates"].get(f"{texts}|b{b}|{m}") or {}).get("texts_per_s"), 1) for m in modes]
            )
    rows.append(["max \\|Δprob\\| vs each text alone", ""] + [f"{r['max_abs_dprob_vs_alone'][m]:.2g}" for m in modes])
    head = ["texts", "batch", "one forward (answers move)", "rows, one at a time", "rows, side by side"]
    return table(head, rows) + rendered_from(rel)


def distilbert_base_dims() -> str:
    """Speed at DistilBERT-base size: onnx-int8 against torch-fp32 and the int8 floor, one bench run."""
    rel = "distilbert-base-dims/report.json"
    r = load(rel)
    by = {v["name"]: v for v in r["variants"]}
    i8, f32 = fixed_shape(by["onnx-int8"], 1, 128), fixed_shape(by["torch-fp32"], 1, 128)
    peak = r["floor"]["peaks"]["int8"]
    gflop = r["floor"]["flops_per_sequence"]["128"]["total"] / 1e9
    floor_ms = gflop / peak["gflops"] * 1e3
    return (
        f"{on(rel)} (66M parameters, random weights, speed only): onnx-int8 **{num(i8['p50'], 1)} ms** against "
        f"torch-fp32's {num(f32['p50'], 1)} ms at b1/s128 (**{ratio(f32['p50'] / i8['p50'])}**), "
        f"{ratio(i8['p50'] / floor_ms)} the int8 compute floor ({num(floor_ms, 1)} ms: {gflop:.1f} GFLOP at the "
        f"{peak['gflops']:,.0f} GOP/s int8 peak measured in the same run)."
    )


def int8_breakdown() -> str:
    """Where onnx-int8's time goes at DistilBERT-base dims, the other int8 graphs in quiet rounds, and what turning
    smoothing off costs in agreement on the embedded default."""
    rel, agree_rel = "int8-breakdown/report.json", "int8-breakdown/smooth-off-agreement/report.json"
    r = load(rel)
    f, t, prof = r["flops"], r["timing"], r["profile"]
    floor = f["total"] / (r["peaks"]["int8"]["gflops"] * 1e9) * 1e3
    best = t["shipped onnx-int8"]["best_round_ms"]
    gemm = prof["classes"]["int8 GEMMs (with activation quantization)"]["ms"] * best / prof["profiled_ms_per_run"]
    attn = f["attention"] / (r["peaks"]["fp32"]["gflops"] * 1e9) * 1e3
    others = "; ".join(
        f"{name} {g['ratio_quiet']:.2f}x (best round {g['best_round_ms'] / floor:.2f}x the floor)"
        for name, g in t.items()
        if name != "shipped onnx-int8"
    )
    agree = {v["name"]: v for v in load(agree_rel)["variants"]}
    plain = next(v for n, v in agree.items() if "nosmooth" in n)
    n = (plain.get("accuracy") or {}).get("n")
    return (
        f"{on(rel)}, `benchmarks/studies/int8_breakdown.py` (ORT's profiler, the other graphs timed interleaved; "
        f"{t['shipped onnx-int8']['quiet_rounds']} of {len(t['shipped onnx-int8']['rounds_ms'])} rounds quiet): "
        f"the int8 GEMM kernels take {num(gemm, 1)} ms of the shipped graph's best round ({num(best, 1)} ms, "
        f"{ratio(best / floor)} the floor), {ratio(gemm / floor)} the whole model's floor on their own; with fp32 "
        f"attention at the fp32 peak and every other op free it would be {ratio((gemm + attn) / floor)}. Against the "
        f"shipped graph in quiet rounds: {others}. Without smoothing, onnx-int8 of the embedded default agrees "
        f"{pct(plain['agreement'])} with fp32 on {n:,} test reviews, {pct(agree['onnx-int8']['agreement'])} with "
        f"it ({on(agree_rel)})."
    )


def _int8_candidates(r: dict[str, Any]) -> tuple[str, str, str]:
    """(batched, row by row, ...) names of the int8-invariance report: today's graph batched and row by row."""
    names = list(r["timing"])
    batched = next(n for n in names if n.startswith("today's graph, batched"))
    rows = next(n for n in names if n.startswith("today's graph, row by row"))
    return batched, rows, next(n for n in names if n.startswith("static QDQ"))


def int8_invariance_picked() -> str:
    """Why today's graph run row by row was picked, in the report's own numbers."""
    rel = "int8-invariance/embedded-default/report.json"
    r = load(rel)
    ag, t = r["agreement"], r["timing"]
    batched, rows, qdq = _int8_candidates(r)
    nbits = next(n for n in t if n.startswith("MatMulNBits"))
    amd = {v["name"]: v for v in load("embedded-default-full-test/report.json")["variants"]}["onnx-int8"]
    return (
        f"In this run ({on(rel)}) served alone its texts agree with fp32 more often than batched "
        f"({pct(ag[rows]['agreement'])} vs {pct(ag[batched]['agreement'])}: the padded batch's shared scale "
        f"costs accuracy too); MatMulNBits is {ratio(t[nbits]['b1_ratio_to_today'])} today's graph's b1 time; static "
        f"per-tensor scales lose {(ag[rows]['agreement'] - ag[qdq]['agreement']) * 100:.1f} points of agreement. "
        f"`{batched}` agreed {pct(ag[batched]['agreement'])} in batches of 32, not the "
        f"{pct(amd['agreement'])} of the AMD run's onnx-int8 "
        f"({on('embedded-default-full-test/report.json')}: another checkpoint, another machine)."
    )


def rows_side_by_side_text() -> str:
    """What running a batch's rows side by side bought over the one batched forward, and what that forward moved."""
    rel = "int8-invariance/rows-side-by-side/report.json"
    r = load(rel)
    texts = next(iter(r["sets"]))
    big = max(r["batches"])

    def rate(mode: str) -> float:
        return r["rates"][f"{texts}|b{big}|{mode}"]["texts_per_s"]

    gain = rate("rows, side by side") / rate("batched")
    return (
        f"Side by side beats even the batched forward it replaced here ({ratio(gain)} on {texts} at b{big}, "
        f"{on(rel)}), which also moved a probability by up to "
        f"{r['max_abs_dprob_vs_alone']['batched']:.2g}; both row modes moved nothing."
    )


def int8_invariance_base_dims() -> str:
    """The same candidates at DistilBERT-base dims: b1 against today's batched graph, b32 throughput, invariance."""
    rel = "int8-invariance/distilbert-base-dims/report.json"
    r = load(rel)
    t, inv = r["timing"], r["invariance"]
    batched, rows, _ = _int8_candidates(r)
    emb = load("int8-invariance/embedded-default/report.json")["timing"]
    eb, er, _ = _int8_candidates({"timing": emb})
    others = ", ".join(
        f"{n} {ratio(x['b1_ratio_to_today'], 3)}" for n, x in t.items() if n not in (batched, rows, "onnx-fp32")
    )
    moved = [n for n, x in inv.items() if x["max_abs_dprob"] and n != batched]
    return (
        f"{on(rel)}, {r['rounds']} interleaved rounds (random weights, speed and invariance only): today's graph "
        f"run row by row read **{ratio(t[rows]['b1_ratio_to_today'], 3)}** its batched self at b1/s128 "
        f"({num(t[rows]['b1_p50_ms'])} vs {num(t[batched]['b1_p50_ms'])} ms); {others}. On real reviews at b32 "
        f"row by row gives up throughput ({num(t[rows]['real_b32_texts_per_s'], 1)} vs "
        f"{num(t[batched]['real_b32_texts_per_s'], 1)} texts/s, "
        f"{ratio(t[rows]['real_b32_texts_per_s'] / t[batched]['real_b32_texts_per_s'])}), the price of exact answers, "
        f"as on the embedded default ({num(emb[er]['real_b32_texts_per_s'], 1)} vs "
        f"{num(emb[eb]['real_b32_texts_per_s'], 1)}). Batched, today's graph moved a probability by up to "
        f"{inv[batched]['max_abs_dprob']:.1e} there; "
        + ("every other candidate by 0." if not moved else "also moved: " + ", ".join(moved) + ".")
    )


def export_smoothing() -> str:
    """docs/export.md: what smoothing buys in agreement on the embedded default, and costs at DistilBERT-base dims."""
    agree_rel, rel = "int8-breakdown/smooth-off-agreement/report.json", "int8-breakdown/report.json"
    agree = {v["name"]: v for v in load(agree_rel)["variants"]}
    plain = next(v for n, v in agree.items() if "nosmooth" in n)
    off = load(rel)["timing"]["smooth off"]
    return (
        f"On the embedded default onnx-int8 agrees {pct(agree['onnx-int8']['agreement'])} with fp32 on "
        f"{plain['accuracy']['n']:,} test reviews with smoothing and {pct(plain['agreement'])} without "
        f"({on(agree_rel)}); at DistilBERT-base dims the graph without smoothing ran at "
        f"{ratio(off['ratio_quiet'])} the shipped graph's time in quiet rounds ({on(rel)})."
    )
