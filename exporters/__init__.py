"""Exporters: one module per way of producing a variant, one export().

    qserve export models/minilm-imdb --bits 8          # -> models/minilm-imdb-variants/onnx-int8

export() builds in a temp dir, writes the manifest, gates parity against fp32 and only then renames into place;
a builder writes weights + config; which builds which is declared in qserve.variants.
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
    """Build variant `name` from `checkpoint` into `out`; returns the written manifest. `long_text` overrides the
    checkpoint's policy; `inputs` what one input is (("text", "text_pair"): a pair model; None: the checkpoint's)."""
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
