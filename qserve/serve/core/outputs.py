"""The answer every label-per-text protocol shares, by the model's problem type, and the threshold it is read at.

    curl -s -d '{"inputs": ["goal in the last minute"], "threshold": 0.4}' 127.0.0.1:8000/v1/classify

label_scores, per text (the HF text-classification pipeline's shape; every protocol that answers labels, and
`qserve predict`):
single-label   [{label, score}] best first (softmax)
multi-label    every label {label, score, on} best first (sigmoid; on: score >= threshold)
regression     [{"label": "value", "score": v}]
KServe V2's tensors are its own (protocols/v2/tensors.py). The threshold is the request's `threshold`, else the
variant's
calibrated per-label thresholds (`qserve gate` records them in its manifest), else --threshold (default 0.5); a
threshold sent to a model that is not multi-label is refused (422). A calibrated single-label variant's scores are
the softmax of logits / its temperature (the runtime applies it: qserve/runtime/base.py scores()).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from qserve import problemtypes as problems
from qserve.serve.infra.errors import ApiError

Threshold = float | tuple[float, ...]
"""One threshold for every label, or one per label (in label order: a calibrated variant's, from its manifest)."""


def request_threshold(
    problem: str, value: float | None, default: float, model: str, calibrated: tuple[float, ...] | None = None
) -> Threshold | None:
    """The threshold a request is answered at (multi-label only; None for the others): the request's own,
    else the variant's calibrated per-label thresholds (`qserve gate`), else --threshold."""
    if problem != problems.MULTI:
        if value is not None:
            kind = "single-label" if problem == problems.SINGLE else "a regression model"
            raise ApiError(
                422, f"threshold applies to multi-label models only; model {model!r} is {kind}: leave threshold out"
            )
        return None
    if value is not None:
        return value
    return calibrated if calibrated is not None else default


def label_scores(
    scores: np.ndarray, labels: list[str], problem: str, top_k: int | None, threshold: Threshold | None
) -> list[list[dict[str, Any]]]:
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
