"""The engines of a `qserve predict` job: the local one here, Ray Data's in ray_data.py; the merge and the summary.

    qserve predict models/m/variants/onnx-int8 reviews.jsonl --out scored.jsonl

run() resolves the TARGET, opens INPUT, checks the ledger (corpus.prepare: a rerun continues after the
last complete part), runs the engine chunk by chunk, merges the parts into OUTPUT and prints the one-line
summary: rows, seconds, rows/s, rows that failed.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import Any

from qserve import QserveError
from qserve.predict import corpus
from qserve.predict.corpus import Input
from qserve.predict.job import (
    Model,
    PredictConfig,
    answer_types,
    check_columns,
    ledger,
    progress,
    resolve_model,
    score_chunk,
)


def run(cfg: PredictConfig) -> dict[str, Any]:
    """Run the job on its engine; returns the summary (rows, seconds, rows_per_s, failed, ...)."""
    cfg.validate()
    fmt = corpus.output_format(cfg.out)
    inp = corpus.open_input(cfg.input)
    model = resolve_model(cfg)
    out = Path(cfg.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = corpus.prepare(out, fmt, ledger(cfg, model), cfg.force)
    t0 = time.perf_counter()
    try:
        if cfg.engine == "ray":
            from qserve.predict.ray_data import run_ray

            extra = run_ray(cfg, model, inp, fmt)
            count, scored = extra.pop("parts"), extra.pop("scored")
        else:
            count, scored = _run_local(cfg, model, inp, fmt, done)
            extra = {"engine": "local"}
    except QserveError:
        # A job refused before its first part (a missing column, --on-error fail) leaves no ledger behind that
        # would refuse the corrected command.
        if corpus.complete_parts(corpus.parts_dir(out), fmt) == 0:
            shutil.rmtree(corpus.parts_dir(out), ignore_errors=True)
        raise
    rows, failed = corpus.merge(corpus.parts_dir(out), count, out, fmt)
    secs = time.perf_counter() - t0
    summary = {
        "rows": rows,
        "seconds": round(secs, 3),
        "rows_per_s": round(scored / secs, 2) if secs else None,
        "scored_now": scored,
        "resumed_rows": rows - scored,
        "failed": failed,
        "out": str(out),
        "variant": model.variant_dir,
        **extra,
    }
    if not cfg.quiet:
        resumed = f", {rows - scored} from earlier parts" if rows > scored else ""
        nodes = extra.get("rows_per_node")
        print(
            f"qserve predict: {rows} rows ({scored} scored now{resumed}) in {secs:.1f} s, "
            f"{summary['rows_per_s']} rows/s, {failed} failed -> {out}"
            + (f" (rows per node: {nodes})" if nodes else ""),
            file=sys.stderr,
        )
    return summary


def _run_local(cfg: PredictConfig, model: Model, inp: Input, fmt: str, done: int) -> tuple[int, int]:
    """Score chunk by chunk after the `done` complete parts; returns (parts, rows scored now)."""
    rt = model.load()
    types = answer_types(rt, cfg.all_scores) if fmt == "parquet" else None
    parts = corpus.parts_dir(cfg.out)
    index, scored = done, 0
    bar = progress(cfg, inp.total(), done * cfg.chunk_rows)
    try:
        for chunk in inp.chunks(cfg.chunk_rows, skip=done * cfg.chunk_rows):
            if index == 0:
                check_columns(inp, chunk, cfg)
            out = score_chunk(rt, chunk, cfg, first_row=index * cfg.chunk_rows + 1)
            corpus.write_part(out, corpus.part_path(parts, index, fmt), fmt, types)
            index += 1
            scored += len(chunk)
            bar.update(len(chunk))
    finally:
        bar.close()
        rt.close()
    if index == 0 and done == 0:
        check_columns(inp, [], cfg)
    return index, scored
