"""ONNX Runtime: qserve's own fp32 graph, converted or quantized (exporters/onnx.py), run by ORT (runtime/onnx_rt.py).

    qserve export models/minilm-imdb --bits 8 --backend onnx     # -> onnx-int8

On CUDA it needs onnxruntime-gpu's CUDA provider, which `cuda_provider_missing` proves starts; where it does not,
its variants run on the CPU.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

from qserve import QserveError, devices
from qserve.backends import Backend, BackendOptions, VariantSpec, calibration_samples, keep_fp32
from qserve.exportoption import option


@dataclass(frozen=True)
class OnnxOptions(BackendOptions):
    opset: int | None = option(
        {"onnx-fp32": None, "onnx-fp16": None, "onnx-int8": None, "onnx-int4": None},
        allowed="an integer from 14 to 21",
        check=lambda v: 14 <= v <= 21,
    )
    per_channel: bool | None = option({"onnx-int8": True}, "one weight scale per output channel")
    reduce_range: bool | None = option({"onnx-int8": False})
    optimize: bool | None = option({"onnx-int8": False})
    # None: measured per export (exporters.onnx.quantize_int8): it helps with VNNI and hurt on AVX2
    smooth: bool | None = option(
        {"onnx-int8": None},
        "smooth activation outliers into the weights before quantizing (exporters.smoothing); "
        "unset: both graphs are built and the one closer to fp32 on held-out training texts is kept",
    )
    correct_bias: bool | None = option(
        {"onnx-int8": True}, "take the mean int8-vs-fp32 logit shift on calibration texts out of the output bias"
    )
    calibration_samples: int | None = calibration_samples(
        {"onnx-int8": 64}, "the smoothing and bias correction", "the smoothing and the bias correction"
    )
    keep_fp32: str | None = keep_fp32(
        {"onnx-int8": "", "onnx-int4": ""}, "parts of MatMul node names", "layer.0/ffn/lin2"
    )
    activation_scales: str | None = option(
        {"onnx-int8": "per-tensor"},
        "per-tensor: ORT dynamic quantization, one activation scale per batch (the "
        "runtime runs it row by row); per-row: each token row its own scale in the graph, rows independent when "
        "batched",
        choices=("per-tensor", "per-row"),
    )
    row_by_row: bool | None = option(
        {"onnx-int8": True},
        "with per-tensor scales the runtime runs batches row by row (one text, one answer); "
        "--no-row-by-row records that it forwards them as one batch (answers move with batchmates)",
    )
    calibrate_alone: bool | None = option({"onnx-int8": False})
    block_size: int | None = option(
        {"onnx-int4": 32},
        "quantization block size",
        allowed="a power of two >= 16, e.g. 32, 64, 128",
        check=lambda v: v >= 16 and not v & (v - 1),
    )
    accuracy_level: int | None = option(
        {"onnx-int4": 4},
        "MatMulNBits accuracy_level (4 = int8 compute, the CPU fast path)",
        choices=(0, 1, 2, 3, 4),
        note="4 = int8 compute, the CPU fast path",
    )
    symmetric: bool | None = option({"onnx-int4": False})
    quantize_embeddings: bool | None = option({"onnx-int4": False}, "also quantize the word-embedding Gather to 4 bits")

    @classmethod
    def resolve(cls, name: str, given: dict[str, Any] | None = None) -> OnnxOptions:
        given = dict(given or {})
        if cls.merge(name, given).get("optimize") is True and "smooth" not in given and "smooth" in cls.defaults(name):
            # The smoothing Mul sits between each LayerNorm and its q/k/v MatMuls, which is exactly
            # the pattern ORT's attention fusion matches: asking for the fused graph turns it off.
            given["smooth"] = False
        return super().resolve(name, given)

    def _check(self, given: dict[str, Any]) -> None:
        name = self.variant
        if self.optimize is True and self.smooth is True:
            raise QserveError(
                f"options optimize and smooth for {name} exclude each other (the smoothing Mul blocks "
                "ORT's attention fusion); drop smooth=true, or set optimize=false"
            )
        if self.activation_scales == "per-row" and self.row_by_row is False:
            raise QserveError(
                f"option row_by_row=false for {name} applies to activation_scales=per-tensor only (a "
                "per-row graph's rows are independent in one batched forward); drop it"
            )
        if self.activation_scales == "per-row" and (not self.per_channel or self.reduce_range or self.optimize):
            raise QserveError(
                f"option activation_scales=per-row for {name} quantizes weights per channel over the "
                "full int8 range and rewrites plain MatMuls only: drop per_channel=false, "
                "reduce_range=true and optimize=true, or use activation_scales=per-tensor"
            )
        if self.quantize_embeddings and self.opset not in (None, 21):
            raise QserveError(
                f"option quantize_embeddings for {name} needs opset 21 (4-bit Gather weights are an "
                f"opset-21 type); drop opset or set it to 21 (got {self.opset!r})"
            )


@functools.lru_cache(maxsize=None)
def cuda_provider_missing() -> str | None:
    """Why ONNX Runtime cannot run on this machine's GPU, or None when its CUDA provider starts.

    Asked once per process, and only where CUDA is usable (the CPU path never imports the library for this).
    ONNX Runtime lists CUDAExecutionProvider whenever the onnxruntime-gpu wheel is installed, even when the
    CUDA/cuDNN libraries it was built for are missing (a session then falls back to the CPU in silence), so
    the provider has to start a one-node session before it counts."""
    if not devices.cuda_available():
        return "no CUDA GPU is usable here" + (
            " (QSERVE_FORCE_CPU=1)" if os.environ.get("QSERVE_FORCE_CPU") == "1" else ""
        )
    try:
        import onnxruntime as ort
    except ImportError as e:
        return f"onnxruntime is not importable ({e})"
    providers = ort.get_available_providers()
    if "CUDAExecutionProvider" not in providers:
        return (
            f"onnxruntime {ort.__version__} is the CPU build (providers: {', '.join(providers)}); its CUDA "
            "provider comes with onnxruntime-gpu instead"
        )
    try:
        from onnx import TensorProto, helper

        if hasattr(ort, "preload_dlls"):  # the CUDA/cuDNN libraries of the pip nvidia-* packages
            ort.preload_dlls()
        graph = helper.make_graph(
            [helper.make_node("Relu", ["x"], ["y"])],
            "probe",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        session = ort.InferenceSession(model.SerializeToString(), providers=["CUDAExecutionProvider"])
        if "CUDAExecutionProvider" not in session.get_providers():
            return (
                f"onnxruntime-gpu {ort.__version__} lists CUDAExecutionProvider but it did not start (the "
                "CUDA/cuDNN libraries it was built for are not found)"
            )
    except Exception as e:  # noqa: BLE001 - whatever stops the provider is the reason
        return f"onnxruntime {ort.__version__}'s CUDAExecutionProvider failed to start: {type(e).__name__}: {e}"[:400]
    return None


BACKEND = Backend(
    "onnx",
    "exporters.onnx:build",
    "qserve.runtime.onnx_rt:OnnxRuntime",
    (
        VariantSpec("onnx-fp32", "onnx", 32, "fp32", tolerance=1e-3, default_for=("cpu",), reference=2),
        VariantSpec("onnx-fp16", "onnx", 16, "fp16", tolerance=5e-2),
        # dynamic int8 has no CUDA kernels in ORT's CUDA EP: CPU only.
        VariantSpec("onnx-int8", "onnx", 8, "int8", cuda=False, tolerance=5e-1, default_for=("cpu",)),
        VariantSpec("onnx-int4", "onnx", 4, "int4", tolerance=1.0, default_for=("cpu",)),
    ),
    OnnxOptions,
    libraries=("onnxruntime",),
    needs=("onnxruntime",),
    export_needs=("onnx",),
    install="pip install 'qserve[cpu]' (or 'qserve[gpu]' for CUDA)",
    cuda_install="pip uninstall -y onnxruntime && pip install 'qserve[gpu]'",
    cuda_probe=lambda: cuda_provider_missing(),  # looked up on call: tests replace the probe (conftest.fake_gpu)
    layers="exporters.onnx:OnnxLayers",
    distributions=("onnx", "onnxruntime", "onnxruntime-gpu"),
    serving=True,
    colour="#E69F00",
    order=2,
)
