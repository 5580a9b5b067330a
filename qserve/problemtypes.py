"""Problem types: what a classifier's logits mean, and how its answers are scored and compared.

    python -c "import numpy as np; from qserve.problemtypes import scores; \\
print(scores(np.array([[0.0, 2.0]]), 'multi_label_classification'))"

single_label_classification (softmax), multi_label_classification (a sigmoid per label, on at a threshold) and
regression (the logit is the value), named as in a Hugging Face config.json; agreement per type: docs/problem-types.md.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from qserve import QserveError

SINGLE = "single_label_classification"
MULTI = "multi_label_classification"
REGRESSION = "regression"
PROBLEM_TYPES = (SINGLE, MULTI, REGRESSION)
SHORT = {"single": SINGLE, "multi": MULTI, "regression": REGRESSION}
"""`qserve train --problem-type` values -> the recorded names."""
DEFAULT_THRESHOLD = 0.5
"""Sigmoid score at and above which a multi-label label is on (serve --threshold, request `threshold`)."""
REGRESSION_LABEL = "value"
"""The label name of a regression output (/v1 `label`, the V2 output `value`)."""
AGREEMENT_METRIC = {
    SINGLE: "same top label",
    MULTI: "same on/off per label at 0.5",
    REGRESSION: "1 - mean |Δvalue| / label range",
}

Label = int | float | tuple[int, ...]
"""One text's target: a class id (single), the sorted ids of its labels (multi) or a number (regression)."""


def short(problem: str) -> str:
    """single, multi or regression (the flag's word) for a recorded problem type."""
    return {v: k for k, v in SHORT.items()}[problem]


def from_flag(value: str | None) -> str | None:
    """`--problem-type single|multi|regression` (None: infer from the data) -> the recorded name."""
    if value is None:
        return None
    if value in SHORT:
        return SHORT[value]
    if value in PROBLEM_TYPES:
        return value
    raise QserveError(f"--problem-type must be one of {', '.join(SHORT)} (got {value!r})")


def from_config(cfg: dict[str, Any], where: str = "config.json") -> str:
    """A HF config's problem type: its `problem_type`, else regression for one label, else single-label."""
    recorded = cfg.get("problem_type")
    if recorded is not None:
        if recorded not in PROBLEM_TYPES:
            raise QserveError(f"{where}: problem_type {recorded!r} is not one of {', '.join(PROBLEM_TYPES)}")
        return str(recorded)
    num = cfg.get("num_labels") or len(cfg.get("id2label") or {}) or 2
    return REGRESSION if num == 1 else SINGLE


def check_threshold(value: Any, field: str = "--threshold") -> float:
    """A multi-label threshold: a number in [0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise QserveError(f"{field} must be a number in [0, 1] (got {value!r})")
    return float(value)


# -- scores and predictions (numpy) ---------------------------------------------------------------


Threshold = float | tuple[float, ...]
"""One threshold for every label, or one per label (in label order: a calibrated variant's, from its manifest)."""


def threshold_for(
    problem: str, asked: float | None, default: float, calibrated: tuple[float, ...] | None, field: str, model: str
) -> Threshold | None:
    """The multi-label threshold (None for other types): `asked`, else the calibrated per-label ones, else `default`;
    asked of another type, a QserveError naming `field` and `model`."""
    if problem != MULTI:
        if asked is not None:
            kind = "single-label" if problem == SINGLE else "a regression model"
            raise QserveError(f"{field} applies to multi-label models only; {model} is {kind}: leave {field} out")
        return None
    if asked is not None:
        return asked
    return calibrated if calibrated is not None else default


def label_scores(
    scores: Any, labels: Sequence[str], problem: str, top_k: int | None, threshold: Threshold | None
) -> list[list[dict[str, Any]]]:
    """The HF text-classification answer shape every label-per-text protocol and `qserve predict` share: top_k
    [{label, score}] best first; multi-label every label with `on`; regression [{"label": "value", "score": v}]."""
    out = []
    for row in scores:
        if problem == REGRESSION:
            names = [REGRESSION_LABEL] if len(row) == 1 else labels
            out.append([{"label": names[j], "score": float(v)} for j, v in enumerate(row)])
            continue
        order = np.argsort(-row, kind="stable")[: (top_k or len(labels))]
        if problem == MULTI:
            thr = DEFAULT_THRESHOLD if threshold is None else threshold
            per = thr if isinstance(thr, tuple) else (thr,) * len(labels)
            out.append([{"label": labels[j], "score": float(row[j]), "on": bool(row[j] >= per[j])} for j in order])
        else:
            out.append([{"label": labels[j], "score": float(row[j])} for j in order])
    return out


def scores(logits: Any, problem: str, temperature: float | None = None) -> Any:
    """Logits [n, k] -> float32 scores: softmax (single; of logits / `temperature` when calibrated), sigmoid (multi),
    the values (regression)."""
    z = np.asarray(logits, dtype=np.float64)
    if temperature is not None and problem == SINGLE:
        z = z / float(temperature)
    if problem == MULTI:
        out = 1.0 / (1.0 + np.exp(-z))
    elif problem == REGRESSION:
        out = z
    else:
        e = np.exp(z - z.max(axis=-1, keepdims=True))
        out = e / e.sum(axis=-1, keepdims=True)
    return out.astype(np.float32)


def predictions(rows: Any, problem: str, threshold: float | Sequence[float] = DEFAULT_THRESHOLD) -> list[Any]:
    """Scores [n, k] -> per text what is compared: the top label id, the on flags (0/1 per label; `threshold` one
    for all labels or one per label), or the values."""
    if problem == MULTI:
        per = [float(threshold)] * rows.shape[1] if isinstance(threshold, (int, float)) else list(threshold)
        return [[int(s >= t) for s, t in zip(row, per)] for row in rows.tolist()]
    if problem == REGRESSION:
        return [[float(v) for v in row] for row in rows.tolist()]
    return [int(i) for i in rows.argmax(-1)]


# -- metrics and agreement (pure Python: the bench parent has no numpy) ---------------------------


def value_range(values: Sequence[Any]) -> float | None:
    """max - min over regression targets or outputs (lists flattened); None when empty or constant."""
    flat = [float(x) for v in values for x in (v if isinstance(v, (list, tuple)) else [v])]
    span = (max(flat) - min(flat)) if flat else 0.0
    return span if span > 0 else None


def agreement(
    preds: list[Any] | None, ref: list[Any] | None, problem: str = SINGLE, span: float | None = None
) -> float | None:
    """Agreement of `preds` with the reference's (None unless both cover the same texts): equal top labels, equal
    on/off flags, or 1 - mean |Δ| / the labels' range (regression)."""
    if not preds or not ref or len(preds) != len(ref):
        return None
    if problem == MULTI:
        pairs = [(a, b) for pa, pb in zip(preds, ref) for a, b in zip(pa, pb)]
        return sum(int(a == b) for a, b in pairs) / len(pairs) if pairs else None
    if problem == REGRESSION:
        diffs = [abs(float(a) - float(b)) for pa, pb in zip(preds, ref) for a, b in zip(pa, pb)]
        span = span or value_range(ref) or 1.0
        return 1.0 - (sum(diffs) / len(diffs)) / span if diffs else None
    return sum(int(a == b) for a, b in zip(preds, ref)) / len(preds)


def metrics(preds: list[Any], labels: Sequence[Label], problem: str, num_labels: int) -> dict[str, float | None]:
    """Quality against the true labels: accuracy (single); subset accuracy and label_accuracy (multi); mae and rmse
    (regression)."""
    n = len(preds)
    if not n or n != len(labels):
        return {"accuracy": None} if problem != REGRESSION else {"mae": None, "rmse": None}
    if problem == MULTI:
        hot = [multi_hot(lab, num_labels) for lab in labels]
        exact = sum(int([int(x) for x in h] == p) for h, p in zip(hot, preds)) / n
        per = sum(int(int(x) == y) for h, p in zip(hot, preds) for x, y in zip(h, p)) / (n * num_labels)
        return {"accuracy": exact, "label_accuracy": per}
    if problem == REGRESSION:
        errs = [float(p[0]) - float(y) for p, y in zip(preds, labels)]  # type: ignore[arg-type]
        return {"mae": sum(abs(e) for e in errs) / n, "rmse": math.sqrt(sum(e * e for e in errs) / n)}
    return {"accuracy": sum(int(p == y) for p, y in zip(preds, labels)) / n}


def multi_hot(label: Label, num_labels: int) -> list[float]:
    """A multi-label target (its label ids) as the float vector BCE-with-logits trains on."""
    ids = label if isinstance(label, (tuple, list)) else (int(label),)  # a list after a trip through JSON
    return [1.0 if i in ids else 0.0 for i in range(num_labels)]


def target(label: Label, problem: str, num_labels: int) -> int | list[float]:
    """What the loss trains on: the class id, the multi-hot vector, or [value]."""
    if problem == MULTI:
        return multi_hot(label, num_labels)
    if problem == REGRESSION:
        return [float(label)]  # type: ignore[arg-type]
    return int(label)  # type: ignore[arg-type]


# -- training (torch) -----------------------------------------------------------------------------


def loss(logits: Any, labels: Any, problem: str, reduction: str = "mean") -> Any:
    """The loss HF's *ForSequenceClassification computes for this problem type (in fp32): cross-entropy,
    BCE-with-logits per label, or MSE; with reduction="none", one value per example."""
    import torch.nn.functional as F

    logits = logits.float()
    if problem == MULTI:
        out = F.binary_cross_entropy_with_logits(logits, labels.float(), reduction="none").mean(-1)
    elif problem == REGRESSION:
        out = F.mse_loss(logits, labels.float().view_as(logits), reduction="none").mean(-1)
    else:
        return F.cross_entropy(logits, labels, reduction=reduction)
    return out.mean() if reduction == "mean" else out


def batch_sums(logits: Any, labels: Any, problem: str) -> dict[str, Any]:
    """Per example [B] float64 tensors to sum over a split: correct (single, multi exact match),
    label_correct (multi, share of labels right), abs_err and sq_err (regression)."""
    logits = logits.float()
    if problem == MULTI:
        right = (logits >= 0) == (labels >= 0.5)  # sigmoid >= 0.5 exactly when the logit is >= 0
        return {"correct": right.all(-1).double(), "label_correct": right.double().mean(-1)}
    if problem == REGRESSION:
        err = logits - labels.float().view_as(logits)
        return {"abs_err": err.abs().double().mean(-1), "sq_err": (err * err).double().mean(-1)}
    return {"correct": (logits.argmax(-1) == labels).double()}


def finish_sums(sums: dict[str, float], loss_sum: float, n: int, problem: str) -> dict[str, Any]:
    """Split-level metrics from batch_sums() totals: accuracy (+ label_accuracy) or mae and rmse, loss, n."""
    n1 = max(n, 1)
    out: dict[str, Any] = {}
    if problem == REGRESSION:
        out = {"mae": sums["abs_err"] / n1, "rmse": math.sqrt(sums["sq_err"] / n1)}
    else:
        out["accuracy"] = sums["correct"] / n1
        if problem == MULTI:
            out["label_accuracy"] = sums["label_correct"] / n1
    return {**out, "loss": loss_sum / n1, "n": n}


def headline(m: dict[str, Any]) -> str:
    """A split's metrics in one phrase, for logs: accuracy (and per-label accuracy) or MAE/RMSE."""
    if "mae" in m:
        return f"MAE {m['mae']:.4f}, RMSE {m['rmse']:.4f}"
    if "label_accuracy" in m:
        return f"exact-match accuracy {m['accuracy']:.4f}, per-label accuracy {m['label_accuracy']:.4f}"
    return f"accuracy {m['accuracy']:.4f}"


# -- labels of local data files (qserve/data/local.py) ----------------------------------------------

_FLOAT = r"\s*[-+]?(\d+\.\d*|\.\d+|\d+(\.\d*)?[eE][-+]?\d+)\s*"
_INT = r"\s*-?\d+\s*"


def _cell(value: Any, csv: bool) -> Any:
    """A CSV cell as the JSON value it spells: a JSON list `["a", "b"]`, a number, else the string."""
    if not csv or not isinstance(value, str):
        return value
    s = value.strip()
    if s.startswith("["):
        try:
            return json.loads(s)
        except json.JSONDecodeError:
            return value
    if re.fullmatch(_INT, s):
        return int(s)
    if re.fullmatch(_FLOAT, s):
        return float(s)
    return value


def infer(values: Sequence[Any], csv: bool = False) -> str:
    """The problem type a file's labels spell: a list of labels per row -> multi-label, a non-integer
    number -> regression, else single-label."""
    cells = [_cell(v, csv) for v in values]
    if any(isinstance(c, list) for c in cells):
        return MULTI
    if any(isinstance(c, float) and not isinstance(c, bool) and not c.is_integer() for c in cells):
        return REGRESSION
    return SINGLE


def local_labels(
    path: Any, rows: Sequence[tuple[int, Any, Any]], problem: str, where: str
) -> tuple[list[str], list[Label]]:
    """(label names, per-row targets) of a multi-label (lists of names or ids) or regression (numbers; names ["value"])
    file; errors name the file and row."""
    csv = str(path).lower().endswith(".csv")
    if problem == REGRESSION:
        out: list[Label] = []
        for n, _, lab in rows:
            v = _cell(lab, csv)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise QserveError(
                    f"{path}, {where} {n}: label {lab!r} is not a finite number (--problem-type regression)"
                )
            out.append(float(v))
        return [REGRESSION_LABEL], out
    sets: list[list[Any]] = []
    kinds: set[str] = set()
    for n, _, lab in rows:
        v = _cell(lab, csv)
        items = v if isinstance(v, list) else [v]
        for x in items:
            if (
                isinstance(x, bool)
                or not isinstance(x, (int, str))
                or (isinstance(x, str) and not x.strip())
                or (isinstance(x, int) and x < 0)
            ):
                raise QserveError(
                    f"{path}, {where} {n}: label {lab!r}: each label of a multi-label row must be a "
                    "class name or an integer id >= 0"
                )
            kinds.add(type(x).__name__)
        if len(kinds) > 1:
            raise QserveError(f"{path}, {where} {n}: label {lab!r} mixes integer and string labels; use one kind")
        sets.append([x.strip() if isinstance(x, str) else x for x in items])
    if kinds == {"int"}:
        names = [f"LABEL_{i}" for i in range(max(x for s in sets for x in s) + 1)]
        index: dict[Any, int] = {i: i for i in range(len(names))}
    else:
        names = sorted({x for s in sets for x in s})
        index = {x: i for i, x in enumerate(names)}
    if len(names) < 2:
        raise QserveError(
            f"{path}: the rows name {len(names)} label(s) ({names}); a multi-label classifier needs at least two"
        )
    return names, [tuple(sorted({index[x] for x in s})) for s in sets]


def stratum(label: Label) -> int | tuple[int, ...]:
    """What a split is stratified on: the class, the label set (multi); regression splits at random (one stratum)."""
    return 0 if isinstance(label, float) else label
