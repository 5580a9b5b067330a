"""The variant table: every way qserve can store a model, in one place.

    qserve export models/minilm-imdb --bits 8      # -> onnx-int8 on CPU

Names, bits defaults and device support live only here; exporters register a
builder per name and the runtime dispatches on `backend`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from qserve import QserveError

BACKENDS = ("torch", "bnb", "onnx", "openvino")


@dataclass(frozen=True)
class VariantSpec:
    """What a variant is: the backend that runs it and how its weights are stored."""

    name: str
    backend: str
    bits: int
    dtype: str
    cpu: bool = True
    """Whether the variant runs on CPU at all (speed is the benchmark's business)."""
    cuda: bool = True
    options: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "VariantSpec":
        return cls(**data)


VARIANTS: dict[str, VariantSpec] = {
    s.name: s
    for s in [
        VariantSpec("torch-fp32", "torch", 32, "fp32"),
        VariantSpec("torch-bf16", "torch", 16, "bf16"),
        # fp16 matmuls on CPU have no fast kernel (~270 ms vs ~80 fp32 measured):
        # exportable and loadable on CPU, but `--all` skips it there.
        VariantSpec("torch-fp16", "torch", 16, "fp16"),
        VariantSpec("bnb-int8", "bnb", 8, "int8"),
        VariantSpec("bnb-nf4", "bnb", 4, "nf4"),
        VariantSpec("bnb-fp4", "bnb", 4, "fp4"),
        VariantSpec("onnx-fp32", "onnx", 32, "fp32"),
        VariantSpec("onnx-fp16", "onnx", 16, "fp16"),
        # dynamic int8 has no CUDA kernels in ORT's CUDA EP: CPU only.
        VariantSpec("onnx-int8", "onnx", 8, "int8", cuda=False),
        VariantSpec("onnx-int4", "onnx", 4, "int4"),
        # OpenVINO's CPU plugin (exporters.openvino): CPU only. ov-bf16 is the fp32 IR compiled
        # with the bf16 inference-precision hint; ov-int8 is NNCF post-training quantization.
        VariantSpec("ov-fp32", "openvino", 32, "fp32", cuda=False),
        VariantSpec("ov-bf16", "openvino", 16, "bf16", cuda=False),
        VariantSpec("ov-int8", "openvino", 8, "int8", cuda=False),
    ]
}

# `qserve export --bits N` without --backend: the measured fast path per device.
DEFAULT_FOR_BITS = {
    "cpu": {32: "onnx-fp32", 16: "torch-bf16", 8: "onnx-int8", 4: "onnx-int4"},
    "cuda": {32: "torch-fp32", 16: "torch-fp16", 8: "bnb-int8", 4: "bnb-nf4"},
}
# Variants `--all` skips on a device because they run but only slowly there.
SLOW_ON = {"cpu": {"torch-fp16"}, "cuda": set()}
DTYPES = {"fp32", "fp16", "bf16", "int8", "nf4", "fp4", "int4"}


def get_spec(name: str) -> VariantSpec:
    try:
        return VARIANTS[name]
    except KeyError:
        raise QserveError(
            f"unknown variant {name!r}; known variants: {', '.join(VARIANTS)}"
        ) from None


def valid_combinations() -> str:
    return ", ".join(f"--bits {s.bits} --backend {s.backend} --dtype {s.dtype} ({s.name})" for s in VARIANTS.values())


def resolve(bits: int, backend: str | None = None, dtype: str | None = None, device: str = "cpu") -> VariantSpec:
    """Pick the variant for `--bits/--backend/--dtype`; an impossible mix names the valid ones."""
    if bits not in (32, 16, 8, 4):
        raise QserveError(f"--bits must be one of 32, 16, 8, 4 (got {bits})")
    if backend is not None and backend not in BACKENDS:
        raise QserveError(f"--backend must be one of {', '.join(BACKENDS)} (got {backend!r})")
    if dtype is not None and dtype not in DTYPES:
        raise QserveError(f"--dtype must be one of {', '.join(sorted(DTYPES))} (got {dtype!r})")
    if backend is None and dtype is None:
        spec = VARIANTS[DEFAULT_FOR_BITS["cuda" if device.startswith("cuda") else "cpu"][bits]]
    else:
        matches = [
            s for s in VARIANTS.values()
            if s.bits == bits and (backend is None or s.backend == backend) and (dtype is None or s.dtype == dtype)
        ]
        if not matches:
            raise QserveError(
                f"no variant for --bits {bits}"
                + (f" --backend {backend}" if backend else "")
                + (f" --dtype {dtype}" if dtype else "")
                + f"; valid combinations: {valid_combinations()}"
            )
        spec = matches[0]
    if device.startswith("cuda") and not spec.cuda:
        raise QserveError(f"{spec.name} has no CUDA kernels; on CUDA use one of: "
                          + ", ".join(s.name for s in VARIANTS.values() if s.cuda))
    return spec


def supported(device: str = "cpu", include_slow: bool = False) -> list[VariantSpec]:
    """The variants `--all` exports on this device."""
    kind = "cuda" if device.startswith("cuda") else "cpu"
    out = []
    for s in VARIANTS.values():
        if not (s.cuda if kind == "cuda" else s.cpu):
            continue
        if not include_slow and s.name in SLOW_ON[kind]:
            continue
        out.append(s)
    return out
