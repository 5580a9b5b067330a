"""What a served model answers, by its problem type: /v1 predictions and the V2 (HTTP and gRPC) outputs.

    curl -s -d '{"inputs": ["goal in the last minute"], "threshold": 0.4}' 127.0.0.1:8000/v1/classify

single-label   /v1 [{label, score}] best first (softmax);   V2 probabilities FP32 [n, k], label BYTES [n]
multi-label    /v1 every label {label, score, on} best first (sigmoid; on: score >= threshold);
               V2 probabilities FP32 [n, k] (the sigmoid per label)
regression     /v1 [{"label": "value", "score": v}];          V2 value FP32 [n, 1]
and V2 truncated BOOL [n] for every model. The threshold is the request's `threshold`, else the variant's
calibrated per-label thresholds (`qserve gate` records them in its manifest), else --threshold (default 0.5); a
threshold sent to a model that is not multi-label is refused (422). A calibrated single-label variant's scores are
the softmax of logits / its temperature (the runtime applies it: qserve/runtime/base.py scores()).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from qserve import problemtypes as problems
from qserve.serve.core.errors import ApiError

if TYPE_CHECKING:
    from qserve.artifact import Manifest

OUTPUTS = {problems.SINGLE: ("probabilities", "label", "truncated"),
           problems.MULTI: ("probabilities", "truncated"),
           problems.REGRESSION: ("value", "truncated")}
"""V2 output names per problem type, in the order they are answered when a request names none."""


def output_names(problem: str) -> tuple[str, ...]:
    return OUTPUTS[problem]


def check_outputs(problem: str, names: list[str], model: str) -> None:
    """422 naming the first requested output this model does not have, and the ones it has."""
    have = output_names(problem)
    for i, name in enumerate(names):
        if name not in have:
            raise ApiError(422, f"outputs[{i}].name is {name!r}; model {model!r} ({problems.short(problem)}) has "
                                f"outputs {', '.join(have)}")


Threshold = float | tuple[float, ...]
"""One threshold for every label, or one per label (in label order: a calibrated variant's, from its manifest)."""


def request_threshold(problem: str, value: float | None, default: float, model: str,
                      calibrated: tuple[float, ...] | None = None) -> Threshold | None:
    """The threshold a /v1 request is answered at (multi-label only; None for the others): the request's own,
    else the variant's calibrated per-label thresholds (`qserve gate`), else --threshold."""
    if problem != problems.MULTI:
        if value is not None:
            kind = "single-label" if problem == problems.SINGLE else "a regression model"
            raise ApiError(422, f"threshold applies to multi-label models only; model {model!r} is {kind}: "
                                "leave threshold out")
        return None
    if value is not None:
        return value
    return calibrated if calibrated is not None else default


def threshold_fields(labels: list[str], threshold: Threshold | None) -> dict[str, Any]:
    """/v1's record of the threshold applied: `threshold` (one for all), `thresholds` (label -> its own), or none."""
    if threshold is None:
        return {}
    if isinstance(threshold, tuple):
        return {"thresholds": dict(zip(labels, threshold))}
    return {"threshold": threshold}


def v1_predictions(scores: np.ndarray, labels: list[str], problem: str, top_k: int | None,
                   threshold: Threshold | None) -> list[list[dict[str, Any]]]:
    """Per text: [{label, score}] best first (top_k of them), plus `on` per label for multi-label;
    regression: [{"label": "value", "score": v}] (one entry per output)."""
    out = []
    for row in scores:
        if problem == problems.REGRESSION:
            names = [problems.REGRESSION_LABEL] if len(row) == 1 else labels
            out.append([{"label": names[j], "score": float(v)} for j, v in enumerate(row)])
            continue
        order = np.argsort(-row, kind="stable")[: (top_k or len(labels))]
        if problem == problems.MULTI:
            thr = problems.DEFAULT_THRESHOLD if threshold is None else threshold
            per = thr if isinstance(thr, tuple) else (thr,) * len(labels)
            out.append([{"label": labels[j], "score": float(row[j]), "on": bool(row[j] >= per[j])} for j in order])
        else:
            out.append([{"label": labels[j], "score": float(row[j])} for j in order])
    return out


def v2_values(problem: str, labels: list[str], scores: np.ndarray,
              truncated: list[bool]) -> dict[str, tuple[dict[str, Any], Any]]:
    """Every V2 output of this problem type by name: (tensor meta {name, datatype, shape}, values)."""
    n, k = scores.shape
    out: dict[str, tuple[dict[str, Any], Any]] = {}
    if problem == problems.REGRESSION:
        out["value"] = ({"name": "value", "datatype": "FP32", "shape": [n, k]}, scores)
    else:
        out["probabilities"] = ({"name": "probabilities", "datatype": "FP32", "shape": [n, k]}, scores)
    if problem == problems.SINGLE:
        out["label"] = ({"name": "label", "datatype": "BYTES", "shape": [n]}, [labels[j] for j in scores.argmax(axis=1)])
    out["truncated"] = ({"name": "truncated", "datatype": "BOOL", "shape": [n]}, truncated)
    return out


def v2_metadata_outputs(problem: str, k: int) -> list[dict[str, Any]]:
    """The model metadata's outputs (GET /v2/models/{name}, gRPC ModelMetadata)."""
    meta = {"probabilities": {"datatype": "FP32", "shape": [-1, k]}, "value": {"datatype": "FP32", "shape": [-1, k]},
            "label": {"datatype": "BYTES", "shape": [-1]}, "truncated": {"datatype": "BOOL", "shape": [-1]}}
    return [{"name": name, **meta[name]} for name in output_names(problem)]


def v2_config_outputs(problem: str, k: int) -> list[dict[str, Any]]:
    """The Triton-style model configuration's outputs (GET /v2/models/{name}/config, gRPC ModelConfig)."""
    types = {"FP32": "TYPE_FP32", "BYTES": "TYPE_STRING", "BOOL": "TYPE_BOOL"}
    return [{"name": o["name"], "data_type": types[o["datatype"]], "dims": o["shape"]}
            for o in v2_metadata_outputs(problem, k)]


def publish_outputs(comps: dict[str, Any], manifest: Manifest | None) -> None:
    """In the OpenAPI document, what the served variant (read from its manifest, so the document is right
    before the model has loaded) answers: the V2 output names of its problem type, and a `threshold` only a
    multi-label model takes (null for the others)."""
    if manifest is None:
        return  # no readable manifest (several models, a model dir, a repository): every name stays
    problem = manifest.problem
    name = ((comps.get("V2RequestedOutput") or {}).get("properties") or {}).get("name")
    if isinstance(name, dict) and "enum" in name:
        name["enum"] = list(output_names(problem))
    threshold = ((comps.get("ClassifyRequest") or {}).get("properties") or {}).get("threshold")
    if problem != problems.MULTI and isinstance(threshold, dict) and "anyOf" in threshold:
        threshold["anyOf"] = [alt for alt in threshold["anyOf"] if alt.get("type") == "null"]
