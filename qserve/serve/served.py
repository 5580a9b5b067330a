"""One served model: the runtime contract serve needs, the default loader, the ServedModel unit
(runtime + batcher + version + shadow) and the weak trace a retired version leaves.

    python -c "from qserve.serve.served import load_model; from qserve.serve.config import ServeConfig; \\
m = load_model(ServeConfig(variant_dir='models/minilm-imdb-variants/onnx-int8', device='cpu')); print(m.name)"

state.py builds and swaps these; routes reach them through ServeState.model(name).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import numpy as np

from qserve.serve.batcher import Batcher
from qserve.serve.config import ServeConfig
from qserve.serve.metrics import ModelMetrics
from qserve.serve.repository import Selection
from qserve.serve.shadow import Shadow


class ModelRuntime(Protocol):
    """What serve needs from a loaded variant; qserve.runtime.Runtime (load_runtime's result) is one."""

    name: str
    """The variant's spec name (the served name unless --model-name or NAME=DIR overrides it)."""
    labels: list[str]
    max_length: int
    """Token limit; longer texts are truncated, and classify() says which were."""
    manifest: dict[str, Any]
    device: str
    row_workers: int
    """Rows of a batch computed side by side (1 unless the backend runs rows on their own threads)."""

    def classify(self, texts: list[str]) -> tuple[np.ndarray, list[bool]]:
        """Probabilities [len(texts), len(labels)] and, per text, whether it was truncated."""
        ...

    def close(self) -> None: ...


Loader = Callable[[ServeConfig], ModelRuntime]
"""config -> the loaded model; create_app takes one (tests wrap the real runtime through it)."""
Offer = Callable[[list[str], np.ndarray], None]


def load_model(config: ServeConfig) -> ModelRuntime:
    """The default Loader: load_runtime on config.variant_dir (manifest verified) with the serve flags."""
    from qserve.runtime import RuntimeOptions, load_runtime

    options = RuntimeOptions(threads=config.threads, row_workers=config.row_workers)
    return load_runtime(config.variant_dir, config.device, options, allow_extra_files=config.allow_extra_files)


@dataclass(eq=False)
class ServedModel:
    """One model a server answers for: its runtime, its batcher, its name, version and origin."""

    name: str
    runtime: ModelRuntime
    batcher: Batcher
    version: str = ""
    """The manifest's short hash: what every answer of this model carries as model_version."""
    variant_dir: str = ""
    selection: Selection | None = None
    metrics: ModelMetrics | None = field(default=None, repr=False)
    shadow: Shadow | None = field(default=None, repr=False)

    def summary(self) -> dict[str, Any]:
        """The model's entry in /v1/models: manifest facts, no file contents."""
        rt = self.runtime
        m = rt.manifest
        files = m.get("files") or {}
        return {"id": self.name, "version": self.version, "model_name": m.get("model_name"), "spec": m.get("spec"),
                "labels": list(rt.labels), "max_length": rt.max_length, "parity": m.get("parity"),
                "created": m.get("created"), "device": rt.device, "dir": self.variant_dir, "files": len(files),
                "bytes": sum(int(f.get("bytes", 0)) for f in files.values() if isinstance(f, dict)),
                "versions": m.get("versions"), "selection": self.selection,
                "shadow": self.shadow.summary() if self.shadow is not None else None}


class Retired(NamedTuple):
    """A model version that was swapped out or unloaded, and a weak reference to its runtime."""

    name: str
    version: str
    runtime: weakref.ref

    @property
    def released(self) -> bool:
        return self.runtime() is None


def infer_fn(runtime: ModelRuntime, offer: Offer | None = None) -> Callable[[list[str]], tuple[np.ndarray, list[bool]]]:
    def infer(texts: list[str]) -> tuple[np.ndarray, list[bool]]:
        # Tokenizing happens here, on the inference thread: the fast tokenizer is not thread-safe.
        probs, truncated = runtime.classify(texts)
        probs = np.asarray(probs, dtype=np.float32)
        if offer is not None:  # the shadow samples what was served; it never blocks
            offer(texts, probs)
        return probs, [bool(t) for t in truncated]

    return infer
