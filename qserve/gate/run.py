"""The gate's run: score the reference and each variant on the same labelled texts, judge on bounds, calibrate.

    qserve gate models/minilm-l6-distilbert-imdb/variants/onnx-int8 --out benchmarks/reports/gate

Raw logits through the served Runtime (so an old calibration does not bias the judgement); the reference is
scored once; calibration is fitted on another split than the verdict's.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from qserve import QserveError, __version__
from qserve import problemtypes as problems
from qserve.artifact import Manifest, read_manifest, read_model_meta, reseal
from qserve.data.datasets import DatasetSplits, Split, load_dataset, stratified_subsample
from qserve.devices import cpu_info, resolve_device
from qserve.files import now_iso
from qserve.gate import stats
from qserve.gate.config import MIN_CLASS_TEXTS, GateConfig, accuracy_drop, agreement_bar
from qserve.placement import Plan
from qserve.runtime import RuntimeOptions, load_runtime
from qserve.variants import REFERENCES
from qserve.verify import verify

log = logging.getLogger("qserve.gate")
FORMAT = "qserve-gate/1"
PASSED, FAILED, UNDECIDED = "passed", "failed", "undecided"
"""The gate's decisions: undecided while an interval straddles a bar (more texts could decide it)."""


class GateError(QserveError):
    """Input the gate cannot judge: labels that are not the model's, a reference of another checkpoint, ..."""


@dataclass
class Scored:
    """One model's raw logits [n, k] on the gate's texts (and on the calibration texts, when fitted), and the
    device that computed them."""

    logits: np.ndarray
    calibration: np.ndarray | None = None
    device: str = "cpu"
    long_text: str = "head"
    """The long-text policy the texts were scored under, written out (what the verdict holds for)."""


# -- which reference, which data --------------------------------------------------------------------------


def find_reference(variant: Path, given: str | None) -> Path:
    """--reference, else the first of REFERENCES (torch-fp32, onnx-fp32) beside the variant; an error names
    --reference otherwise."""
    if given:
        return Path(given)
    for name in REFERENCES:
        cand = variant.parent / name
        if (cand / "manifest.json").is_file():
            return cand
    raise GateError(
        f"no fp32 reference beside {variant} ({' or '.join(str(variant.parent / n) for n in REFERENCES)} "
        f"is missing); pass --reference DIR, the {' or '.join(REFERENCES)} export of the same checkpoint"
    )


def check_same_checkpoint(variant: Path, vm: Manifest, reference: Path, rm: Manifest) -> None:
    """The reference must be an export of the very checkpoint the variant came from (same source hash)."""
    vs, rs = (vm.source or {}).get("sha256"), (rm.source or {}).get("sha256")
    if not vs or not rs or vs != rs:
        raise GateError(
            f"{variant} was exported from checkpoint {vs or '(unrecorded)'} ({(vm.source or {}).get('path')}) "
            f"but the reference {reference} from {rs or '(unrecorded)'} ({(rm.source or {}).get('path')}): "
            "a gate compares a variant with the fp32 export of the same checkpoint; pass --reference with "
            "that one (qserve export CHECKPOINT --backend torch --dtype fp32)"
        )
    if list(vm.labels) != list(rm.labels) or vm.problem != rm.problem:
        raise GateError(
            f"{variant} (labels {list(vm.labels)}, {vm.problem}) and the reference {reference} (labels "
            f"{list(rm.labels)}, {rm.problem}) do not answer the same question"
        )


def load_data(cfg: GateConfig, variant: Path, manifest: Manifest) -> tuple[DatasetSplits, str, int]:
    """(the splits, the dataset name, the seed): --data, else the checkpoint's own dataset (qserve_model.json),
    rebuilt with its seed and max_eval_samples so the test split is the one training held out."""
    meta = read_model_meta(variant)
    dataset = cfg.data or (meta.dataset if meta else None)
    if not dataset:
        raise GateError(
            f"{variant}/qserve_model.json names no dataset (a checkpoint qserve did not train); pass "
            "--data FILE (any dataset `qserve train` reads)"
        )
    seed = cfg.seed if cfg.seed is not None else (meta.seed if meta and meta.seed is not None else 42)
    if cfg.max_eval_samples is not None:
        max_eval: int | None = cfg.max_eval_samples
    else:
        max_eval = (meta.max_eval_samples if meta else None) if cfg.data is None else None
    splits = load_dataset(dataset, seed=seed, max_eval_samples=max_eval, problem_type=manifest.problem)
    if list(splits.labels) != list(manifest.labels) or splits.problem_type != manifest.problem:
        raise GateError(
            f"--data {dataset}: its labels are {list(splits.labels)} ({problems.short(splits.problem_type)}), "
            f"the model's are {list(manifest.labels)} ({problems.short(manifest.problem)}); a gate needs "
            "data labelled with the model's own labels, in the model's problem type"
        )
    return splits, dataset, seed


def pick(splits: DatasetSplits, name: str, cap: int | None, seed: int) -> Split:
    """A split by name (`all`: train + val + test), capped to `cap` texts (seeded, stratified)."""
    if name == "all":
        parts = [splits.train, splits.val, splits.test]
        pairs = None if any(p.pairs is None for p in parts) else [x for p in parts for x in p.pairs or []]
        split = Split([t for p in parts for t in p.texts], [lab for p in parts for lab in p.labels], pairs)
    else:
        split = getattr(splits, name)
    return split if cap is None else stratified_subsample(split, cap, seed, f"gate-{name}")


def fingerprint(split: Split) -> str:
    """sha256 over the texts, their pairs and their labels, in order: which data a verdict is about."""
    body = json.dumps([split.texts, split.pairs, [list(x) if isinstance(x, tuple) else x for x in split.labels]])
    return hashlib.sha256(body.encode()).hexdigest()


def truth(split: Split, problem: str, k: int) -> np.ndarray:
    """The labels as arrays: class ids [n], multi-hot [n, k], or values [n]."""
    if problem == problems.MULTI:
        return np.array([problems.multi_hot(lab, k) for lab in split.labels], dtype=bool).reshape(len(split), k)
    if problem == problems.REGRESSION:
        return np.array([float(x) for x in split.labels], dtype=np.float64)  # type: ignore[arg-type]
    return np.array([int(x) for x in split.labels], dtype=int)  # type: ignore[arg-type]


# -- scoring ---------------------------------------------------------------------------------------------


def logits_of(rt: Any, split: Split, batch: int = 32) -> np.ndarray:
    """Raw logits [n, k] of every text, in order: batches of similar length (the answers do not depend on the
    batch: one text, one answer), under the variant's own long-text policy."""
    order = sorted(range(len(split)), key=lambda i: (-len(split.texts[i]), i))
    out: np.ndarray | None = None
    for start in range(0, len(order), batch):
        idx = order[start : start + batch]
        pairs = None if split.pairs is None else [split.pairs[i] for i in idx]
        got = np.asarray(rt.logits([split.texts[i] for i in idx], None, pairs), dtype=np.float64)
        if out is None:
            out = np.empty((len(split), got.shape[1]), dtype=np.float64)
        out[idx] = got
    return out if out is not None else np.zeros((0, len(rt.labels)))


def load(path: Path, cfg: GateConfig, device: str | None = None) -> Any:
    """The variant's runtime on `device` (a plan's), else on --device (auto: where the variant runs here)."""
    options = RuntimeOptions(threads=cfg.threads, long_text=cfg.long_text)
    return load_runtime(path, device or cfg.device, options, allow_extra_files=cfg.allow_extra_files)


def score(path: Path, cfg: GateConfig, gate: Split, calib: Split | None, device: str | None = None) -> Scored:
    rt = load(path, cfg, device)
    try:
        return Scored(
            logits_of(rt, gate), None if calib is None else logits_of(rt, calib), rt.device, str(rt.long_text)
        )
    finally:
        rt.close()


# -- the judgement ---------------------------------------------------------------------------------------


def _agreed(k: int, n: int, confidence: float) -> stats.Interval:
    """k texts agreeing of n: the share and its Wilson interval."""
    return stats.Interval(k / max(n, 1), *stats.wilson(k, n, confidence))


def _label_row(name: str, n: int, k: int, confidence: float) -> dict[str, Any]:
    """One label's row of per_class: its texts, their agreement (k of n) and the flips."""
    return {"label": name, "n": n, "agreement": _agreed(k, n, confidence).to_json(), "flips": n - k}


def judge(
    problem: str,
    labels: list[str],
    ref: np.ndarray,
    var: np.ndarray,
    y: np.ndarray,
    bar: float,
    drop: float,
    confidence: float,
    span: float | None = None,
) -> dict[str, Any]:
    """Agreement, the accuracy delta and per-class agreement, each with its interval, and the verdict (per problem
    type: docs/gate.md)."""
    n = len(y)
    out: dict[str, Any] = {"n": n, "metric": problems.AGREEMENT_METRIC[problem]}
    reasons: list[str] = []
    per: list[dict[str, Any]] = []
    if problem == problems.REGRESSION:
        span = span or problems.value_range(list(y)) or 1.0
        err = np.abs(var[:, 0] - ref[:, 0]) / span
        mean, lo, hi = stats.paired_bootstrap(err, np.zeros_like(err), confidence)
        agr = stats.Interval(1 - mean, 1 - hi, 1 - lo)
        trials = n
        gain = (np.abs(ref[:, 0] - y) - np.abs(var[:, 0] - y)) / span  # > 0: the variant errs less
        delta = stats.Interval(*stats.paired_bootstrap(gain, np.zeros_like(gain), confidence))
        out["accuracy"] = {
            "metric": "reduction of mean |error| / label range",
            "span": span,
            "reference_mae": float(np.abs(ref[:, 0] - y).mean()),
            "variant_mae": float(np.abs(var[:, 0] - y).mean()),
            "delta": delta.to_json(),
        }
        need = 30  # the bootstrap's interval means little on fewer texts
    else:
        if problem == problems.MULTI:
            ron, von = stats.sigmoid(ref) >= 0.5, stats.sigmoid(var) >= 0.5
            same = ron == von
            k, trials = int(same.sum()), same.size
            per += [_label_row(name, n, int(same[:, j].sum()), confidence) for j, name in enumerate(labels)]
            rc, vc = (ron == y).mean(axis=1), (von == y).mean(axis=1)
            metric = "per-text label accuracy"
        else:
            rp, vp = ref.argmax(1), var.argmax(1)
            same = rp == vp
            k, trials = int(same.sum()), n
            for j, name in enumerate(labels):
                sel = rp == j
                per.append(_label_row(name, int(sel.sum()), int(same[sel].sum()), confidence))
            rc, vc = (rp == y).astype(float), (vp == y).astype(float)
            metric = "accuracy"
            out["mcnemar"] = stats.mcnemar(vc, rc)
        agr = _agreed(k, trials, confidence)
        delta = stats.Interval(*stats.paired_bootstrap(vc, rc, confidence))
        out["accuracy"] = {
            "metric": metric,
            "reference": float(rc.mean()) if n else None,
            "variant": float(vc.mean()) if n else None,
            "delta": delta.to_json(),
        }
        need = stats.min_n(bar, confidence)
        judged = [p for p in per if p["n"] >= MIN_CLASS_TEXTS]
        for p in judged:
            if p["agreement"]["hi"] < bar:
                reasons.append(
                    f"{'label' if problem == problems.MULTI else 'class'} {p['label']!r}: agreement "
                    f"{p['agreement']['value']:.2%}, upper bound {p['agreement']['hi']:.2%} < bar {bar:.0%} "
                    f"({p['flips']} of {p['n']} flipped)"
                )
        if per:
            worst = min(judged or per, key=lambda p: p["agreement"]["lo"])
            out["worst_class"] = {"label": worst["label"], **worst["agreement"], "n": worst["n"]}
    out["agreement"] = {**agr.to_json(), "agree": None if problem == problems.REGRESSION else k, "of": trials}
    out.update(per_class=per, min_n=need)
    failed = bool(reasons) or agr.hi < bar or delta.hi < -drop  # a bound beyond the bar: more texts cannot help
    if trials < need:
        reasons.insert(
            0,
            f"too few texts: {trials} {'(text, label) pairs' if problem == problems.MULTI else 'texts'}, "
            f"but even 100% agreement needs {need} for its {100 * confidence:.4g}% lower bound to reach the bar "
            f"{bar:.0%}; gate on more data (--data, --split, --max-samples)",
        )
    if agr.lo < bar:
        reasons.append(f"agreement {agr.value:.2%}, lower bound {agr.lo:.2%} < bar {bar:.0%}")
    if delta.lo < -drop:
        reasons.append(
            f"{out['accuracy']['metric']} delta {delta.value:+.2%}, lower bound {delta.lo:+.2%} < -{drop:.0%}"
        )
    out.update(decision=PASSED if not reasons else FAILED if failed else UNDECIDED, passed=not reasons, reasons=reasons)
    return out


def calibrate(problem: str, var: Scored, y_gate: np.ndarray, y_cal: np.ndarray | None) -> dict[str, Any] | None:
    """Fit on the held-out texts, report on the gate's: a temperature (single-label), per-label thresholds
    (multi-label), or None (regression)."""
    if problem == problems.REGRESSION or var.calibration is None or y_cal is None or not len(y_cal):
        return None
    if problem == problems.MULTI:
        ps = stats.sigmoid(var.logits)
        thresholds = stats.fit_thresholds(stats.sigmoid(var.calibration), y_cal)
        e = stats.ece(ps, y_gate)
        return {
            "thresholds": thresholds,
            "ece": {"before": e, "after": e},
            "macro_f1": {
                "at_0.5": stats.macro_f1(ps, y_gate, 0.5),
                "at_thresholds": stats.macro_f1(ps, y_gate, np.array(thresholds)),
            },
        }
    t = stats.fit_temperature(var.calibration, y_cal)
    before, after = stats.softmax(var.logits), stats.softmax(var.logits, t)
    hit = before.argmax(1) == y_gate
    return {
        "temperature": t,
        "ece": {"before": stats.ece(before.max(1), hit), "after": stats.ece(after.max(1), hit)},
        "nll": {"before": stats.nll(var.logits, y_gate), "after": stats.nll(var.logits, y_gate, t)},
    }


def machine(device: str) -> dict[str, Any]:
    out: dict[str, Any] = {"device": device, "cpu": cpu_info().get("model")}
    if device.startswith("cuda"):
        import torch

        out["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return out


def pool_of(first: Split, whole: Split) -> Split:
    """The texts the sequential gate may score, in order: the first look's, then the rest of the whole split."""

    def keys(s: Split) -> list[tuple[str, str | None]]:
        return list(zip(s.texts, s.pairs if s.pairs is not None else [None] * len(s)))

    seen = set(keys(first))
    rest = whole.take([i for i, t in enumerate(keys(whole)) if t not in seen])
    pairs = None if first.pairs is None else first.pairs + (rest.pairs or [])
    return Split(first.texts + rest.texts, first.labels + rest.labels, pairs)


def grow(have: Scored | None, path: Path, cfg: GateConfig, pool: Split, n: int, calib: Split | None, device: Any):
    """`path`'s logits on the pool's first `n` texts at least, scoring only those not scored yet (the calibration
    texts with the first)."""
    done = 0 if have is None else len(have.logits)
    if have is not None and done >= n:
        return have
    got = score(path, cfg, pool.take(list(range(done, n))), calib if have is None else None, device)
    return got if have is None else replace(have, logits=np.concatenate([have.logits, got.logits]))


def run_gate(
    variants: list[Path], cfg: GateConfig, until_pass: int = 0, plan: Plan | None = None
) -> list[dict[str, Any]]:
    """Gate each variant against its reference, record verdict and calibration in its manifest (unless cfg.record is
    False), return the results in order. until_pass: stop once that many passed (0: never); `plan`: each variant's
    device."""
    cfg.validate()
    if not variants:
        raise GateError("qserve gate needs at least one VARIANT dir")
    resolve_device(cfg.device)  # a bad --device, or cuda without a GPU, fails before any text is scored
    results, passes = [], 0
    refs: dict[tuple[str, str, str], Scored] = {}
    datasets: dict[tuple[str, str], tuple[DatasetSplits, str, int, Split, int]] = {}
    for vdir in map(Path, variants):
        vm = verify(vdir, allow_extra_files=cfg.allow_extra_files)  # a tampered variant is not gated
        rdir = find_reference(vdir, cfg.reference)
        rm = read_manifest(rdir)
        check_same_checkpoint(vdir, vm, rdir, rm)
        if vdir.resolve() == rdir.resolve():
            log.info("gate: %s is the reference; nothing to compare", vdir)
            continue
        dkey = (str(cfg.data), str((vm.source or {}).get("sha256")))
        if dkey not in datasets:
            splits, dataset, seed = load_data(cfg, vdir, vm)
            first = pick(splits, cfg.split, cfg.max_samples, seed)
            pool = first
            if cfg.looks > 1:  # the looks after the first read the rest of the split, uncapped
                whole = load_dataset(dataset, seed=seed, problem_type=vm.problem)
                pool = pool_of(first, pick(whole, cfg.split, None, seed))
            datasets[dkey] = (splits, dataset, seed, pool, len(first))
        splits, dataset, seed, pool, first_n = datasets[dkey]
        cal_split = (
            None if cfg.calibrate_on == "none" else pick(splits, cfg.calibrate_on, cfg.max_calibration_samples, seed)
        )
        problem, labels = vm.problem, list(vm.labels)
        bits = vm.spec.bits
        bar = cfg.bar if cfg.bar is not None else agreement_bar(bits)
        drop = cfg.max_accuracy_drop if cfg.max_accuracy_drop is not None else accuracy_drop(bits)
        sizes = stats.looks(first_n, len(pool), cfg.looks)
        conf = stats.look_confidence(cfg.confidence, len(sizes))
        rkey = (str(rdir.resolve()), fingerprint(pool), str(cfg.long_text))
        y_all = truth(pool, problem, len(labels))
        meta = read_model_meta(vdir)
        span = meta.label_range if meta else None
        var: Scored | None = None
        looks: list[dict[str, Any]] = []
        t0 = time.monotonic()
        for k, n in enumerate(sizes):
            log.info("gate: look %d of %d: %s and its reference on %d texts", k + 1, len(sizes), vdir, n)
            refs[rkey] = grow(refs.get(rkey), rdir, cfg, pool, n, None, plan.device_of(rm.name) if plan else None)
            var = grow(var, vdir, cfg, pool, n, cal_split, plan.device_of(vm.name) if plan else None)
            y = y_all[:n]
            verdict = judge(problem, labels, refs[rkey].logits[:n], var.logits, y, bar, drop, conf, span)
            spent, nxt = time.monotonic() - t0, sizes[k + 1] if k + 1 < len(sizes) else None
            agreement, delta = verdict["agreement"], verdict["accuracy"]["delta"]
            looks.append({"n": n, "decision": verdict["decision"], "agreement": agreement, "accuracy_delta": delta})
            looks[-1]["seconds"] = round(spent, 2)
            late = nxt is not None and cfg.time_budget is not None and spent * nxt / n > cfg.time_budget
            if verdict["decision"] != UNDECIDED or nxt is None or late:
                if verdict["decision"] == UNDECIDED:
                    verdict["reasons"].append(
                        f"undecided at {n} texts: "
                        + (
                            f"the next look ({nxt} texts) would pass the --time-budget of {cfg.time_budget:g}s"
                            if late
                            else f"every text of the {cfg.split} split is scored"
                            if n == len(pool)
                            else f"the last of {len(sizes)} planned looks"
                        )
                    )
                break
        assert var is not None
        cal = calibrate(problem, var, y, None if cal_split is None else truth(cal_split, problem, len(labels)))
        scored = pool.take(list(range(n)))
        data = {"dataset": dataset, "split": cfg.split, "seed": seed, "n": n, "fingerprint": fingerprint(scored)}
        record = {
            "format": FORMAT,
            "passed": verdict.pop("passed"),
            "reasons": verdict.pop("reasons"),
            "decision": verdict.pop("decision"),
            "n": n,
            "bar": {
                "agreement_lower_bound": bar,
                "max_accuracy_drop": drop,
                "confidence": cfg.confidence,
                "min_n": verdict.pop("min_n"),
            },
            "sequential": {
                "rule": f"up to {len(sizes)} looks, each at {conf:.4%} two-sided confidence: the one-sided "
                f"{(1 - cfg.confidence) / 2:g} at each bar split equally over the planned looks (Bonferroni)",
                "planned": sizes,
                "per_look_confidence": conf,
                "looks": looks,
            },
            "data": data,
            # the verdict holds for the variant served under this policy (qserve.gatepolicy.verdict_for)
            "long_text": var.long_text,
            **verdict,
            "reference": {"dir": str(rdir), "name": rm.name, "version": rm.version, "device": refs[rkey].device},
            "calibration": None
            if cal is None
            else {k: v for k, v in cal.items() if k not in ("temperature", "thresholds")},
            "when": now_iso(),
            "machine": machine(var.device),
            "qserve": __version__,
        }
        calibration: dict[str, Any] | None = None
        if cal is not None and cal_split is not None:
            fitted = {
                "dataset": dataset,
                "split": cfg.calibrate_on,
                "seed": seed,
                "n": len(cal_split),
                "fingerprint": fingerprint(cal_split),
            }
            calibration = {k: cal[k] for k in ("temperature", "thresholds") if k in cal}
            calibration["fitted_on"] = fitted
            record["calibration"]["fitted_on"] = fitted
        if cfg.record:
            vm = verify(vdir, allow_extra_files=cfg.allow_extra_files)  # unchanged since it was scored
            reseal(
                vdir, replace(vm, gate=record, calibration=calibration if calibration is not None else vm.calibration)
            )
        results.append(
            {
                "variant": vm.name,
                "dir": str(vdir),
                "spec": vm.spec.to_json(),
                "problem_type": problem,
                "labels": labels,
                "gate": record,
                "calibration": calibration,
            }
        )
        log.info("gate: %s %s at %d texts: %s", vm.name, record["decision"], n, "; ".join(record["reasons"]) or "-")
        passes += bool(record["passed"])
        if until_pass and passes >= until_pass:
            break
    return results
