"""The runtime contract shared by bench, serve and export: one loader, one Runtime interface.

    python -c "from qserve.runtime import load_runtime; \\
r = load_runtime('models/minilm-imdb-variants/onnx-int8'); print(r.predict(['great film']))"

`load_runtime(variant_dir, device)` verifies the manifest and builds the backend's Runtime (base.py): one tokenization
and the same predict/classify/logits/run over every forward, so a bench measures what is served (typed: contract.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

from qserve.artifact import VariantError
from qserve.extras import require
from qserve.placement import place
from qserve.runtime.base import Classification, Runtime, TextResult
from qserve.runtime.contract import ModelRuntime
from qserve.runtime.options import RuntimeOptions
from qserve.variants import BACKENDS, REGISTRY, load_target
from qserve.verify import verify

__all__ = ["Classification", "ModelRuntime", "Runtime", "RuntimeOptions", "TextResult", "load_runtime", "runtime_class"]


def runtime_class(backend: str) -> type[Runtime]:
    """The Runtime subclass the registry names for `backend`, imported now (a missing backend fails here)."""
    entry = REGISTRY[backend]
    return cast("type[Runtime]", load_target(entry.runtime, entry))


def load_runtime(
    variant_dir: str | Path,
    device: str = "auto",
    options: RuntimeOptions | None = None,
    verify_hashes: bool = True,
    allow_extra_files: bool = False,
) -> Runtime:
    variant_dir = Path(variant_dir)
    manifest = verify(variant_dir, check_hashes=verify_hashes, allow_extra_files=allow_extra_files)
    backend = manifest.backend
    if backend not in BACKENDS:
        raise VariantError(f"{variant_dir}/manifest.json names backend {backend!r}; known: {', '.join(BACKENDS)}")
    for module in REGISTRY[backend].needs:  # a missing one: its declaration's install hint
        require(module, manifest.name)
    # auto: the GPU where the variant runs on it, else the CPU (an ONNX variant beside the CPU onnxruntime)
    device = place(manifest.spec, device)
    return runtime_class(backend)(variant_dir, manifest, device, options or RuntimeOptions())
