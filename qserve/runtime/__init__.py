"""The runtime contract shared by bench and serve: one loader, one predict().

    python -c "from qserve.runtime import load_runtime; r = load_runtime('models/minilm-imdb-variants/onnx-int8'); print(r.predict(['great film']))"

`load_runtime(variant_dir, device)` verifies the manifest, then dispatches on the
spec's backend. Every runtime tokenizes the same way (truncation to the variant's
max_length, dynamic padding) so a benchmark measures exactly what is served.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qserve.runtime.base import Runtime, RuntimeOptions

__all__ = ["Runtime", "RuntimeOptions", "load_runtime"]


def load_runtime(variant_dir: str | Path, device: str = "auto", options: RuntimeOptions | None = None,
                 verify_hashes: bool = True, allow_extra_files: bool = False) -> Runtime:
    from qserve.artifact import verify
    from qserve.devices import resolve_device

    variant_dir = Path(variant_dir)
    manifest: dict[str, Any] = verify(variant_dir, check_hashes=verify_hashes,
                                     allow_extra_files=allow_extra_files)
    device = resolve_device(device)
    options = options or RuntimeOptions()
    backend = manifest["spec"]["backend"]
    if backend in ("torch", "bnb"):
        from qserve.runtime.torch_rt import TorchRuntime

        return TorchRuntime(variant_dir, manifest, device, options)
    if backend == "onnx":
        from qserve.runtime.onnx_rt import OnnxRuntime

        return OnnxRuntime(variant_dir, manifest, device, options)
    if backend == "openvino":
        from qserve.runtime.openvino_rt import OpenVINORuntime

        return OpenVINORuntime(variant_dir, manifest, device, options)
    from qserve.artifact import VariantError

    raise VariantError(f"{variant_dir}/manifest.json names backend {backend!r}; known: torch, bnb, onnx, openvino")
