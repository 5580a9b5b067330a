"""CUDA graphs for the torch variants: which captured graph serves which rows, within a bounded count and memory.

    python -c "from qserve.runtime.graphs import batch_buckets as b, split; print(b(64), split(45, b(64)))"

The GPU-free part of torch_rt.py's CUDA graphs, tested on CPU: the modes, the (batch, length) buckets, capture order
and bounds, how rows split over graphs, `auto`'s choice; the capture is a `Capture` torch_rt supplies. A shape past
a bound is refused, never evicted; its rows run on smaller buckets, or eager (counted) where no graph exists.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from qserve import QserveError
from qserve.runtime.buckets import auto_buckets

AUTO, OFF, GRAPHS, COMPILE = "auto", "off", "graphs", "compile"
MODES = (AUTO, OFF, GRAPHS, COMPILE)
FLAG = "--cuda-graphs"
EAGER = "eager"
"""The mode a runtime reports when it runs without graphs (off, a CPU device, or auto's choice)."""
DEFAULT_BATCH_CAP = 64
"""The largest batch bucket when the runtime is given no row cap (bench, predict); serve caps at its max batch."""
MAX_GRAPHS = 64
"""Most graphs one runtime captures."""
MEMORY_MB = 4096
"""CUDA memory (MiB) the captures of one runtime may take before it stops capturing."""
CHECK_TOLERANCE = 1e-3
"""The largest |Δlogit| (relative to the largest |logit|, at least 1) between a graph's replay and the eager forward
of the same block that lets the graphs serve: more means the captured kernels depend on data (a value frozen at
capture), so the variant runs eager."""

Shape = tuple[int, int]
"""(batch, length): the static input shape of one graph."""


class Captured(Protocol):
    """One captured graph: its static inputs filled from a block, replayed, its outputs' first rows copied out."""

    nbytes: int
    """CUDA memory its capture took (static buffers included)."""
    staging: np.ndarray | None
    """Where its block is best staged (its pinned host buffer: no copy on the way in), or None."""

    def __call__(self, block: np.ndarray, rows: int) -> np.ndarray:
        """block: int64 [inputs, batch, length] (stage()); -> float32 logits of the first `rows` rows."""
        ...


Capture = Callable[[Shape], Captured]
"""(batch, length) -> the captured graph of that shape (raises when the shape cannot be captured)."""


def parse_mode(value: str | None) -> str:
    """auto | off | graphs | compile (None = auto); anything else is an error naming the flag."""
    mode = (value or AUTO).strip().lower()
    if mode not in MODES:
        raise QserveError(f"{FLAG} must be one of {', '.join(MODES)} (got {value!r})")
    return mode


def batch_buckets(cap: int) -> tuple[int, ...]:
    """Powers of two below `cap`, then `cap` itself: 48 -> (1, 2, 4, 8, 16, 32, 48)."""
    if cap < 1:
        raise QserveError(f"the graph batch cap must be >= 1 (got {cap})")
    return auto_buckets(cap, first=1)


def capture_order(lengths: Sequence[int], batches: Sequence[int], max_graphs: int) -> list[Shape]:
    """The shapes to capture, in order, at most `max_graphs`: every length at batch 1 first (so every text has a
    graph of its own length), then each larger batch bucket at every length."""
    order = [(b, n) for b in sorted(batches) for n in sorted(lengths)]
    return order[: max(0, max_graphs)]


def split(n: int, batches: Sequence[int]) -> list[tuple[int, int | None]]:
    """`n` rows over the batch buckets that have a graph: [(rows, bucket)], chunks of the largest bucket, then the
    rest in the smallest bucket that holds it (45 over 1..32: 32 + 13 in 16). bucket None: no graph, run eager."""
    usable = sorted(set(batches))
    if n <= 0:
        return []
    if not usable:
        return [(n, None)]
    top = usable[-1]
    out: list[tuple[int, int | None]] = []
    left = n
    while left >= top:
        out.append((top, top))
        left -= top
    if left:
        out.append((left, next(b for b in usable if b >= left)))
    return out


def stage(
    batch: Mapping[str, np.ndarray],
    names: Sequence[str],
    start: int,
    stop: int,
    bucket: int,
    pad_id: int,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Rows start:stop of `batch` (every row already padded to one length) as one int64 block [len(names), bucket,
    length], the inputs in `names` order; the rows past them are filler: input_ids pad_id, attention on the first
    token only (a row that attends to nothing would compute NaN), every other input 0. `out`: write into it."""
    length = batch["input_ids"].shape[1]
    block = np.empty((len(names), bucket, length), dtype=np.int64) if out is None else out
    rows = stop - start
    for i, name in enumerate(names):
        block[i, :rows] = batch[name][start:stop]
        block[i, rows:] = pad_id if name == "input_ids" else 0
        if name == "attention_mask" and rows < bucket:
            block[i, rows:, 0] = 1
    return block


class Graphs:
    """The graphs of one runtime: captured by `capture` in capture_order(), within `max_graphs` and `memory_mb`;
    run() serves a batch of one length from them. lazy: a shape is captured on its first use instead of by
    prepare() (torch.compile's, whose compiling takes seconds per shape)."""

    def __init__(
        self,
        capture: Capture,
        names: Sequence[str],
        pad_id: int,
        lengths: Sequence[int],
        batches: Sequence[int],
        max_graphs: int = MAX_GRAPHS,
        memory_mb: float = MEMORY_MB,
        lazy: bool = False,
    ):
        self.capture = capture
        self.names = list(names)
        self.pad_id = int(pad_id)
        self.lengths = tuple(sorted(lengths))
        self.batches = tuple(sorted(batches))
        # every bucket is declared; the count bound refuses (and records) the ones past it
        self.declared = capture_order(self.lengths, self.batches, len(self.lengths) * len(self.batches))
        self.max_graphs = max_graphs
        self.memory_mb = memory_mb
        self.lazy = lazy
        self.graphs: dict[Shape, Captured] = {}
        self.refused: dict[Shape, str] = {}
        """Shapes that will not get a graph, and why (a bound, or the capture's error)."""
        self.nbytes = 0
        self.eager_rows = 0
        """Rows run eager because their length had no graph (counted, not hidden)."""

    # -- capturing ----------------------------------------------------------------------------
    def prepare(self) -> None:
        """Capture every declared shape now, in order (until a bound refuses the rest). When the very first
        capture fails, the kernels cannot be captured at all (they sync, or allocate outside torch): the rest is
        not tried."""
        for i, shape in enumerate(self.declared):
            self._graph(shape)
            if i == 0 and shape in self.refused:
                for rest in self.declared[1:]:
                    self.refused[rest] = f"not tried: the first capture ({shape[0]}x{shape[1]}) failed"
                return

    def _graph(self, shape: Shape) -> Captured | None:
        """The graph of `shape`: captured already, captured now (within the bounds), or None (refused)."""
        g = self.graphs.get(shape)
        if g is not None or shape in self.refused:
            return g
        if shape not in self.declared:
            self.refused[shape] = "not a declared bucket"
            return None
        if len(self.graphs) >= self.max_graphs:
            self.refused[shape] = f"count bound: {self.max_graphs} graphs captured"
            return None
        if self.nbytes > self.memory_mb * 2**20:
            self.refused[shape] = f"memory bound: the graphs hold {self.nbytes / 2**20:.0f} of {self.memory_mb:g} MiB"
            return None
        try:
            g = self.capture(shape)
        except Exception as e:  # a shape the kernels cannot capture: recorded, its rows use other graphs
            self.refused[shape] = f"capture failed: {type(e).__name__}: {e}"[:300]
            return None
        self.graphs[shape] = g
        self.nbytes += int(g.nbytes)
        return g

    def usable(self, length: int) -> list[int]:
        """Batch buckets of `length` that have (lazy: or may still get) a graph."""
        if self.lazy:
            return [b for b, n in self.declared if n == length and (b, n) not in self.refused]
        return sorted(b for b, n in self.graphs if n == length)

    # -- serving ------------------------------------------------------------------------------
    def run(self, batch: Mapping[str, np.ndarray], eager: Callable[[dict[str, np.ndarray]], np.ndarray]) -> np.ndarray:
        """Logits of a batch whose rows are all padded to one length: chunks replayed on the graphs of that length
        (each chunk's rows plus filler up to its batch bucket; only its own rows come back), `eager` for rows of a
        length without a graph."""
        n, length = batch["input_ids"].shape
        parts: list[np.ndarray] = []
        start = 0
        while start < n:
            rows, bucket = split(n - start, self.usable(length))[0]
            if bucket is None:
                parts.append(eager({k: v[start : start + rows] for k, v in batch.items()}))
                self.eager_rows += rows
            else:
                g = self._graph((bucket, length))
                if g is None:
                    continue  # refused just now: usable() no longer offers it
                block = stage(batch, self.names, start, start + rows, bucket, self.pad_id, out=g.staging)
                parts.append(g(block, rows))
            start += rows
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def summary(self) -> dict[str, Any]:
        """What was captured and refused, for the runtime's `execution` record (bench report, /v1/models)."""
        return {
            "lengths": list(self.lengths),
            "batches": list(self.batches),
            "lazy": self.lazy,
            "captured": [f"{b}x{n}" for b, n in sorted(self.graphs)],
            "count": len(self.graphs),
            "max_graphs": self.max_graphs,
            "memory_mb": round(self.nbytes / 2**20, 1),
            "memory_bound_mb": self.memory_mb,
            "refused": {f"{b}x{n}": why for (b, n), why in sorted(self.refused.items())},
        }


def choose(asked: str, timings: Mapping[str, Mapping[str, float]]) -> tuple[str, str]:
    """auto's choice on CUDA from a short measurement at load: (GRAPHS or EAGER, why). `timings`: per shape
    ("1x128"), the median ms of "eager" and "graphs" (the same padded block both ways, host copies included).
    Graphs serve when their summed time is not above eager's; an explicit mode is kept as asked."""
    if asked != AUTO:
        return (EAGER if asked == OFF else asked), f"{FLAG} {asked}"
    shapes = [k for k, v in timings.items() if "eager" in v and "graphs" in v]
    if not shapes:
        return EAGER, "auto: nothing measured, so eager"
    eager = sum(timings[k]["eager"] for k in shapes)
    graphs = sum(timings[k]["graphs"] for k in shapes)
    said = ", ".join(
        f"b{k.replace('x', '/s')} {timings[k]['graphs']:.3f} vs {timings[k]['eager']:.3f} ms" for k in shapes
    )
    if graphs <= eager:
        return GRAPHS, f"auto: graphs measured faster than eager at load ({said}, graphs vs eager)"
    return EAGER, f"auto: eager measured faster than graphs at load ({said}, graphs vs eager)"


def check_close(graph: np.ndarray, eager: np.ndarray) -> tuple[bool, float]:
    """(whether a graph's replay matches the eager forward of the same block, the max |Δlogit|)."""
    delta = float(np.max(np.abs(np.asarray(graph, np.float64) - np.asarray(eager, np.float64)))) if graph.size else 0.0
    scale = max(1.0, float(np.max(np.abs(eager)))) if eager.size else 1.0
    return delta <= CHECK_TOLERANCE * scale, delta
