"""torch: the checkpoint saved in another dtype (exporters/torch_dtype.py), run by transformers (runtime/torch_rt.py).

qserve export models/minilm-imdb --bits 16 --backend torch --dtype bf16
"""

from __future__ import annotations

from dataclasses import dataclass

from qserve.backends import Backend, BackendOptions, VariantSpec


@dataclass(frozen=True)
class TorchOptions(BackendOptions):
    """torch-fp32/bf16/fp16 take no options."""


BACKEND = Backend(
    "torch",
    "exporters.torch_dtype:build",
    "qserve.runtime.torch_rt:TorchRuntime",
    (
        VariantSpec("torch-fp32", "torch", 32, "fp32", tolerance=1e-3, default_for=("cuda",), reference=1),
        VariantSpec("torch-bf16", "torch", 16, "bf16", tolerance=1.5e-1, default_for=("cpu",), cpu_needs=("bf16",)),
        # fp16 matmuls on CPU have no fast kernel: exportable and loadable there, but `--all` skips it.
        VariantSpec("torch-fp16", "torch", 16, "fp16", tolerance=5e-2, default_for=("cuda",), slow_on=("cpu",)),
    ),
    TorchOptions,
    libraries=("torch", "transformers.models.auto.modeling_auto"),
    # a serving install (qserve[serve]) has no torch: its torch-* variants need the toolkit
    needs=("torch", "transformers"),
    install="pip install 'qserve[toolkit]'",
    distributions=("torch", "transformers"),
    colour="#0072B2",  # Okabe & Ito's palette (each backend's colour): distinct under every colour-vision deficiency
    torch_threads=True,
    order=0,
)
