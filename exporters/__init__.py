"""Exporters: one module per way of producing a variant, one registry, one export().

    qserve export models/minilm-imdb --bits 8          # -> models/minilm-imdb-variants/onnx-int8

`export(checkpoint, name, out)` builds the variant in a temp dir beside `out`,
copies the tokenizer, writes the manifest, loads it back through the runtime
contract, gates parity against the fp32 reference, and only then renames it into
place. A builder only has to write weights + config into the directory it is given.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from qserve.variants import VARIANTS, VariantSpec, get_spec

# name -> "module:function"; the function is (checkpoint_dir, out_dir, spec, options) -> dict of
# extra manifest fields. Imported lazily so a missing backend fails only its own variants.
_BUILDERS: dict[str, str] = {
    "torch-fp32": "exporters.torch_dtype:build",
    "torch-fp16": "exporters.torch_dtype:build",
    "torch-bf16": "exporters.torch_dtype:build",
    "bnb-int8": "exporters.bnb:build",
    "bnb-nf4": "exporters.bnb:build",
    "bnb-fp4": "exporters.bnb:build",
    "onnx-fp32": "exporters.onnx:build",
    "onnx-fp16": "exporters.onnx:build",
    "onnx-int8": "exporters.onnx:build",
    "onnx-int4": "exporters.onnx:build",
    "ov-fp32": "exporters.openvino:build",
    "ov-bf16": "exporters.openvino:build",
    "ov-int8": "exporters.openvino:build",
}
assert set(_BUILDERS) == set(VARIANTS), "every variant in qserve.variants needs a builder"

Builder = Callable[[Path, Path, VariantSpec, dict[str, Any]], dict[str, Any]]


def get_builder(name: str) -> Builder:
    get_spec(name)  # clear error for unknown names
    module, func = _BUILDERS[name].split(":")
    return getattr(importlib.import_module(module), func)


def export(checkpoint: str | Path, name: str, out: str | Path, force: bool = False,
           options: dict[str, Any] | None = None, device: str = "cpu", probes: list[str] | None = None,
           long_text: str | None = None) -> dict:
    """Build variant `name` from `checkpoint` into `out`; returns the written manifest. `long_text`
    overrides the long-text policy the checkpoint recorded (see qserve/longtext.py)."""
    from exporters.core import export_variant

    return export_variant(Path(checkpoint), get_spec(name), Path(out), force=force,
                          options=options or {}, device=device, probes=probes, long_text=long_text)
