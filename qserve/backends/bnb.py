"""bitsandbytes: LLM.int8 and 4-bit weights (exporters/bnb.py), run by transformers (runtime/torch_rt.py).

qserve export models/minilm-imdb --bits 4 --backend bnb --dtype nf4
"""

from __future__ import annotations

from dataclasses import dataclass

from qserve.backends import Backend, BackendOptions, VariantSpec, calibration_samples, keep_fp32
from qserve.exportoption import option


@dataclass(frozen=True)
class BnbOptions(BackendOptions):
    llm_int8_threshold: float | None = option(
        {"bnb-int8": 6.0},
        "LLM.int8 activation outlier threshold (0 turns the fp16 outlier path off)",
        allowed="a number >= 0",
        check=lambda v: v >= 0,
        coerce=True,
    )
    double_quant: bool | None = option(
        {"bnb-nf4": False, "bnb-fp4": False}, "quantize the 4-bit block scales too", coerce=True
    )
    # on for fp4, where it lifts agreement with fp32; off for nf4, where it changed nothing beyond noise
    clip: bool | None = option(
        {"bnb-nf4": False, "bnb-fp4": True},
        "clip each 64-weight block to the range that minimises its output "
        "error on calibration texts before quantizing (exporters.clipping)",
        coerce=True,
    )
    calibration_samples: int | None = calibration_samples(
        {"bnb-nf4": 64, "bnb-fp4": 64}, "the clipping", "the weight clipping"
    )
    keep_fp32: str | None = keep_fp32(
        {"bnb-int8": "", "bnb-nf4": "", "bnb-fp4": ""}, "module names", "distilbert.transformer.layer.0.ffn.lin2"
    )


BACKEND = Backend(
    "bnb",
    "exporters.bnb:build",
    "qserve.runtime.torch_rt:TorchRuntime",
    # On CPU, LLM.int8 multiplies in int8 (VNNI's kernel) and the 4-bit layers dequantize into bf16 matmuls.
    (
        VariantSpec("bnb-int8", "bnb", 8, "int8", tolerance=5e-1, default_for=("cuda",), cpu_needs=("vnni",)),
        VariantSpec("bnb-nf4", "bnb", 4, "nf4", tolerance=1.0, default_for=("cuda",), cpu_needs=("bf16",)),
        VariantSpec("bnb-fp4", "bnb", 4, "fp4", tolerance=1.5, cpu_needs=("bf16",)),
    ),
    BnbOptions,
    libraries=("torch", "transformers.models.auto.modeling_auto", "bitsandbytes"),
    needs=("bitsandbytes", "accelerate"),
    install="pip install bitsandbytes==0.50.2 accelerate",
    layers="exporters.bnb:BnbLayers",
    distributions=("bitsandbytes",),
    colour="#CC79A7",
    torch_threads=True,
    order=1,
)
