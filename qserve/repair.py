"""Repair: a quantized variant that misses its bar keeps its most sensitive layers in fp32 until it meets it.

    qserve export RUN/checkpoint --bits 8 --repair     # RUN/variants/onnx-int8, and onnx-int8-repaired if it misses
    qserve pipeline                                    # repairs a variant that could win and failed (docs/repair.md)

Layers ranked by how much each alone, back in fp32, brings the outputs to fp32's on training texts
(exporters/layers.py); the fewest most sensitive kept until agreement and accuracy meet the bars on the search's own
texts; then one export (keep_fp32), one sequential gate on held-out texts the search never saw.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

import exporters
from exporters.cli import exported
from exporters.layers import Layers, open_layers
from qserve import QserveError
from qserve import problemtypes as problems
from qserve.artifact import reseal
from qserve.configflags import add_flags, build
from qserve.files import now_iso
from qserve.gate.config import GateConfig, accuracy_drop
from qserve.gate.run import GateError, find_reference, judge, load, load_data, logits_of, pick, run_gate, truth
from qserve.placement import Plan
from qserve.variants import REFERENCES, bar_for
from qserve.verify import verify

log = logging.getLogger("qserve.repair")
SENSITIVITY_TEXTS = 64
"""Training texts of the user's data each layer's sensitivity is measured on (as many as the exporters calibrate on)."""
GATE_FLAGS = ("data", "split", "calibrate_on", "max_samples", "max_eval_samples", "seed", "reference", "looks")
"""The gate's flags `qserve export --repair` takes: the user's data, as `qserve gate` reads it."""


@dataclass
class RepairConfig:
    """What `qserve export --repair` is told besides the gate's data flags."""

    repair: bool = False
    """Where the variant misses its agreement bar (the bench's: 99% at 8/16/32 bits, 97% at 4) or loses more
    accuracy than its gate allows on the search's texts, export <name>-repaired beside it with its most sensitive
    layers in fp32, and gate that (docs/repair.md)."""
    repair_budget: float = 300.0
    """Seconds the ranking and the search may take; past them the closest candidate is exported, and says so."""
    search_texts: int = 1000
    """Labelled texts the search decides on: of the val split (train where the gate scores val), never the gate's."""


def distance(ref: np.ndarray, got: np.ndarray, problem: str) -> float:
    """How far `got` is from fp32's `ref`: the mean KL divergence of the softmax (single-label), else the mean
    squared difference of the scores."""
    if problem != problems.SINGLE:
        return float(np.mean((problems.scores(got, problem) - problems.scores(ref, problem)) ** 2))
    lp, lq = (z - z.max(1, keepdims=True) for z in (ref, got))
    lp, lq = (z - np.log(np.exp(z).sum(1, keepdims=True)) for z in (lp, lq))
    return float((np.exp(lp) * (lp - lq)).sum(1).mean())


def rank(layers: Layers, texts: Any, ref: np.ndarray, problem: str, deadline: float) -> list[dict[str, Any]]:
    """The quantized layers, most sensitive first: by how much putting each alone back in fp32 brings the outputs
    closer to fp32's (distance()); ties (no gain) and layers the deadline leaves unmeasured keep graph order."""
    layers.use([])
    base = distance(ref, logits_of(layers.rt, texts) - layers.shift, problem)
    gain: dict[str, float] = {}
    for name in layers.names:
        if time.monotonic() > deadline:
            break
        layers.use([name])
        gain[name] = base - distance(ref, logits_of(layers.rt, texts) - layers.shift, problem)
    order = sorted(layers.names, key=lambda n: -gain[n] if n in gain else float("inf"))  # a stable sort
    return [{"layer": n, "gain": gain.get(n)} for n in order]


def search(measure: Callable[[int], dict[str, Any]], n: int, deadline: float) -> int | None:
    """The fewest top-ranked layers (k) whose measure() meets the target: k = 1, 2, 4, ... up to n, then halving
    between the last miss and the first hit; None when none met it before the deadline."""
    lo, hi = 0, None
    for k in sorted({min(2**i, n) for i in range(n.bit_length() + 1)} - {0}):
        if time.monotonic() > deadline:
            return None
        if measure(k)["met"]:
            hi = k
            break
        lo = k
    while hi is not None and hi - lo > 1 and time.monotonic() <= deadline:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if measure(mid)["met"] else (mid, hi)
    return hi


def reference_of(variant: Path, checkpoint: Path, gate: GateConfig) -> Path:
    """The gate's fp32 reference beside the variant, exported there (torch-fp32) when there is none."""
    try:
        return find_reference(variant, gate.reference)
    except GateError:
        if gate.reference:
            raise
    reference = variant.parent / REFERENCES[0]
    print(f"   repair: exporting the fp32 reference {reference} to compare with", flush=True)
    exporters.export(checkpoint, REFERENCES[0], reference)
    return reference


def repair(
    variant: Path, checkpoint: Path, gate: GateConfig, cfg: RepairConfig, plan: Plan | None = None
) -> dict[str, Any]:
    """Repair `variant` if it misses its bars on the search's texts: {"variant", "needed", "before"} and, when
    needed, "dir" (<name>-repaired, its manifest's `repair` record holding the trace), "repair" and "gate"."""
    t0 = time.monotonic()
    deadline = t0 + cfg.repair_budget
    vm = verify(variant)
    if gate.split == "all":
        raise QserveError("repair searches on texts the gate does not score: gate one split (--split test)")
    reference = reference_of(variant, checkpoint, gate)
    splits, dataset, seed = load_data(gate, variant, vm)
    on = "train" if gate.split == "val" else "val"
    texts = pick(splits, on, cfg.search_texts, seed)
    calib = pick(splits, "train", SENSITIVITY_TEXTS, seed)
    rt = load(reference, gate)
    try:
        ref, ref_cal = logits_of(rt, texts), logits_of(rt, calib)
    finally:
        rt.close()
    problem, labels, bits = vm.problem, list(vm.labels), vm.spec.bits
    y, bar, drop = truth(texts, problem, len(labels)), bar_for(bits), accuracy_drop(bits)
    layers = open_layers(variant, checkpoint, gate.threads)
    trace: list[dict[str, Any]] = []
    try:
        order: list[str] = []

        def measure(k: int) -> dict[str, Any]:
            layers.use(order[:k])
            v = judge(problem, labels, ref, logits_of(layers.rt, texts) - layers.shift, y, bar, drop, gate.confidence)
            agr, delta = v["agreement"]["value"], v["accuracy"]["delta"]["value"]
            step = {"kept": order[:k], "agreement": agr, "accuracy_delta": delta, "met": agr >= bar and delta >= -drop}
            trace.append({**step, "seconds": round(time.monotonic() - t0, 1)})
            log.info("repair: %s with %d layer(s) in fp32: agreement %.2f%%", vm.name, k, 100 * agr)
            return step

        before = measure(0)
        out = {"variant": vm.name, "needed": not before["met"], "before": before}
        if before["met"]:
            return out
        ranking = rank(layers, calib, ref_cal, problem, deadline)
        order[:] = [r["layer"] for r in ranking]
        search(measure, len(order), deadline)
    finally:
        layers.close()
    # the step exported: the fewest layers that met the bars, else the one that came closest
    met = [s for s in trace if s["met"]]
    closest = min(met, key=lambda s: len(s["kept"])) if met else max(trace, key=lambda s: s["agreement"])
    ran_out = time.monotonic() > deadline
    why = f"the {cfg.repair_budget:g}s budget ran out" if ran_out else f"all {len(order)} layers in fp32 miss the bars"
    if not closest["kept"]:  # nothing to keep (the budget ran out first): no variant to write
        return {**out, "why": why}
    given = vm.spec.options.get("keep_fp32")
    options = {**vm.spec.options, "keep_fp32": ",".join([given, *closest["kept"]] if given else closest["kept"])}
    dest = variant.parent / f"{variant.name}-repaired"
    exporters.export(checkpoint, vm.name, dest, True, options, vm.export_device or "cpu", None, vm.long_text, vm.inputs)
    (result,) = run_gate([dest], gate, plan=plan)
    target = {"agreement": bar, "accuracy_drop": drop, "texts": {"dataset": dataset, "split": on, "n": len(texts)}}
    record = {
        "of": vm.name,
        "kept": closest["kept"],
        "reached": bool(met),
        "why": None if met else why,
        "target": target,
        "ranked_on": {"dataset": dataset, "split": "train", "n": len(calib)},
        "ranking": ranking,
        "trace": trace,
        "closest": closest,
        "seconds": round(time.monotonic() - t0, 1),
        "when": now_iso(),
    }
    reseal(dest, replace(verify(dest), records={**verify(dest).records, "repair": record}))
    return {**out, "dir": str(dest), "repair": record, "gate": result["gate"]}


def register(sub: argparse._SubParsersAction) -> None:
    """`qserve export --repair`: the export command (exporters/cli.py) with the repair's and the gate's data flags."""
    p = sub.choices["export"]
    add_flags(p, RepairConfig)
    add_flags(p, GateConfig, GATE_FLAGS)
    export = p.get_default("func")
    p.set_defaults(func=lambda args: cmd_export(args, export))


def cmd_export(args: argparse.Namespace, export: Callable[[argparse.Namespace], int]) -> int:
    cfg = build(RepairConfig, args, error=QserveError)
    if not cfg.repair:
        return export(args)
    if args.all:
        raise QserveError("--repair repairs one variant (--bits, --variant), not --all")
    gate = build(GateConfig, args, GATE_FLAGS, error=QserveError).validate()
    dirs, code = exported(args)
    for vdir in dirs if code == 0 else []:
        r = repair(vdir, Path(args.checkpoint), gate, cfg)
        print(f"{vdir}: {said(r)}")
        code = code or (0 if not r["needed"] or (r.get("gate") or {}).get("passed") else 1)
    return code


def said(r: dict[str, Any]) -> str:
    """One line on what repair() did (its command's and the pipeline's)."""
    head = f"agreement {r['before']['agreement']:.2%} with fp32 on the search's texts"
    if not r["needed"] or not r.get("repair"):
        return head + ("; meets its bars, not repaired" if not r["needed"] else f"; not repaired: {r['why']}")
    rec, g = r["repair"], r["gate"]
    return (
        f"{head}; {len(rec['kept'])} layer(s) kept in fp32: {rec['closest']['agreement']:.2%}"
        + ("" if rec["reached"] else f" ({rec['why']})")
        + f"; {Path(r['dir']).name}'s gate {g['decision']} at {g['n']} held-out texts"
        + (f": {'; '.join(g['reasons'])}" if g["reasons"] else "")
    )
