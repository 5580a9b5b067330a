"""Local data files: a .csv, .jsonl or .json of texts and labels, read and checked row by row.

    python -c "import json; from pathlib import Path; from qserve.data.local import read_local; \\
p = Path('/tmp/q.json'); p.write_text(json.dumps({'text': ['good', 'bad'], 'label': [4.5, 1.0]})); \\
print(read_local(p).problem_type)"   # regression

Columns `text`, `label` and optionally `text_pair`; integer, string, list (multi-label) or float (regression)
labels (docs/training.md). Every error names the file, the row and what is allowed.
"""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qserve import QserveError
from qserve.problemtypes import SINGLE, Label, infer, local_labels

LOCAL_SUFFIXES = (".csv", ".jsonl", ".json")
TEXT_PAIR_COLUMN = "text_pair"
"""The optional second-text column of a local file (a pair dataset)."""
MISSING = object()


@dataclass
class LocalFile:
    """A local data file, read and validated: every row kept, in file order (no dedupe, no split)."""

    texts: list[str]
    pairs: list[str] | None
    """Each text's `text_pair` (a pair dataset), else None."""
    targets: list[Label]
    """Class ids (single-label), sorted tuples of ids (multi-label) or floats (regression)."""
    names: list[str]
    """Label names, index = class id (["value"] for regression)."""
    problem_type: str
    """qserve.problemtypes: single_label_classification, multi_label_classification or regression."""
    info: dict[str, Any] = field(default_factory=dict)
    """source and rows read."""


def read_local(path: Path, problem_type: str | None = None) -> LocalFile:
    """Read and check `path` (.csv/.jsonl/.json); `problem_type` None = inferred from the labels."""
    rows, raw_pairs = _read_local(path)
    where = "row" if path.suffix.lower() == ".json" else "line"
    texts = [_string(path, f"{where} {n}", "text", text) for n, text, _ in rows]
    names, ids, problem = _labels(path, rows, where, problem_type)
    pairs = _check_pairs(path, rows, raw_pairs, where) if raw_pairs is not None else None
    return LocalFile(texts, pairs, ids, names, problem, {"source": f"local file {path}", "rows": len(rows)})


def _read_local(path: Path) -> tuple[list[tuple[int, Any, Any]], list[Any] | None]:
    """Rows as (line number, text, label), with errors naming the file and line, and each row's text_pair
    (MISSING where a row has none) when the file has that column, else None."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise QserveError(f"--dataset {path}: cannot read the file ({e.strerror})") from None
    try:
        content = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        at = raw[: e.start].count(b"\n") + 1
        raise QserveError(
            f"{path}, line {at}: not valid UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start}); "
            "save the file as UTF-8"
        ) from None
    if not content.strip():
        raise QserveError(f"{path}: the file is empty; expected rows with `text` and `label`")
    suffix = path.suffix.lower()
    rows: list[tuple[int, Any, Any]] = []
    pairs: list[Any] = []
    if suffix == ".csv":
        reader = csv.DictReader(io.StringIO(content, newline=""))
        cols = reader.fieldnames or []
        missing = [c for c in ("text", "label") if c not in cols]
        if missing:
            raise QserveError(
                f"{path}, line 1: missing column(s) {', '.join(missing)} (header has {cols}); "
                "the CSV needs `text` and `label` columns"
            )
        start = 2
        try:
            for row in reader:
                rows.append((start, row["text"], row["label"]))
                pairs.append(row.get(TEXT_PAIR_COLUMN, MISSING) if TEXT_PAIR_COLUMN in cols else MISSING)
                start = reader.line_num + 1
        except csv.Error as e:
            raise QserveError(f"{path}, line {reader.line_num}: malformed CSV ({e})") from None
    elif suffix == ".jsonl":
        for n, line in enumerate(content.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise QserveError(f"{path}, line {n}: malformed JSON ({e.msg} at column {e.colno})") from None
            rows.append(_json_row(path, n, obj))
            pairs.append(obj.get(TEXT_PAIR_COLUMN, MISSING))
    elif suffix == ".json":
        try:
            data = json.loads(content)
        except json.JSONDecodeError as e:
            raise QserveError(f"{path}, line {e.lineno}: malformed JSON ({e.msg} at column {e.colno})") from None
        if isinstance(data, dict) and isinstance(data.get("text"), list) and isinstance(data.get("label"), list):
            if len(data["text"]) != len(data["label"]):
                raise QserveError(
                    f"{path}: `text` has {len(data['text'])} entries but `label` has {len(data['label'])}"
                )
            rows = [(i, t, lab) for i, (t, lab) in enumerate(zip(data["text"], data["label"]), 1)]
            column = data.get(TEXT_PAIR_COLUMN)
            if column is not None and (not isinstance(column, list) or len(column) != len(rows)):
                raise QserveError(f"{path}: `text_pair` must be a list as long as `text` ({len(rows)} entries)")
            pairs = list(column or [])
        elif isinstance(data, list):
            rows = [_json_row(path, i, obj, what="item") for i, obj in enumerate(data, 1)]
            pairs = [obj.get(TEXT_PAIR_COLUMN, MISSING) for obj in data]
        else:
            raise QserveError(
                f'{path}: expected a JSON list of {{"text", "label"}} objects or an object of `text` and `label` lists'
            )
    else:
        raise QserveError(f"--dataset {path}: unsupported file type {suffix!r}; use {', '.join(LOCAL_SUFFIXES)}")
    if not rows:
        raise QserveError(f"{path}: no data rows; expected rows with `text` and `label`")
    return rows, (pairs if any(p is not MISSING for p in pairs) else None)


def _check_pairs(path: Path, rows: list[tuple[int, Any, Any]], pairs: list[Any], where: str) -> list[str]:
    """A file with a text_pair column: every row has one, a non-empty string (errors name the row)."""
    out = []
    for (n, _, _), pair in zip(rows, pairs):
        if pair is MISSING:
            raise QserveError(
                f"{path}, {where} {n}: no `text_pair`, which other rows have; a pair dataset needs "
                "`text_pair` on every row (or on none, for one text per example)"
            )
        out.append(_string(path, f"{where} {n}", "text_pair", pair))
    return out


def _string(path: Path, at: str, column: str, value: Any) -> str:
    """A row's `column`: a non-empty string (errors name the file and the row)."""
    if not isinstance(value, str):
        raise QserveError(f"{path}, {at}: {column} must be a string (got {type(value).__name__})")
    if not value.strip():
        raise QserveError(f"{path}, {at}: {column} is empty")
    return value


def _json_row(path: Path, n: int, obj: Any, what: str = "line") -> tuple[int, Any, Any]:
    if not isinstance(obj, dict):
        raise QserveError(
            f"{path}, {what} {n}: expected a JSON object with `text` and `label`, got {type(obj).__name__}"
        )
    missing = [c for c in ("text", "label") if c not in obj]
    if missing:
        raise QserveError(f"{path}, {what} {n}: missing field(s) {', '.join(missing)}")
    return n, obj["text"], obj["label"]


def _label_ids(path: Path, rows: list[tuple[int, Any, Any]], where: str) -> tuple[list[str], list[int]]:
    """Integer labels must be 0..K-1 with every class present; strings map to sorted ids."""
    values: list[Any] = []
    kind = None
    for n, _, lab in rows:
        if isinstance(lab, str) and path.suffix.lower() == ".csv" and re.fullmatch(r"\s*-?\d+\s*", lab):
            lab = int(lab)  # CSV cells are always strings; digits mean integer labels
        if isinstance(lab, bool) or not isinstance(lab, (int, str)) or (isinstance(lab, str) and not lab.strip()):
            raise QserveError(f"{path}, {where} {n}: label {lab!r} is not an integer 0..K-1 or a class name")
        this = "int" if isinstance(lab, int) else "str"
        if kind is None:
            kind = this
        elif kind != this:
            raise QserveError(f"{path}, {where} {n}: label {lab!r} mixes integer and string labels; use one kind")
        if isinstance(lab, int) and lab < 0:
            raise QserveError(f"{path}, {where} {n}: label {lab} is negative; integer labels must be 0..K-1")
        values.append(lab.strip() if isinstance(lab, str) else lab)
    if kind == "str":
        names = sorted(set(values))
        index = {v: i for i, v in enumerate(names)}
        return names, [index[v] for v in values]
    k = max(values) + 1
    absent = sorted(set(range(k)) - set(values))
    if absent:
        first_high = next(n for (n, _, _), v in zip(rows, values) if v == max(values))
        raise QserveError(
            f"{path}: integer labels must be 0..K-1 with every class present; found labels up to "
            f"{k - 1} (first at {where} {first_high}) but none equal to {absent[:10]}"
        )
    if k < 2:
        raise QserveError(f"{path}: every row has label 0; a classifier needs at least two classes")
    return [f"LABEL_{i}" for i in range(k)], values


def _labels(
    path: Path, rows: list[tuple[int, Any, Any]], where: str, problem_type: str | None
) -> tuple[list[str], list[Label], str]:
    """(names, targets, problem type): --problem-type, else what the labels spell (qserve.problemtypes.infer)."""
    problem = problem_type or infer([lab for _, _, lab in rows], csv=path.suffix.lower() == ".csv")
    if problem != SINGLE:
        return (*local_labels(path, rows, problem, where), problem)
    names, ids = _label_ids(path, rows, where)
    if len(names) < 2:
        raise QserveError(f"{path}: only one class ({names[0]!r}); a classifier needs at least two")
    return names, list(ids), problem
