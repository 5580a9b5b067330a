"""The toy backend's one declaration: a backend outside qserve, registered by QSERVE_BACKENDS alone.

    QSERVE_BACKENDS=toy_backend.backend:BACKEND PYTHONPATH=.:tests python -m qserve export CKPT --variant toy-fp32

tests/integration/test_toy_backend.py runs export, bench, gate and serve on it with no other edit to qserve.
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
    (VariantSpec("toy-fp32", "toy", 32, "fp32", cuda=False, tolerance=1e-3),),
    ToyOptions,
    libraries=("torch", "transformers.models.auto.modeling_auto"),
)
