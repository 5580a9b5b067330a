"""How a variant runs, not what it computes: RuntimeOptions, the knobs every runtime takes.

    python -c "from qserve.runtime import RuntimeOptions; print(RuntimeOptions(threads=2, long_text='head-tail'))"

Checked when made (each bad value names its flag and what is allowed), so bench, serve and every engine
refuse a bad setting before a model loads.
"""

from __future__ import annotations

from dataclasses import dataclass

from qserve import QserveError, longtext
from qserve.devices import usable_cores
from qserve.runtime import graphs
from qserve.runtime.buckets import parse


@dataclass
class RuntimeOptions:
    """Knobs that change how a variant runs, not what it computes."""

    threads: int | None = None
    """Intra-op threads (torch.set_num_threads / ORT intra_op_num_threads); None = library default."""
    max_length: int | None = None
    """Truncation length; None = the variant's own max_length from its manifest."""
    batch_dependent: str | None = None
    """How to run a variant whose kernels let a row see its batchmates (onnx-int8's one activation
    scale per batch): "rows" runs each text alone, unpadded, inside the one call, so its answer is the
    one it gets alone; "batched" runs the batch as one forward (answers then move with batchmates and
    padding; for side-by-side measurements). None = what the variant's manifest asks (rows, unless it
    was exported with row_by_row=false to rebuild the graph of before)."""
    long_text: str | None = None
    """Long-text policy for texts that name none (head, tail, head-tail:H, windows:W:S:AGG); None = the
    manifest's `long_text`, else head."""
    max_windows: int = longtext.MAX_WINDOWS
    """Most windows one text gets under a windows policy (more are spread over it; it is then truncated)."""
    max_rows: int | None = None
    """Most pieces (texts or windows) in one forward; more run as several forwards. None = no cap."""
    row_workers: int | None = None
    """How many rows of a batch run side by side, each single-threaded (backends that can: ONNX Runtime on
    CPU, a row-by-row batch's rows on a second session; OpenVINO, a batch's shares on one stream each).
    None = as many as intra-op threads (`threads`, else the cores); 1 = the whole batch (or one row at a
    time) on the full intra-op pool. Never changes an answer: tests check it bit for bit."""
    length_buckets: str | tuple[int, ...] = "auto"
    """Token lengths a variant that needs fixed shapes (ov-int8) pads each text to (qserve.runtime.buckets):
    "auto" (powers of two from 32, then max_length), "off" (max_length for every text) or e.g. (32, 64, 128).
    A text's bucket depends on its own length only. Variants that run unpadded ignore it."""
    max_batch_tokens: int | None = None
    """Cap on rows x padded length per forward; a larger batch runs as several forwards. None = no cap."""
    cuda_graphs: str = graphs.AUTO
    """How a torch variant on CUDA runs (qserve.runtime.graphs): "graphs" replays CUDA graphs captured at load per
    (batch, length) bucket, "compile" runs torch.compile(mode="reduce-overhead") on the same buckets, "off" runs
    eager, "auto" captures the graphs and keeps them where a short measurement at load finds them faster than
    eager. CPU devices, other backends and variants run row by row run eager whatever this says (the runtime's
    `execution` record says why)."""
    max_graphs: int = graphs.MAX_GRAPHS
    """Most CUDA graphs one runtime captures (shapes past it run on the smaller buckets captured)."""
    graph_memory_mb: float = graphs.MEMORY_MB
    """CUDA memory (MiB) one runtime's graphs may take: capturing stops once they hold this much."""

    def side_by_side(self) -> int:
        """How many rows a backend that can should run side by side: row_workers, else the threads, else the cores."""
        if self.row_workers is not None:
            return self.row_workers

        return self.threads or usable_cores()

    def __post_init__(self) -> None:
        if self.batch_dependent is not None and self.batch_dependent not in BATCH_DEPENDENT:
            raise QserveError(
                f"batch_dependent must be one of {', '.join(BATCH_DEPENDENT)} (got {self.batch_dependent!r})"
            )
        if self.row_workers is not None and (
            isinstance(self.row_workers, bool) or not isinstance(self.row_workers, int) or self.row_workers < 1
        ):
            raise QserveError(f"row_workers must be an integer >= 1 or None (got {self.row_workers!r})")
        for name in ("max_windows", "max_rows"):
            v = getattr(self, name)
            if (v is not None or name == "max_windows") and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise QserveError(f"{name} must be an integer >= 1 (got {v!r})")
        if self.long_text is not None:
            longtext.parse(self.long_text, "--long-text")

        parse(self.length_buckets)  # a bad value fails here, naming --length-buckets
        if self.max_batch_tokens is not None and (
            isinstance(self.max_batch_tokens, bool)
            or not isinstance(self.max_batch_tokens, int)
            or self.max_batch_tokens < 2
        ):
            raise QserveError(f"--max-batch-tokens must be an integer >= 2 or unset (got {self.max_batch_tokens!r})")
        self.cuda_graphs = graphs.parse_mode(self.cuda_graphs)
        if isinstance(self.max_graphs, bool) or not isinstance(self.max_graphs, int) or self.max_graphs < 1:
            raise QserveError(f"max_graphs must be an integer >= 1 (got {self.max_graphs!r})")
        if (
            isinstance(self.graph_memory_mb, bool)
            or not isinstance(self.graph_memory_mb, (int, float))
            or not self.graph_memory_mb > 0
        ):
            raise QserveError(f"graph_memory_mb must be a number > 0 (got {self.graph_memory_mb!r})")


BATCH_DEPENDENT = ("rows", "batched")
