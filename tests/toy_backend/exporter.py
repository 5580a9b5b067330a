"""The toy backend's exporter: the checkpoint's weights saved again in fp32, its option recorded."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def build(ctx: Any, out: Path, spec: Any, opts: Any) -> dict[str, dict[str, Any]]:
    import torch
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(ctx.checkpoint, dtype=torch.float32)
    model.save_pretrained(out)
    return {"toy": {"options": opts.to_json(), "files": sorted(p.name for p in Path(out).iterdir())}}
