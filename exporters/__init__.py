"""Exporters: one module per way of producing a variant, one export().

    qserve export models/minilm-imdb --bits 8          # -> models/minilm-imdb-variants/onnx-int8

export() builds in a temp dir, writes the manifest, gates parity against fp32 and only then renames into place;
a builder writes weights + config; which builds which is declared in qserve.variants.
"""

from __future__ import annotations

from exporters.core import export, get_builder

__all__ = ["export", "get_builder"]
