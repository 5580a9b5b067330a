"""Exporters: one module per way of producing a variant, one export().

    qserve export models/minilm-imdb --bits 8          # -> models/minilm-imdb-variants/onnx-int8

`export(checkpoint, name, out)` builds the variant in a temp dir beside `out`,
copies the tokenizer, writes the manifest, loads it back through the runtime
contract, gates parity against the fp32 reference, and only then renames it into
place. A builder only has to write weights + config into the directory it is given;
which module builds which variant is declared in the backend registry (qserve.variants).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from exporters.core import export_variant, get_builder
from qserve.variants import get_spec

if TYPE_CHECKING:
    from qserve.artifact import Manifest

__all__ = ["export", "get_builder"]


def export(
    checkpoint: str | Path,
    name: str,
    out: str | Path,
    force: bool = False,
    options: dict[str, Any] | None = None,
    device: str = "cpu",
    probes: list[str] | None = None,
    long_text: str | None = None,
    inputs: tuple[str, ...] | None = None,
) -> Manifest:
    """Build variant `name` from `checkpoint` into `out`; returns the written manifest. `long_text`
    overrides the long-text policy the checkpoint recorded (see qserve/longtext.py); `inputs` what one
    input of the model is (("text", "text_pair"): a pair model trained elsewhere; None: the checkpoint's)."""
    return export_variant(
        Path(checkpoint),
        get_spec(name),
        Path(out),
        force=force,
        options=options or {},
        device=device,
        probes=probes,
        long_text=long_text,
        inputs=inputs,
    )
