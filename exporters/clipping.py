"""Activation-aware weight clipping before bitsandbytes 4-bit: each block's range chosen by its output error.

    qserve export models/minilm-l6-distilbert-imdb --bits 4 --backend bnb --dtype fp4             # clipping on
    qserve export models/minilm-l6-distilbert-imdb --bits 4 --backend bnb --dtype nf4 --clip      # off by default

Each block is clamped to r * absmax, r from RATIOS minimising the output error on training texts (r = 1 wins
ties); the variant stays plain bitsandbytes format (docs/export.md).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exporters.calibration import calibration_set
from exporters.core import as_context
from qserve.modeling import model_inputs

if TYPE_CHECKING:
    from exporters.core import ExportContext

RATIOS = tuple(round(1.0 - 0.01 * i, 2) for i in range(71))  # 1.00 down to 0.30; smaller never won here


def bnb_block_size() -> int:
    """The block size bitsandbytes gives 4-bit weights quantized through transformers (64; 128 on ROCm)."""
    import bitsandbytes as bnb
    import torch

    return int(bnb.nn.Params4bit(torch.empty(0), requires_grad=False).blocksize)


def code_book(quant_type: str):
    """bitsandbytes' 16 code values for `quant_type` (nf4 or fp4), sorted, and the midpoints between them."""
    import bitsandbytes.functional as F

    codes = F.get_4bit_type(quant_type, device="cpu").float().sort().values
    return codes, (codes[1:] + codes[:-1]) / 2


def second_moments(model: Any, batches: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    """E[x_j^2] of each named Linear's input, per input channel, over the batches' unpadded tokens."""
    import torch

    sums: dict[str, Any] = {}
    counts = dict.fromkeys(names, 0)
    mask: list[Any] = [None]

    def record(name, _module, inputs, _output):
        x = inputs[0].detach().float()
        rows = x[mask[0]] if x.dim() == 3 and x.shape[:2] == mask[0].shape else x.reshape(-1, x.shape[-1])
        sums[name] = sums.get(name, 0) + (rows**2).sum(0)
        counts[name] += rows.shape[0]

    modules = dict(model.named_modules())
    handles = [modules[n].register_forward_hook(functools.partial(record, n)) for n in names]
    inputs = model_inputs(model)
    try:
        with torch.inference_mode():
            for batch in batches:
                feed = {k: torch.from_numpy(v) for k, v in batch.items() if k in inputs}
                mask[0] = feed["attention_mask"].bool()
                model(**feed)
    finally:
        for h in handles:
            h.remove()
    return {n: sums[n] / max(counts[n], 1) for n in names}


def clip_blocks(weight: Any, h: Any, quant_type: str, block: int, ratios: tuple[float, ...] = RATIOS):
    """Clip each `block`-sized run of the flattened (out, in) `weight` (bitsandbytes' layout) to its best r * absmax:
    (clipped weight, r per block, weighted error before, after)."""
    import torch

    codes, mids = code_book(quant_type)
    out_f, in_f = weight.shape
    w = weight.detach().float().reshape(-1)
    hw = h.float().reshape(1, in_f).expand(out_f, in_f).reshape(-1)
    pad = (-w.numel()) % block  # a partial last block: zero weights clamp and quantize to zero
    W = torch.nn.functional.pad(w, (0, pad)).reshape(-1, block)
    H = torch.nn.functional.pad(hw, (0, pad)).reshape(-1, block)
    amax = W.abs().amax(1, keepdim=True)
    safe = torch.where(amax > 0, amax, torch.ones_like(amax))
    best_r = torch.ones_like(amax)
    best_e = plain = None
    for r in ratios:  # 1.0 first: a later ratio must be strictly better to win
        s = safe * r
        q = codes[torch.bucketize((W / s).clamp(-1, 1), mids)] * s
        e = (H * (q - W) ** 2).sum(1, keepdim=True)
        if best_e is None:
            best_e = plain = e
            continue
        better = e < best_e
        best_e = torch.where(better, e, best_e)
        best_r = torch.where(better, torch.full_like(best_r, r), best_r)
    assert plain is not None and best_e is not None  # the loop ran at least once (ratios is not empty)
    bound = amax * best_r
    clipped = torch.maximum(torch.minimum(W, bound), -bound).reshape(-1)[: w.numel()]
    return (clipped.reshape(out_f, in_f).to(weight.dtype), best_r.reshape(-1), float(plain.sum()), float(best_e.sum()))


def skipped(name: str, skip: tuple[str, ...]) -> bool:
    """Whether bitsandbytes leaves module `name` unquantized for llm_int8_skip_modules `skip`: transformers' own rule
    (a key matching as a regex prefix, the exact name or a suffix)."""
    from transformers.quantizers.quantizers_utils import should_convert_module

    return not should_convert_module(name, list(skip))


def clip_checkpoint(
    source: ExportContext | Path, dst: Path, quant_type: str, samples: int, skip: tuple[str, ...]
) -> tuple[dict[str, Any], list[str]]:
    """Write `checkpoint` to `dst` with every Linear bnb will quantize clipped for `quant_type`: (the manifest record,
    the clipped Linears' names, for the caller to check against what bitsandbytes quantized)."""
    import torch
    from transformers import AutoModelForSequenceClassification

    ctx = as_context(source)
    checkpoint = ctx.checkpoint
    block = bnb_block_size()
    model = AutoModelForSequenceClassification.from_pretrained(checkpoint, dtype=torch.float32).eval()
    names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and not skipped(n, skip)]
    batches, where = calibration_set(ctx, samples)
    moments = second_moments(model, batches, names)
    modules = dict(model.named_modules())
    ratios, before, after = [], 0.0, 0.0
    with torch.no_grad():
        for n in names:
            clipped, r, e0, e1 = clip_blocks(modules[n].weight, moments[n], quant_type, block)
            modules[n].weight.copy_(clipped)
            ratios.append(r)
            before, after = before + e0, after + e1
    model.save_pretrained(dst, safe_serialization=True)
    r = torch.cat(ratios)
    return {
        "method": "activation-aware weight clipping (AWQ's clip search): per block, r * absmax with r from "
        f"{RATIOS[-1]:.2f}-1.00 minimising sum E[x^2] (q(w) - w)^2",
        "quant_type": quant_type,
        "block_size": block,
        "calibration": where,
        "linears": len(names),
        "blocks": int(r.numel()),
        "blocks_clipped": int((r < 1).sum()),
        "mean_ratio": round(float(r.mean()), 4),
        "weighted_error": {"plain": before, "clipped": after, "ratio": round(after / before, 4) if before else None},
    }, names
