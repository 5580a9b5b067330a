"""The toy backend's one declaration: a backend outside qserve, registered by QSERVE_BACKENDS alone.

    QSERVE_BACKENDS=toy_backend.backend:BACKEND PYTHONPATH=.:tests python -m qserve export CKPT --variant toy-fp32

tests/integration/test_toy_backend.py runs export, bench, gate and serve on it with no other edit to qserve; copied
into qserve/backends/ as it is, it is a built-in, and every table derived from the registry lists it (the same test).
"""

from __future__ import annotations

from dataclasses import dataclass

from qserve.backends import Backend, BackendOptions, VariantSpec
from qserve.exportoption import option


@dataclass(frozen=True)
class ToyOptions(BackendOptions):
    note: str | None = option({"toy-fp32": ""}, "a note the exporter records in the manifest", metavar="TEXT")


BACKEND = Backend(
    "toy",
    "toy_backend.exporter:build",
    "toy_backend.runtime:ToyRuntime",
    # the checkpoint's own fp32 weights: a reference too, after torch-fp32 and onnx-fp32
    (VariantSpec("toy-fp32", "toy", 32, "fp32", cuda=False, tolerance=1e-3, reference=3),),
    ToyOptions,
    libraries=("torch", "transformers.models.auto.modeling_auto"),
    needs=("torch", "transformers"),
    export_needs=("safetensors",),  # save_pretrained writes model.safetensors
    install="pip install 'qserve[toolkit]'",
    distributions=("torch", "transformers", "safetensors"),
    colour="#56B4E9",
    torch_threads=True,  # ToyRuntime runs on torch: torch.set_num_threads is process-wide
)
