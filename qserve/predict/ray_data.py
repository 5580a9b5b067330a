"""`qserve predict --engine ray`: the same job on Ray Data, one loaded runtime per actor of a pool.

    qserve predict models/m/variants/onnx-int8 corpus/ --out scored.parquet --engine ray --replicas auto
    ray start --head --port 6379 && qserve predict ... --engine ray --ray-address 127.0.0.1:6379

Each actor scores with the local engine's score_chunk and the driver writes the same parts and merge, so the output
is the local engine's (docs/predict.md). Importing this module imports Ray; without it a QserveError names the extra.
"""

from __future__ import annotations

import collections
import csv
import logging
import os
import warnings
from typing import Any

from qserve import QserveError
from qserve.extras import require
from qserve.predict.corpus import Input, part_path, parts_dir, rows_to_table, write_part
from qserve.predict.job import Model, PredictConfig, answer_types, check_columns, progress, score_chunk

require("ray.data", "--engine ray (Ray Data)")  # ray.data, which `ray` below carries once imported
ray = require("ray", "--engine ray (Ray Data)")

log = logging.getLogger("qserve.predict")
NODE = "_qserve_node"
"""The column an actor stamps its node id in; the driver counts it and drops it."""


class Scorer:
    """A Ray Data actor: one runtime, loaded once; a pyarrow batch in, the same batch with its answers out."""

    def __init__(self, cfg: PredictConfig, model: Model):
        self.cfg, self.rt = cfg, model.load()
        self.types = answer_types(self.rt, cfg.all_scores)
        self.node = ray.get_runtime_context().get_node_id()

    def __call__(self, batch: Any) -> Any:
        import pyarrow as pa

        rows = score_chunk(self.rt, batch.to_pylist(), self.cfg)
        table = rows_to_table(rows, self.types)
        return table.append_column(NODE, pa.array([self.node] * len(rows), type=pa.string()))


def _dataset(inp: Input) -> Any:
    """INPUT as a Ray dataset: csv cells stay strings (as the local engine reads them)."""
    if inp.fmt == "parquet":
        return ray.data.read_parquet([str(p) for p in inp.files])
    if inp.fmt == "jsonl":
        return ray.data.read_json(inp.path, lines=True, file_extensions=None)
    import pyarrow as pa
    import pyarrow.csv as pcsv

    with open(inp.path, encoding="utf-8", newline="") as f:
        header = next(csv.reader(f), [])
    opts = pcsv.ConvertOptions(
        column_types={c: pa.string() for c in header}, strings_can_be_null=False, quoted_strings_can_be_null=False
    )
    return ray.data.read_csv(inp.path, convert_options=opts, file_extensions=None)


SPARE_CPUS = 1
"""Logical CPUs left to Ray Data's read tasks: an actor pool holding every CPU would starve the reads that
feed it (the job then waits forever). Reading is light beside inference, so a local instance gets this
many logical CPUs beyond the cores, and `--replicas auto` on a cluster leaves them free."""


def replicas(value: str, threads: int | None, cpus: int) -> int:
    """--replicas N, or auto: as many actors as the cluster's CPUs (less SPARE_CPUS) hold at --threads each."""
    if value == "auto":
        return max(1, (cpus - SPARE_CPUS) // (threads or 1))
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise QserveError(f"--replicas {value!r}: a whole number >= 1, or auto")
    return n


def start_ray(address: str | None, quiet: bool) -> bool:
    """Join --ray-address, else start a local instance (address='local': never a recorded cluster).
    Returns whether this process started it."""
    level = logging.ERROR if quiet else logging.WARNING
    if ray.is_initialized():
        return False
    if address:
        ray.init(address=address, logging_level=level, log_to_driver=not quiet)
        return False
    ray.init(
        address="local",
        num_cpus=(os.cpu_count() or 1) + SPARE_CPUS,
        include_dashboard=False,
        logging_level=level,
        log_to_driver=not quiet,
    )
    return True


def run_ray(cfg: PredictConfig, model: Model, inp: Input, fmt: str) -> dict[str, Any]:
    """Score INPUT on Ray Data and write the parts; returns parts, rows scored and rows per node."""
    check_columns(inp, next(inp.chunks(cfg.chunk_rows), []), cfg)  # before any actor starts
    started = start_ray(cfg.ray_address, cfg.quiet)
    try:
        cpus = int(ray.cluster_resources().get("CPU", 1))
        n = replicas(cfg.replicas, cfg.threads, cpus)
        threads = cfg.threads or max(1, (cpus - SPARE_CPUS) // n)
        model = Model(**{**vars(model), "threads": threads})
        ctx = ray.data.DataContext.get_current()
        ctx.execution_options.preserve_order = True  # rows come back in input order
        ctx.enable_progress_bars = False  # the driver's own bar counts rows written

        with warnings.catch_warnings():
            # SPREAD puts the actors on different nodes; Ray 2.60 (pinned) has no named parameter for it yet and
            # warns that the generic remote args go away in 2.64
            warnings.filterwarnings("ignore", message=".*ray_remote_args.*deprecated")
            ds = _dataset(inp).map_batches(
                Scorer,
                fn_constructor_args=(cfg, model),
                batch_size=cfg.chunk_rows,
                batch_format="pyarrow",
                compute=ray.data.ActorPoolStrategy(size=n),
                num_cpus=threads,
                scheduling_strategy="SPREAD",
            )
        log.info(
            "Ray Data: %d actor(s) x %d thread(s) of %s (Ray %s%s)",
            n,
            threads,
            model.variant_dir,
            ray.__version__,
            ", local instance" if started else f", cluster {cfg.ray_address}",
        )
        parts = parts_dir(cfg.out)
        for stale in parts.glob("part-*"):  # this engine starts the corpus over (resuming is --engine local's)
            stale.unlink()
        per_node: collections.Counter[str] = collections.Counter()
        index = scored = 0
        bar = progress(cfg, inp.total(), 0)
        try:
            for batch in ds.iter_batches(batch_size=cfg.chunk_rows, batch_format="pyarrow"):
                rows = batch.drop_columns([NODE]).to_pylist()
                per_node.update(batch.column(NODE).to_pylist())
                write_part(rows, part_path(parts, index, fmt), fmt, _types(batch) if fmt == "parquet" else None)
                index += 1
                scored += len(rows)
                bar.update(len(rows))
        finally:
            bar.close()
        return {
            "parts": index,
            "scored": scored,
            "engine": "ray",
            "replicas": n,
            "threads_per_replica": threads,
            "rows_per_node": dict(per_node),
            "nodes": len(per_node),
        }
    finally:
        if started:
            ray.shutdown()


def _types(batch: Any) -> dict[str, Any]:
    """The answer columns' types as the actors wrote them (the same answer_types), for the parts."""
    return {f.name: f.type for f in batch.schema if f.name != NODE}
