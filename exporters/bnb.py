"""bnb-int8 / bnb-nf4 / bnb-fp4: bitsandbytes weight quantization, saved already quantized.

    qserve export models/minilm-l6-distilbert-imdb --bits 4 --backend bnb --dtype nf4

Quantized on load through a `BitsAndBytesConfig` and written with save_pretrained (config.json holds the
quantization_config), so the variant loads without the fp32 checkpoint. fp4 (nf4 with `--clip`) clips each weight
block first (exporters.clipping).
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exporters import clipping
from exporters.layers import Layers
from qserve import QserveError
from qserve.backends import listed
from qserve.backends.bnb import BnbOptions
from qserve.variants import VariantSpec

if TYPE_CHECKING:
    from exporters.core import ExportContext

# The head stays full precision: tiny, where the logits are made, and the CPU 4-bit kernel needs out_features % 32.
SKIP_MODULES = ("pre_classifier", "classifier")

# 4-bit matmuls compute in bf16: the CPU kernel is bf16-only, and bf16 keeps fp32's range on CUDA.
COMPUTE_DTYPE_4BIT = "bfloat16"
# Modules bnb does not quantize stay fp32 (transformers' fp16 default has no fast CPU kernels).
UNQUANTIZED_DTYPE = "float32"


def skip_modules(opts: BnbOptions) -> tuple[str, ...]:
    """llm_int8_skip_modules: the head, and the keep_fp32 modules by their full names, escaped (transformers reads
    each entry as a regex prefix, an exact name or a suffix)."""
    return SKIP_MODULES + tuple(map(re.escape, listed(opts.keep_fp32)))


def quantization_kwargs(spec: VariantSpec, opts: BnbOptions) -> dict[str, Any]:
    """The BitsAndBytesConfig arguments for a variant (plain JSON, recorded in the manifest)."""
    if spec.dtype == "int8":
        return {
            "load_in_8bit": True,
            "llm_int8_threshold": opts.llm_int8_threshold,
            "llm_int8_skip_modules": list(skip_modules(opts)),
        }
    if spec.dtype in ("nf4", "fp4"):
        # llm_int8_skip_modules is also the 4-bit skip list in transformers' bnb integration.
        return {
            "load_in_4bit": True,
            "bnb_4bit_quant_type": spec.dtype,
            "bnb_4bit_compute_dtype": COMPUTE_DTYPE_4BIT,
            "bnb_4bit_use_double_quant": opts.double_quant,
            "llm_int8_skip_modules": list(skip_modules(opts)),
        }
    raise QserveError(f"{spec.name}: bitsandbytes stores int8, nf4 or fp4, not {spec.dtype!r}")


def quantized_linears(model: Any) -> dict[str, Any]:
    """name -> module for every bitsandbytes Linear (8-bit or 4-bit) in the model."""
    import bitsandbytes as bnb

    return {n: m for n, m in model.named_modules() if isinstance(m, (bnb.nn.Linear8bitLt, bnb.nn.Linear4bit))}


def weight_bytes(weights_file: Path, linears: dict[str, tuple[int, int]]) -> dict[str, int]:
    """Bytes the quantized linears take on disk (weights + scales + quant state) vs fp32."""
    from safetensors import safe_open

    _ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
    stored = 0
    with safe_open(str(weights_file), framework="pt") as f:
        for key in f.keys():
            # `<module>.weight` and its quant-state entries (`<module>.weight.SCB`, `.absmax`, ...)
            module, sep, _ = key.partition(".weight")
            if sep and module in linears:
                sl = f.get_slice(key)
                n = 1
                for d in sl.get_shape():
                    n *= d
                stored += n * _ITEMSIZE[sl.get_dtype()]
    fp32 = sum(o * i * 4 for o, i in linears.values())
    return {"quantized_linear_bytes": stored, "quantized_linear_bytes_fp32": fp32}


def build(ctx: ExportContext, out: Path, spec: VariantSpec, opts: BnbOptions) -> dict[str, dict[str, Any]]:
    checkpoint = ctx.checkpoint
    record: dict[str, Any] = {}
    # the clipped fp32 weights: a scratch input to the quantizer, kept until the variant is saved (still mapped)
    with tempfile.TemporaryDirectory(prefix="qserve-clip-") as scratch:
        source = checkpoint
        if opts.clip:
            source = Path(scratch)
            record["clipping"], clipped = clipping.clip_checkpoint(
                ctx, source, spec.dtype, int(opts.calibration_samples or 0), skip_modules(opts)
            )
        model = _quantized_model(source, spec, opts)
        if "clipping" in record:
            _check_clipped(model, clipped, record["clipping"]["block_size"], spec.name)
        linears = quantized_linears(model)
        unknown = sorted(set(listed(opts.keep_fp32)) - dict(model.named_modules()).keys())
        if unknown:
            raise QserveError(
                f"option keep_fp32: {', '.join(map(repr, unknown))} matches no module; its quantized Linears' "
                f"names look like {', '.join(list(linears)[:2])}, ... ({len(linears)} in all)"
            )
        if not linears:
            raise QserveError(
                f"{spec.name}: bitsandbytes quantized no Linear layer of {checkpoint}; "
                "is it a DistilBERT-style classifier?"
            )
        shapes = {n: (m.out_features, m.in_features) for n, m in linears.items()}
        model.save_pretrained(out, safe_serialization=True)
    weights = Path(out) / "model.safetensors"
    sizes = weight_bytes(weights, shapes) if weights.is_file() else {}
    return {
        "bnb": {
            "quantization_config": quantization_kwargs(spec, opts),
            "options": opts.to_json(),
            "unquantized_dtype": UNQUANTIZED_DTYPE,
            "quantized_linear_modules": len(linears),
            "skipped_modules": list(skip_modules(opts)),
            **sizes,
            **record,
        }
    }


def _quantized_model(source: Path, spec: VariantSpec, opts: BnbOptions) -> Any:
    import torch
    from transformers import AutoModelForSequenceClassification, BitsAndBytesConfig

    config_kwargs = quantization_kwargs(spec, opts)
    if "bnb_4bit_compute_dtype" in config_kwargs:
        config_kwargs["bnb_4bit_compute_dtype"] = getattr(torch, config_kwargs["bnb_4bit_compute_dtype"])
    # quantize on CPU whatever the export device: the stored format is the same
    return AutoModelForSequenceClassification.from_pretrained(
        source,
        quantization_config=BitsAndBytesConfig(**config_kwargs),
        device_map={"": "cpu"},
        dtype=getattr(torch, UNQUANTIZED_DTYPE),
    ).eval()


def _check_clipped(model: Any, clipped: list[str], block: int, name: str) -> None:
    """Clipping is only right for the Linears bitsandbytes then quantized, at the block size it used."""
    linears = quantized_linears(model)
    if set(linears) != set(clipped):
        # a mismatch means the skip rule and transformers' differ
        raise QserveError(
            f"{name}: clipping covered {len(clipped)} Linears but bitsandbytes quantized "
            f"{len(linears)} ({sorted(set(clipped) ^ set(linears))[:4]} differ); "
            "export with --no-clip"
        )
    sizes = {m.weight.quant_state.blocksize for m in linears.values()}
    if sizes != {block}:
        raise QserveError(
            f"{name}: weights were clipped for blocks of {block} but bitsandbytes used {sorted(sizes)}; "
            "export with --no-clip"
        )


class BnbLayers(Layers):
    """bnb-int8 / nf4 / fp4: a layer goes back as the checkpoint's own fp32 Linear, swapped into the loaded model."""

    def open(self) -> list[str]:
        import torch
        from transformers import AutoModelForSequenceClassification

        self.fp32 = AutoModelForSequenceClassification.from_pretrained(self.checkpoint, dtype=torch.float32).eval()
        self.quantized = quantized_linears(self.rt.model)
        return list(self.quantized)

    def use(self, kept: Sequence[str]) -> None:
        for name, module in self.quantized.items():
            parent, _, child = name.rpartition(".")
            swap = self.fp32.get_submodule(name) if name in kept else module
            setattr(self.rt.model.get_submodule(parent), child, swap)
