"""A `qserve predict` job: its settings, the model its TARGET names, a chunk scored as /v1 answers it, the local engine.

    qserve predict models/minilm-l6-distilbert-imdb reviews.jsonl --out scored.parquet --all-scores

TARGET is resolved and loaded as `qserve serve` does, and a chunk goes through Runtime.classify and /v1's answer and
threshold rules, so a row's label and score are what /v1/classify answers. Rows go back in input order; a bad row
gets an `error` and no answer, and the rest of its chunk is scored.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from qserve import QserveError
from qserve import problemtypes as problems
from qserve.artifact import read_manifest
from qserve.predict.corpus import ROW_ERROR, Row
from qserve.runtime import RuntimeOptions, load_runtime
from qserve.serve.core.repository import model_version, resolve
from qserve.serve.core.texts import text_problem

if TYPE_CHECKING:
    from qserve.runtime import Runtime

log = logging.getLogger("qserve.predict")

ENGINES = ("local", "ray")
ON_ERROR = ("row", "fail")


@dataclass
class PredictConfig:
    """One job: what to score, with which model, and how."""

    target: str
    """A variant dir, or a `qserve pipeline` model dir (its recommended variant and policy, as `serve` picks)."""
    input: str
    """.jsonl, .csv, .parquet, a directory of .parquet files, or - (jsonl on stdin)."""
    out: str
    """The output file; its suffix picks the format: .parquet, .jsonl or .csv."""
    text_column: str = "text"
    text_pair_column: str | None = None
    id_column: str | None = None
    all_scores: bool = False
    long_text: str | None = None
    threshold: float | None = None
    max_chars: int = 20_000
    on_error: str = "row"
    chunk_rows: int = 2048
    batch_size: int = 32
    threads: int | None = None
    device: str = "auto"
    force: bool = False
    quiet: bool = False
    engine: str = "local"
    replicas: str = "auto"
    ray_address: str | None = None

    def validate(self) -> None:
        for name, allowed in (("engine", ENGINES), ("on_error", ON_ERROR)):
            if getattr(self, name) not in allowed:
                raise QserveError(f"--{name.replace('_', '-')} {getattr(self, name)!r}: allowed: {', '.join(allowed)}")
        for name in ("chunk_rows", "batch_size", "max_chars"):
            if getattr(self, name) < 1:
                raise QserveError(f"--{name.replace('_', '-')} must be >= 1 (got {getattr(self, name)})")
        if self.threshold is not None:
            problems.check_threshold(self.threshold)
        if self.engine == "local" and (self.replicas != "auto" or self.ray_address):
            raise QserveError("--replicas and --ray-address only apply with --engine ray")
        if self.engine == "ray" and self.input == "-":
            raise QserveError("--engine ray reads files every node can read; INPUT - (stdin) is --engine local only")


@dataclass
class Model:
    """The variant a TARGET names and how it is loaded (plain data: travels to Ray actors)."""

    variant_dir: str
    long_text: str | None
    selection: dict[str, Any] | None
    version: str
    threads: int | None
    device: str
    batch_size: int

    def load(self) -> Runtime:
        """The runtime (manifest verified), a forward never over `batch_size` rows, as the server caps it."""
        options = RuntimeOptions(threads=self.threads, long_text=self.long_text, max_rows=self.batch_size)
        return load_runtime(self.variant_dir, self.device, options)


def resolve_model(cfg: PredictConfig) -> Model:
    """TARGET -> the variant and policy `qserve serve TARGET` would serve (the server's own resolve)."""
    vdir, sel = resolve(cfg.target)
    if sel is not None:
        log.info("model dir %s: scoring with %s (%s)", cfg.target, sel.variant, sel.why)
    # as ServeState._prepare: --long-text wins, else the policy the model dir's report names, else the variant's
    policy = cfg.long_text or (sel.long_text if sel else None)
    long_text = None if policy is None else str(policy)
    manifest = read_manifest(Path(vdir))
    # a --threshold the model cannot take is refused here, before the model loads
    problems.threshold_for(manifest.problem, cfg.threshold, problems.DEFAULT_THRESHOLD, None, "--threshold", str(vdir))
    version = model_version(manifest)
    return Model(
        str(Path(vdir).resolve()),
        long_text,
        sel.record() if sel else None,
        version,
        cfg.threads,
        cfg.device,
        cfg.batch_size,
    )


# -- one chunk ------------------------------------------------------------------------------------


def answer_types(rt: Runtime, all_scores: bool) -> dict[str, Any]:
    """The pyarrow type of every answer column this model writes (one schema for every part and engine)."""
    import pyarrow as pa

    types: dict[str, Any] = {}
    if rt.problem_type == problems.REGRESSION:
        types["value"] = pa.float64()
    else:
        types.update(label=pa.string(), score=pa.float64())
        if rt.problem_type == problems.MULTI:
            types["labels"] = pa.list_(pa.string())
        if all_scores:
            types["scores"] = pa.struct([(name, pa.float64()) for name in rt.labels])
    types.update(tokens=pa.int64(), windows=pa.int64(), truncated=pa.bool_(), error=pa.string())
    return types


def _problem(row: Row, column: str, flag: str, max_chars: int) -> str | None:
    if column not in row:
        return f"column {column!r} ({flag}) is missing from this row"
    text = row[column]
    if text is None:
        return f"{column} is null"
    if not isinstance(text, str):
        return f"{column} is not a string (got {type(text).__name__})"
    if not text:
        return f"{column} is empty"
    why = text_problem(text)
    if why:
        return f"{column} {why}"
    if len(text) > max_chars:
        return f"{column} has {len(text)} characters; at most {max_chars} (--max-chars)"
    return None


def row_problem(row: Row, cfg: PredictConfig) -> str | None:
    """Why this row cannot be scored, or None."""
    if ROW_ERROR in row:
        return str(row[ROW_ERROR])
    return _problem(row, cfg.text_column, "--text-column", cfg.max_chars) or (
        _problem(row, cfg.text_pair_column, "--text-pair-column", cfg.max_chars) if cfg.text_pair_column else None
    )


def score_chunk(rt: Runtime, rows: list[Row], cfg: PredictConfig, first_row: int = 1) -> list[Row]:
    """Each row with its answer columns (or its error), in input order. `first_row`: the 1-based number of
    rows[0] in INPUT, for --on-error fail's message."""
    thresholds = rt.manifest.thresholds
    threshold = problems.threshold_for(
        rt.problem_type, cfg.threshold, problems.DEFAULT_THRESHOLD, thresholds, "--threshold", cfg.target
    )
    errors = [row_problem(r, cfg) for r in rows]
    if cfg.on_error == "fail":
        bad = next((i for i, e in enumerate(errors) if e), None)
        if bad is not None:
            rid = f" (id {rows[bad].get(cfg.id_column)!r})" if cfg.id_column else ""
            raise QserveError(
                f"{cfg.input}, row {first_row + bad}{rid}: {errors[bad]} (--on-error fail stops at "
                "the first bad row; --on-error row writes it with an error column)"
            )
    ok = [i for i, e in enumerate(errors) if e is None]
    pair = cfg.text_pair_column

    def size(i: int) -> int:
        return len(rows[i][cfg.text_column]) + (len(rows[i][pair]) if pair else 0)

    # Similar lengths share a batch (less padding); an answer does not depend on its batchmates.
    ok.sort(key=size)
    answers: dict[int, Row] = {}
    for start in range(0, len(ok), cfg.batch_size):
        idx = ok[start : start + cfg.batch_size]
        texts = [rows[i][cfg.text_column] for i in idx]
        pairs = [rows[i][pair] for i in idx] if pair else None
        r = rt.classify(texts, [None] * len(texts), pairs=pairs)  # as the server's infer_fn calls it
        preds = problems.label_scores(r.probs, rt.labels, rt.problem_type, None, threshold)
        for j, i in enumerate(idx):
            answers[i] = _answer(preds[j], rt.problem_type, cfg.all_scores, r.tokens[j], r.windows[j], r.truncated[j])
    empty = _empty(rt, cfg.all_scores)
    out = []
    for i, row in enumerate(rows):
        carried = {k: v for k, v in row.items() if k != ROW_ERROR}
        out.append({**carried, **(answers[i] if i in answers else {**empty, "error": errors[i]})})
    return out


def _answer(
    pred: list[dict[str, Any]], problem: str, all_scores: bool, tokens: int, windows: int, truncated: bool
) -> Row:
    """One /v1 prediction (best first) as columns."""
    if problem == problems.REGRESSION:
        row: Row = {"value": pred[0]["score"]}
    else:
        row = {"label": pred[0]["label"], "score": pred[0]["score"]}
        if problem == problems.MULTI:
            row["labels"] = [p["label"] for p in pred if p["on"]]
        if all_scores:
            row["scores"] = {p["label"]: p["score"] for p in pred}
    return {**row, "tokens": int(tokens), "windows": int(windows), "truncated": bool(truncated), "error": None}


def _empty(rt: Runtime, all_scores: bool) -> Row:
    cols = (
        ["value"]
        if rt.problem_type == problems.REGRESSION
        else ["label", "score"]
        + (["labels"] if rt.problem_type == problems.MULTI else [])
        + (["scores"] if all_scores else [])
    )
    return {c: None for c in cols + ["tokens", "windows", "truncated"]}


# -- the job --------------------------------------------------------------------------------------


def ledger(cfg: PredictConfig, model: Model) -> dict[str, Any]:
    """What a job is, as its ledger records it: a rerun must match it to continue."""
    inp = "-" if cfg.input == "-" else str(Path(cfg.input).resolve())
    size = None if cfg.input == "-" or Path(cfg.input).is_dir() else Path(cfg.input).stat().st_size
    keep = ("text_column", "text_pair_column", "id_column", "all_scores", "threshold", "max_chars", "chunk_rows")
    return {
        "target": str(Path(cfg.target).resolve()),
        "input": inp,
        "input_bytes": size,
        "variant": model.variant_dir,
        "variant_version": model.version,
        "long_text": model.long_text,
        **{k: v for k, v in asdict(cfg).items() if k in keep},
    }


def check_columns(inp: Any, rows: list[Row], cfg: PredictConfig) -> None:
    """A column no row has (or a parquet/csv header lacks) is a file-level error naming the columns it has."""
    declared = inp.columns()
    seen = declared if declared is not None else list(dict.fromkeys(k for r in rows for k in r if k != ROW_ERROR))
    if declared is None and not seen:
        return  # nothing readable in this chunk: every row carries its own error
    for col, flag in (
        (cfg.text_column, "--text-column"),
        (cfg.text_pair_column, "--text-pair-column"),
        (cfg.id_column, "--id-column"),
    ):
        if col and col not in seen:
            raise QserveError(f"{cfg.input} has no column {col!r} ({flag}); its columns: {', '.join(seen) or 'none'}")


def progress(cfg: PredictConfig, total: int | None, initial: int) -> Any:
    """A tqdm bar (rows/s, ETA) on a terminal; nothing when --quiet or stderr is not one."""
    return tqdm(
        total=total,
        initial=initial,
        unit="rows",
        dynamic_ncols=True,
        smoothing=0.1,
        disable=cfg.quiet or not sys.stderr.isatty(),
    )
