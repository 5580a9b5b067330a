"""A quantized variant's layers, put back to full precision any few at a time on its own loaded graph.

    python -c "from exporters.layers import open_layers; l = open_layers('RUN/variants/onnx-int8', 'RUN/checkpoint'); \\
print(l.names)"

What the repair ranks and searches with (qserve/repair.py): each backend's subclass (in its exporter module, named by
its declaration's `layers`) swaps layers on the graph the variant's runtime already runs, so a candidate costs one
graph edit, not an export; the names are what the backend's keep_fp32 option takes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from qserve import QserveError
from qserve.artifact import read_manifest
from qserve.runtime import RuntimeOptions, load_runtime
from qserve.variants import backend_of, load_target


class Layers:
    """A variant's runtime (CPU, rows one after another) whose quantized layers `use` puts back to fp32."""

    shift: Any = 0.0
    """What the variant's export would take out of its logits for the layers in use (onnx-int8's bias correction):
    the runtime's logits minus this are the candidate's."""

    def __init__(self, variant: Path, checkpoint: Path, threads: int | None = None):
        self.variant, self.checkpoint = Path(variant), Path(checkpoint)
        # the backend's own Runtime: each subclass swaps what its runtime runs (a session, a compiled model, modules)
        self.rt: Any = load_runtime(self.variant, "cpu", RuntimeOptions(threads=threads, row_workers=1))
        self.threads = threads
        self.names: list[str] = self.open()

    def open(self) -> list[str]:
        """The quantized layers, in graph order, by the names keep_fp32 takes."""
        raise NotImplementedError

    def use(self, kept: Sequence[str]) -> None:
        """Run the variant with exactly `kept` of its quantized layers in fp32 from now on."""
        raise NotImplementedError

    def close(self) -> None:
        self.rt.close()


def open_layers(variant: Path | str, checkpoint: Path | str, threads: int | None = None) -> Layers:
    """The variant's layers through its backend's `layers` class; a backend without one cannot be repaired."""
    name = read_manifest(Path(variant)).name
    backend = backend_of(name)
    if not backend.layers:
        raise QserveError(f"{name}: the {backend.name} backend declares no way to keep layers in fp32 (repair)")
    return load_target(backend.layers, backend)(Path(variant), Path(checkpoint), threads)
