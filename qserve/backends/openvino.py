"""OpenVINO: an IR, int8 by NNCF (exporters/openvino.py), run by OpenVINO's CPU plugin (runtime/openvino_rt.py).

    qserve export models/minilm-imdb --variant ov-int8

CPU only: on a CUDA run its variants run on the CPU. ov-bf16 is the fp32 IR compiled with the bf16
inference-precision hint.
"""

from __future__ import annotations

from dataclasses import dataclass

from qserve.backends import Backend, BackendOptions, VariantSpec, calibration_samples, keep_fp32
from qserve.exportoption import option

OV_FP32 = "f32"
"""OpenVINO's name for fp32 compute: what ov-fp32 runs in, and ov-int8's default for the ops NNCF leaves unquantized."""


@dataclass(frozen=True)
class OpenVINOOptions(BackendOptions):
    calibration_samples: int | None = calibration_samples(
        {"ov-int8": 300}, "NNCF's quantization", "NNCF's activation ranges, SmoothQuant and bias correction"
    )
    inference_precision: str | None = option(
        {"ov-int8": OV_FP32},
        "precision of the ops NNCF leaves unquantized (bf16 needs avx512_bf16 or AMX)",
        choices=(OV_FP32, "bf16"),
        allowed=f"{OV_FP32} or bf16",
    )
    keep_fp32: str | None = keep_fp32(
        {"ov-int8": ""},
        "MatMul op names of the IR",
        "__module.distilbert.transformer.layer.0.ffn.lin2/aten::linear/MatMul",
    )


def openvino_precision(spec: VariantSpec, option: str | None) -> str:
    """The precision an OpenVINO variant's graph computes in, int8 layers aside: bf16 for ov-bf16, else its
    inference_precision `option` (ov-int8's), else fp32 (OV_FP32)."""
    return "bf16" if spec.dtype == "bf16" else (option or OV_FP32)


BACKEND = Backend(
    "openvino",
    "exporters.openvino:build",
    "qserve.runtime.openvino_rt:OpenVINORuntime",
    (
        VariantSpec("ov-fp32", "openvino", 32, "fp32", cuda=False, tolerance=1e-3),
        VariantSpec("ov-bf16", "openvino", 16, "bf16", cuda=False, tolerance=1.5e-1, cpu_needs=("bf16",)),
        # without VNNI, OpenVINO's int8 kernels measured slower than its fp32 ones (docs/measurements.md)
        VariantSpec("ov-int8", "openvino", 8, "int8", cuda=False, tolerance=5e-1, cpu_needs=("vnni",)),
    ),
    OpenVINOOptions,
    needs=("openvino",),
    export_needs=("nncf", "optimum"),
    install="pip install 'qserve[openvino]'",
    layers="exporters.openvino:OpenVINOLayers",
    distributions=("openvino", "nncf", "optimum", "optimum-intel"),
    serving=True,
    colour="#009E73",
    order=3,
)
