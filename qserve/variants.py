"""The backend registry: every way qserve can store and run a model, declared once.

    qserve export models/minilm-imdb --bits 8      # -> onnx-int8 on CPU

Each `Backend` in `REGISTRY` declares its variants, the exporter function that builds
them, the runtime class that runs them and the exporter options they understand (with
defaults and `qserve export` help). Exporter and runtime are "module:attr" strings,
imported only when one of the backend's variants is exported or loaded: importing this
module imports no torch, onnxruntime or OpenVINO, and a missing library fails only its
own backend's variants. Everything else derives from the registry: `VARIANTS`,
`BACKENDS`, the exporters' builder lookup and option defaults, `load_runtime`'s
dispatch, the export command's option flags. A new backend is an exporter module, a
runtime module and one entry here.
"""

from __future__ import annotations

import importlib
from dataclasses import asdict, dataclass, field, replace
from typing import Any, TypeVar

from qserve import QserveError
from qserve.exportoption import Option, OptionValue, option, options_of

STORED = ("name", "backend", "bits", "dtype", "cpu", "cuda", "options")
"""The fields a manifest's `spec` records (to_json); the rest of a VariantSpec is policy, read from here."""
DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class VariantSpec:
    """Everything about one variant, declared once: the backend that runs it, how its weights are stored, the
    parity it must keep, where it is the default, where it is too slow for `--all`, what it cannot build."""

    name: str
    backend: str
    bits: int
    dtype: str
    cpu: bool = True
    """Whether the variant runs on CPU at all (speed is the benchmark's business)."""
    cuda: bool = True
    options: dict[str, Any] = field(default_factory=dict)
    tolerance: float = 0.0
    """Max |Δlogit| against the fp32 checkpoint on the probe texts before the export warns (recorded either
    way); one value per dtype (variants of one dtype must agree: exporters.core.TOLERANCE is by dtype)."""
    default_for: tuple[str, ...] = ()
    """The devices ("cpu", "cuda") on which `qserve export --bits N` without --backend picks this variant:
    the measured fast path for its bits there."""
    slow_on: tuple[str, ...] = ()
    """The devices on which `--all` skips it: it runs there, but only slowly."""
    cpu_needs: tuple[str, ...] = ()
    """CPU features its fast path needs (qserve.devices.FEATURES: "bf16", "vnni"). On a CPU without one, `--all`
    and the pipeline skip it with the reason, and an explicit export says it runs off its fast path there."""
    unsupported: dict[str, str] = field(default_factory=dict)
    """Architecture (config.json model_type) -> why the variant cannot be built for it; checked before any
    work. Every architecture not listed exports, loads, passes parity and serves
    (tests/integration/test_byo_matrix.py)."""

    def to_json(self) -> dict[str, Any]:
        """What the manifest records as `spec` (the stored fields only, so manifests keep their bytes)."""
        return {k: v for k, v in asdict(self).items() if k in STORED}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "VariantSpec":
        """A manifest's `spec` back as the variant: its stored fields over the registry's declaration (the
        policy fields: tolerance, default_for, slow_on, unsupported), or those alone for a name not declared."""
        declared = VARIANTS.get(data.get("name", ""))
        return replace(declared, **data) if declared is not None else cls(**data)


@dataclass(frozen=True)
class BackendOptions:
    """A backend's exporter options for one variant, typed and validated once (`resolve`): each field one
    `Option` of the backend (its declaration: default per variant, type, allowed values, flag). A field the
    variant does not understand stays None and is not recorded; `to_json` is the manifest's `options` record."""

    variant: str

    @classmethod
    def resolve(cls: type[OptionsT], name: str, given: dict[str, Any] | None = None) -> OptionsT:
        """`given` over variant `name`'s defaults, every value checked against its Option, then the backend's
        rules across options (`_check`). Unknown keys name the allowed ones."""
        given = dict(given or {})
        merged = merge_options(name, given)
        declared = {o.key: o for o in backend_of(name).options if name in o.defaults}
        values = {k: declared[k].validate(name, v) for k, v in merged.items()}
        out = cls(variant=name, **values)
        out._check(given)
        return out

    def _check(self, given: dict[str, Any]) -> None:
        """The backend's rules across options (one option excluding another); `given`: what the user set."""

    def to_json(self) -> dict[str, OptionValue]:
        """The options the variant understands, in declaration order: what the manifest records."""
        return {k: getattr(self, k) for k in option_defaults(self.variant)}


OptionsT = TypeVar("OptionsT", bound=BackendOptions)


@dataclass(frozen=True)
class Backend:
    """A way to produce and run variants: one exporter module, one runtime class."""

    name: str
    exporter: str
    """"module:function" that writes a variant's weights: (checkpoint_dir, out_dir, spec, options) -> extra
    manifest fields."""
    runtime: str
    """"module:Class", a qserve.runtime.base.Runtime subclass built as (variant_dir, manifest, device, options)."""
    variants: tuple[VariantSpec, ...]
    libraries: tuple[str, ...] = ()
    """What a bench child imports before its memory baseline, so 'model memory' and the load time leave the
    libraries out (transformers' model classes import torch._dynamo: seconds that are no part of loading)."""
    needs: tuple[str, ...] = ()
    """The optional libraries (import names) its variants need beyond qserve's own dependencies: where one is not
    installed, qserve.extras.require says `install` at the first use, and the pipeline's and `export --all`'s plan
    (qserve.placement) skips the backend's variants, saying it, before any work starts."""
    install: str = ""
    """The command that installs `needs` (qserve.extras.require says it when one is missing)."""
    cuda_install: str = ""
    """The command that installs the CUDA build of `needs` where that is another package."""
    options_type: type[BackendOptions] = BackendOptions
    """The backend's typed options: each `option(...)` field one exporter option, declared there once."""
    cuda_runtime: str = ""
    """A library whose own CUDA build the backend's CUDA kernels need (qserve.devices.CUDA_RUNTIMES: onnxruntime,
    whose CUDAExecutionProvider only onnxruntime-gpu ships); where it is missing, its variants run on the CPU."""

    @property
    def options(self) -> tuple[Option, ...]:
        """The backend's exporter options, read from its options type's declarations (exportoption.options_of)."""
        return options_of(self.options_type)


_CALIBRATION = "training texts that calibrate"


def _samples(purpose: str) -> dict[str, Any]:
    """calibration_samples' rule (every calibrating backend): 1 to 1024 training texts."""
    return {
        "allowed": "an integer from 1 to 1024",
        "note": f"{_CALIBRATION} {purpose}",
        "check": lambda v: 1 <= v <= 1024,
    }


@dataclass(frozen=True)
class TorchOptions(BackendOptions):
    """torch-fp32/bf16/fp16 take no options."""


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
    calibration_samples: int | None = option(
        {"bnb-nf4": 64, "bnb-fp4": 64}, f"{_CALIBRATION} the clipping", **_samples("the weight clipping")
    )


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
    calibration_samples: int | None = option(
        {"onnx-int8": 64},
        f"{_CALIBRATION} the smoothing and bias correction",
        **_samples("the smoothing and the bias correction"),
    )
    keep_fp32: str | None = option(
        {"onnx-int8": ""},
        "comma-separated parts of MatMul node names to leave in fp32, e.g. "
        "'layer.0/ffn/lin2,layer.1/ffn/lin2' (more accurate, larger, slower)",
        metavar="PATTERNS",
        allowed="a comma-separated string of MatMul node-name parts, e.g. 'layer.0/ffn/lin2'",
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
        if (
            merge_options(name, given).get("optimize") is True
            and "smooth" not in given
            and "smooth" in option_defaults(name)
        ):
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


OV_FP32 = "f32"
"""OpenVINO's name for fp32 compute: what ov-fp32 runs in, and ov-int8's default for the ops NNCF leaves unquantized."""


@dataclass(frozen=True)
class OpenVINOOptions(BackendOptions):
    calibration_samples: int | None = option(
        {"ov-int8": 300},
        f"{_CALIBRATION} NNCF's quantization",
        **_samples("NNCF's activation ranges, SmoothQuant and bias correction"),
    )
    inference_precision: str | None = option(
        {"ov-int8": OV_FP32},
        "precision of the ops NNCF leaves unquantized (bf16 needs avx512_bf16 or AMX)",
        choices=(OV_FP32, "bf16"),
        allowed=f"{OV_FP32} or bf16",
    )


def openvino_precision(spec: VariantSpec, option: str | None) -> str:
    """The precision an OpenVINO variant's graph computes in, int8 layers aside: bf16 for ov-bf16, else its
    inference_precision `option` (ov-int8's), else fp32 (OV_FP32)."""
    return "bf16" if spec.dtype == "bf16" else (option or OV_FP32)


REGISTRY: dict[str, Backend] = {
    b.name: b
    for b in (
        Backend(
            "torch",
            "exporters.torch_dtype:build",
            "qserve.runtime.torch_rt:TorchRuntime",
            (
                VariantSpec("torch-fp32", "torch", 32, "fp32", tolerance=1e-3, default_for=("cuda",)),
                VariantSpec(
                    "torch-bf16", "torch", 16, "bf16", tolerance=1.5e-1, default_for=("cpu",), cpu_needs=("bf16",)
                ),
                # fp16 matmuls on CPU have no fast kernel: exportable and loadable there, but `--all` skips it.
                VariantSpec("torch-fp16", "torch", 16, "fp16", tolerance=5e-2, default_for=("cuda",), slow_on=("cpu",)),
            ),
            libraries=("torch", "transformers.models.auto.modeling_auto"),
            # a serving install (qserve[serve]) has no torch: its torch-* variants need the toolkit
            needs=("torch",),
            install="pip install 'qserve[toolkit]'",
            options_type=TorchOptions,
        ),
        Backend(
            "bnb",
            "exporters.bnb:build",
            "qserve.runtime.torch_rt:TorchRuntime",
            # On CPU, LLM.int8 multiplies in int8 (VNNI's kernel) and the 4-bit layers dequantize into bf16 matmuls.
            (
                VariantSpec("bnb-int8", "bnb", 8, "int8", tolerance=5e-1, default_for=("cuda",), cpu_needs=("vnni",)),
                VariantSpec("bnb-nf4", "bnb", 4, "nf4", tolerance=1.0, default_for=("cuda",), cpu_needs=("bf16",)),
                VariantSpec("bnb-fp4", "bnb", 4, "fp4", tolerance=1.5, cpu_needs=("bf16",)),
            ),
            libraries=("torch", "transformers.models.auto.modeling_auto", "bitsandbytes"),
            needs=("bitsandbytes", "accelerate"),
            install="pip install bitsandbytes==0.50.2 accelerate",
            options_type=BnbOptions,
        ),
        Backend(
            "onnx",
            "exporters.onnx:build",
            "qserve.runtime.onnx_rt:OnnxRuntime",
            (
                VariantSpec("onnx-fp32", "onnx", 32, "fp32", tolerance=1e-3, default_for=("cpu",)),
                VariantSpec("onnx-fp16", "onnx", 16, "fp16", tolerance=5e-2),
                # dynamic int8 has no CUDA kernels in ORT's CUDA EP: CPU only.
                VariantSpec("onnx-int8", "onnx", 8, "int8", cuda=False, tolerance=5e-1, default_for=("cpu",)),
                VariantSpec("onnx-int4", "onnx", 4, "int4", tolerance=1.0, default_for=("cpu",)),
            ),
            libraries=("onnxruntime",),
            needs=("onnxruntime", "onnx"),
            install="pip install 'qserve[cpu]' (or 'qserve[gpu]' for CUDA)",
            cuda_install="pip uninstall -y onnxruntime && pip install 'qserve[gpu]'",
            options_type=OnnxOptions,
            cuda_runtime="onnxruntime",
        ),
        Backend(
            # OpenVINO's CPU plugin: CPU only. ov-bf16 is the fp32 IR compiled with the bf16
            # inference-precision hint; ov-int8 is NNCF post-training quantization.
            "openvino",
            "exporters.openvino:build",
            "qserve.runtime.openvino_rt:OpenVINORuntime",
            (
                VariantSpec("ov-fp32", "openvino", 32, "fp32", cuda=False, tolerance=1e-3),
                VariantSpec("ov-bf16", "openvino", 16, "bf16", cuda=False, tolerance=1.5e-1, cpu_needs=("bf16",)),
                # without VNNI, OpenVINO's int8 kernels measured slower than its fp32 ones (docs/measurements.md)
                VariantSpec("ov-int8", "openvino", 8, "int8", cuda=False, tolerance=5e-1, cpu_needs=("vnni",)),
            ),
            needs=("openvino", "nncf", "optimum"),
            install="pip install 'qserve[openvino]'",
            options_type=OpenVINOOptions,
        ),
    )
}

VARIANTS: dict[str, VariantSpec] = {s.name: s for b in REGISTRY.values() for s in b.variants}

# The tables other modules read, derived from the specs (each fact is declared once, on its variant).
# UNSUPPORTED: what a variant cannot do for an architecture (config.json model_type), and why: checked before
# any work, so `qserve export` answers "<variant> unsupported for <arch>: <reason>" at once and `--all` and the
# pipeline step over it. Every cell not listed exports, loads, passes parity and serves for each architecture
# in qserve.modeling.ARCHITECTURES (tests/integration/test_byo_matrix.py; docs/byo-matrix.md is its result). None yet.
UNSUPPORTED: dict[tuple[str, str], str] = {
    (s.name, arch): why for s in VARIANTS.values() for arch, why in s.unsupported.items()
}


class UnsupportedVariant(QserveError):
    """The variant cannot be built for this checkpoint's architecture (declared in UNSUPPORTED)."""


def unsupported_reason(name: str, model_type: str | None) -> str | None:
    """Why variant `name` cannot be built for architecture `model_type`, or None when it can."""
    get_spec(name)
    return UNSUPPORTED.get((name, model_type or ""))


BACKENDS = tuple(REGISTRY)

# Parity tolerance by dtype (VariantSpec.tolerance), what exporters.core checks against.
TOLERANCE: dict[str, float] = {}
for _s in VARIANTS.values():
    if TOLERANCE.setdefault(_s.dtype, _s.tolerance) != _s.tolerance:
        raise TypeError(f"{_s.name}: tolerance {_s.tolerance} differs from the other {_s.dtype} variants'")


def get_spec(name: str) -> VariantSpec:
    try:
        return VARIANTS[name]
    except KeyError:
        raise QserveError(f"unknown variant {name!r}; known variants: {', '.join(VARIANTS)}") from None


def backend_of(name: str) -> Backend:
    """The registry entry that builds and runs variant `name`."""
    return REGISTRY[get_spec(name).backend]


def load_target(target: str, backend: Backend) -> object:
    """Import a registry "module:attr" string; a module that cannot be imported fails this backend only."""
    module, _, attr = target.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except ImportError as e:
        names = ", ".join(s.name for s in backend.variants)
        hint = f"; {backend.install}" if backend.install else ""
        raise QserveError(
            f"the {backend.name} backend ({names}) is unavailable: importing {module} failed ({e}){hint}"
        ) from e


def option_defaults(name: str) -> dict[str, OptionValue]:
    """The exporter options variant `name` understands, with their defaults, in declaration order."""
    return {o.key: o.defaults[name] for o in backend_of(name).options if name in o.defaults}


def merge_options(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """`options` over variant `name`'s defaults; an unknown key is an error naming the allowed ones."""
    allowed = option_defaults(name)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        listed = ", ".join(f"{k} (default {v!r})" for k, v in allowed.items()) or "none"
        raise QserveError(f"unknown option(s) {', '.join(map(repr, unknown))} for {name}; allowed: {listed}")
    return {**allowed, **options}


def flag_options() -> dict[str, list[Option]]:
    """Every option that has a `qserve export` flag, by key (backends may share a key, e.g. calibration_samples)."""
    out: dict[str, list[Option]] = {}
    for b in REGISTRY.values():
        for o in b.options:
            if o.help:
                out.setdefault(o.key, []).append(o)
    for key, opts in out.items():
        if len({(o.kind, o.choices) for o in opts}) > 1:  # one flag, one parser: a registry mistake
            raise TypeError(f"backends declare option {key!r} with different types or choices")
    return out
