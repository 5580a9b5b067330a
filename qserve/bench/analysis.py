"""Turn child results into report entries: agreement with fp32, speed-up, distance to the floor.

    python -m pytest tests/unit/test_bench_report.py -q

Pure functions over JSON-shaped dicts; per-text predictions are dropped before report.json is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qserve.artifact import Manifest, ModelMeta
from qserve.bench import policies
from qserve.bench.floor import floor_ms, model_dims, peak_for
from qserve.bench.recommend import recommend
from qserve.benchreport import fixed_shape
from qserve.placement import mark
from qserve.problemtypes import AGREEMENT_METRIC, SINGLE, agreement
from qserve.variants import REFERENCES

MEMORY_KEYS = tuple(
    "peak_rss_mb peak_rss_load_mb rss_before_load_mb rss_after_load_mb model_rss_mb polled_peak_rss_mb".split()
)


@dataclass
class VariantMeta:
    """What the bench parent reads of a variant without loading it: manifest (or `manifest_error`), qserve_model.json,
    config.json (the floor's dims), sizes."""

    dir: str
    manifest: Manifest | None = None
    model: ModelMeta | None = None
    config: dict[str, Any] | None = None
    manifest_error: str | None = None
    disk_bytes: int | None = None
    weights_bytes: int | None = None


def variant_entry(meta: VariantMeta, res: dict[str, Any]) -> dict[str, Any]:
    manifest = meta.manifest
    spec = manifest.spec.to_json() if manifest is not None else {}

    entry: dict[str, Any] = {
        "name": res.get("name") or spec.get("name") or Path(meta.dir).name,
        "dir": meta.dir,
        "status": res.get("status", "failed"),
        "spec": spec or None,
        "model_name": manifest.model_name if manifest is not None else None,
        "parity": manifest.parity if manifest is not None else None,
        "disk_bytes": meta.disk_bytes,
        "weights_bytes": meta.weights_bytes,
        **{k: res.get(k) for k in ("load_s", "import_s", "wall_s", "device")},
        "memory": {k: res[k] for k in MEMORY_KEYS if res.get(k) is not None},
        "fixed": res.get("fixed") or [],
        "real_text": res.get("real_text") or [],
        **{k: res.get(k) for k in ("real_text_check", "stage_s", "invariance", "long_text", "long_text_policies")},
        **({"raced_out": res["raced_out"]} if res.get("raced_out") else {}),  # runner._race: measured once
        # CUDA only (measure.eager_beside_graphs): how a torch variant ran, and its eager fixed shapes beside it
        **{k: res[k] for k in ("execution", "fixed_eager") if res.get(k)},
        **({"isolation": res["isolation"]} if res.get("isolation") else {}),  # measured in the shared worker
        "accuracy": None,
        "agreement": None,
        "data": res.get("data"),
    }
    if manifest is not None and manifest.gate:  # `qserve gate`'s verdict: the recommendation then picks gated ones
        entry["gate"] = gate_entry(manifest.gate)
    if manifest is not None and manifest.records.get("repair"):  # what a repair kept in higher precision
        # beside the variant it repairs, under its own name
        entry.update(repair=manifest.records["repair"], name=f"{manifest.name}-repaired")
    if res.get("cuda"):
        entry["memory"]["cuda"] = res["cuda"]
    acc = res.get("accuracy")
    if acc:
        entry.update(_predictions=acc.get("predictions"), accuracy={k: v for k, v in acc.items() if k != "predictions"})
    if entry["status"] != "ok":
        entry.update({k: res.get(k) for k in ("error", "failure", "stage", "returncode", "traceback", "log_tail")})
        if meta.manifest_error:
            entry["manifest_error"] = meta.manifest_error
    return entry


def gate_entry(g: dict[str, Any]) -> dict[str, Any]:
    """What a report entry keeps of the verdict a manifest holds (`qserve gate`'s record)."""
    return {
        "passed": bool(g.get("passed")),
        "decision": g.get("decision") or ("passed" if g.get("passed") else "failed"),
        "agreement": (g.get("agreement") or {}).get("value"),
        "agreement_lower_bound": (g.get("agreement") or {}).get("lo"),
        "bar": (g.get("bar") or {}).get("agreement_lower_bound"),
        "n": g.get("n") or (g.get("data") or {}).get("n"),  # the texts that decided it
        "reasons": g.get("reasons") or [],
    }


def apply_gates(report: dict[str, Any], gates: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The report after a gate ran on some variants (`gates`: dir -> gate record): verdicts attached and the
    recommendation chosen again (recommend.py). Changed in place and returned."""
    for v in report["variants"]:
        g = gates.get(v.get("dir"))
        if g:
            v["gate"] = gate_entry(g)
    report["recommended"] = recommend(report)
    policies.finish(report)
    return report


def model_block(metas: list[VariantMeta]) -> dict[str, Any]:
    names: list[str] = sorted(
        n for n in {m.manifest.model_name for m in metas if m.manifest is not None} if n is not None
    )
    config = next((m.config for m in metas if m.config), None)
    block: dict[str, Any] = {"names": names, "name": names[0] if len(names) == 1 else ", ".join(names) or None}
    if config:
        try:
            block.update(dims=model_dims(config), model_type=config.get("model_type"))
        except ValueError as e:
            block["dims_error"] = str(e)
    return block


def _unique_names(variants: list[dict[str, Any]]) -> None:
    """The first variant keeps its spec name; a later one with the same name gets its directory added."""
    seen: set[str] = set()
    for v in variants:
        name = v["name"]
        if name in seen:
            p = Path(v["dir"])
            name = f"{v['name']} ({p.name})"
            if name in seen:
                name = f"{v['name']} ({p.parent.name}/{p.name})"
        seen.add(name)
        v["name"] = name


def agreement_with(v: dict[str, Any], ref: dict[str, Any] | None) -> float | None:
    """Agreement of v's predictions with the reference's on the same texts (the reference's first n)."""
    if ref is None or not v.get("_predictions") or not ref.get("_predictions"):
        return None
    a, r = v["accuracy"], ref["accuracy"]
    n = a.get("n")
    if (a.get("dataset"), a.get("seed")) != (r.get("dataset"), r.get("seed")) or not n or n > (r.get("n") or 0):
        return None
    return agreement(v["_predictions"], ref["_predictions"][:n], r.get("problem_type", SINGLE), r.get("label_range"))


def reference(variants: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The variant agreement is measured against: the first of REFERENCES (torch-fp32, onnx-fp32) with predictions."""
    ok = [v for v in variants if v.get("status") == "ok"]
    by_spec = {(v.get("spec") or {}).get("name"): v for v in reversed(ok)}
    return next((by_spec[n] for n in REFERENCES if n in by_spec and by_spec[n].get("_predictions")), None)


def finish(report: dict[str, Any]) -> dict[str, Any]:
    """Fill agreement, speed-up and floor fields in place; drop predictions."""
    variants = report["variants"]
    _unique_names(variants)
    ok = [v for v in variants if v["status"] == "ok"]
    by_spec = {(v.get("spec") or {}).get("name"): v for v in reversed(ok)}  # first one wins

    # agreement: against the first reference found on the very same test texts
    ref = reference(variants)
    report["agreement_reference"] = ref["name"] if ref else None
    for v in ok:
        v["agreement"] = agreement_with(v, ref)
    if ref is not None and ref["accuracy"].get("problem_type", SINGLE) != SINGLE:
        report["agreement_metric"] = AGREEMENT_METRIC[ref["accuracy"]["problem_type"]]

    policies.add_agreement(variants, ref)  # per policy, against the reference under the same policy
    for v in variants:
        v.pop("_predictions", None)

    # speed-up at the headline shape, against the first reference (torch-fp32) measured in this run
    b, s = report["headline"]["batch"], report["headline"]["seq"]
    base = by_spec.get(REFERENCES[0])
    base_stats = fixed_shape(base, b, s) if base else None
    report["speedup_reference"] = base["name"] if base and base_stats else None
    for v in variants:
        st = fixed_shape(v, b, s)
        v["speedup_vs_torch_fp32"] = (base_stats["p50"] / st["p50"]) if (st and base_stats) else None

    # distance to the compute floor at the headline shape: against the machine's peak, and
    # against the best rate measured on the model's own GEMM shapes (a gentler, workload-matched bound)
    floor = report.get("floor") or {}
    flops = ((floor.get("flops_per_sequence") or {}).get(str(s)) or {}).get("total")
    run_device = (report.get("config") or {}).get("device")
    for v in variants:
        v["floor"] = None
        st = fixed_shape(v, b, s)
        dtype = (v.get("spec") or {}).get("dtype")
        if not (flops and dtype) or mark(v.get("device"), run_device):
            continue  # the floor's peaks are the run device's: a variant that ran on another one has none here
        rec: dict[str, Any] = {}
        for key, prefix in (("peaks", ""), ("model_peaks", "model_")):
            pk = peak_for(dtype, floor.get(key) or {})
            if pk:
                fm = floor_ms(flops, b, pk[1])
                names = [prefix + k for k in ("peak", "gflops", "floor_ms", "p50_over_floor")]
                rec.update(zip(names, (pk[0], pk[1], fm, (st["p50"] / fm) if st else None)))
        v["floor"] = rec or None

    report["recommended"] = recommend(report)
    policies.finish(report)
    return report
