"""`qserve predict`: score a corpus file with a variant or a pipeline model dir.

qserve predict models/minilm-l6-distilbert-imdb reviews.jsonl --out scored.parquet
cat rows.jsonl | qserve predict models/m/variants/onnx-int8 - --out scored.jsonl --quiet
"""

from __future__ import annotations

import argparse
from pathlib import Path

from qserve.files import write_json_atomic
from qserve.predict.job import ENGINES, ON_ERROR, PredictConfig
from qserve.predict.runner import run


def register(subparsers: argparse._SubParsersAction) -> None:
    d = PredictConfig
    p = subparsers.add_parser(
        "predict",
        help="score a corpus file (jsonl, csv, parquet) with a variant, resumably",
        description="Score every row of INPUT with the model TARGET names, as /v1/classify answers it (same runtime, "
        "long-text policy and answers), streaming in chunks with flat memory, and write OUTPUT (format "
        "from its suffix) with every input column plus the answer: label, score (multi-label: labels "
        "on at the threshold; regression: value), tokens, windows, truncated, and error for a row that "
        "could not be scored. Complete parts and a ledger sit in OUTPUT.parts/ while it runs: the same "
        "command after a crash continues after the last complete part.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "target",
        metavar="TARGET",
        help="a variant dir, or a `qserve pipeline` model dir (its "
        "recommended variant and long-text policy, as `serve` picks)",
    )
    p.add_argument(
        "input", metavar="INPUT", help=".jsonl, .csv, .parquet, a directory of .parquet files, or - (jsonl on stdin)"
    )
    p.add_argument("--out", required=True, metavar="OUTPUT", help="output file; .parquet, .jsonl or .csv")
    p.add_argument("--text-column", default=d.text_column, help="the column holding the text")
    p.add_argument("--text-pair-column", default=None, help="the second text of each row, for a pair model")
    p.add_argument(
        "--id-column", default=None, help="a column naming each row (quoted in errors); carried like every other column"
    )
    p.add_argument("--all-scores", action="store_true", help="also write every label's score (a `scores` column)")
    p.add_argument(
        "--long-text",
        default=None,
        metavar="POLICY",
        help="long-text policy as in `serve` (head, tail, head-tail:H, windows:W:S:AGG); default: the "
        "model dir report's, else the variant's",
    )
    p.add_argument(
        "--threshold",
        type=float,
        default=None,
        help="multi-label: a label is on at score >= this (default 0.5, as `serve`)",
    )
    p.add_argument("--max-chars", type=int, default=d.max_chars, help="a longer text gets an error, not an answer")
    p.add_argument(
        "--on-error",
        choices=ON_ERROR,
        default=d.on_error,
        help="row: a bad row gets an `error` column and the rest are scored; fail: stop at the first, naming its row",
    )
    p.add_argument(
        "--chunk-rows",
        type=int,
        default=d.chunk_rows,
        help="rows read, scored and written as one part (memory and what a crash can lose)",
    )
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="texts per forward (serve's --max-batch-size)")
    p.add_argument("--threads", type=int, default=None, help="intra-op threads (per replica with --engine ray)")
    p.add_argument("--device", default=d.device, help="auto, cpu, cuda, cuda:N")
    p.add_argument("--force", action="store_true", help="start over: drop OUTPUT.parts/ and overwrite OUTPUT")
    p.add_argument("--quiet", action="store_true", help="no progress bar and no summary line")
    p.add_argument(
        "--json",
        dest="json_out",
        default=None,
        metavar="PATH",
        help="also write the summary (rows, seconds, rows/s, failed, rows per node) as JSON here",
    )
    ray = p.add_argument_group("engine", "Where the job runs; the flags after --engine apply to --engine ray only.")
    ray.add_argument(
        "--engine",
        choices=ENGINES,
        default=d.engine,
        help="local: this process. ray: Ray Data, an actor pool with one runtime per actor (needs the "
        "qserve[ray] extra)",
    )
    ray.add_argument("--replicas", default=d.replicas, help="actors: N, or auto (the cluster's CPUs / --threads)")
    ray.add_argument(
        "--ray-address",
        default=None,
        help="join this Ray cluster (e.g. 127.0.0.1:6379); default: start a local Ray instance",
    )
    p.set_defaults(func=run_predict)


def run_predict(args: argparse.Namespace) -> int:
    names = [f for f in PredictConfig.__dataclass_fields__]
    cfg = PredictConfig(**{n: getattr(args, n) for n in names})
    summary = run(cfg)
    if args.json_out:
        write_json_atomic(Path(args.json_out), summary)
    return 0  # bad rows are in the output (--on-error fail raised before any was written past them)
