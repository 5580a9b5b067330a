"""torch-fp32 / torch-fp16 / torch-bf16: the checkpoint saved in another dtype.

qserve export models/minilm-imdb --bits 16 --backend torch --dtype bf16
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from qserve.variants import BackendOptions, VariantSpec

if TYPE_CHECKING:
    from exporters.core import ExportContext

TORCH_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def build(ctx: ExportContext, out: Path, spec: VariantSpec, opts: BackendOptions) -> dict[str, dict[str, Any]]:
    import torch
    from transformers import AutoModelForSequenceClassification

    dtype = getattr(torch, TORCH_DTYPES[spec.dtype])
    model = AutoModelForSequenceClassification.from_pretrained(ctx.checkpoint, dtype=torch.float32)
    model.to(dtype).save_pretrained(out, safe_serialization=True)
    return {}
