import pytest

from qserve import QserveError
from qserve.placement import plan
from qserve.variantflags import resolve
from qserve.variants import VARIANTS, spec_of


def test_bits_defaults_per_device():
    assert resolve(8).name == "onnx-int8"
    assert resolve(4).name == "onnx-int4"
    assert resolve(16).name == "torch-bf16"
    assert resolve(32).name == "onnx-fp32"
    assert resolve(8, device="cuda").name == "bnb-int8"
    assert resolve(4, device="cuda").name == "bnb-nf4"


def test_explicit_backend_and_dtype():
    assert resolve(8, backend="bnb").name == "bnb-int8"
    assert resolve(16, backend="torch", dtype="fp16").name == "torch-fp16"
    assert resolve(4, backend="bnb", dtype="fp4").name == "bnb-fp4"
    assert resolve(16, backend="onnx").name == "onnx-fp16"


def test_unsupported_combination_lists_valid_ones():
    with pytest.raises(QserveError) as e:
        resolve(8, backend="torch")
    msg = str(e.value)
    assert "--bits 8 --backend torch" in msg and "onnx-int8" in msg and "bnb-int8" in msg
    with pytest.raises(QserveError, match="--bits must be one of"):
        resolve(3)
    with pytest.raises(QserveError, match="--dtype must be one of"):
        resolve(8, dtype="int3")
    with pytest.raises(QserveError, match="no CUDA kernels"):
        resolve(8, backend="onnx", device="cuda")


def test_spec_json_round_trip():
    for spec in VARIANTS.values():
        assert spec_of(spec.to_json()) == spec


def test_supported_per_device(fake_gpu):
    cpu = set(plan("cpu").runs)
    assert "onnx-int8" in cpu and "torch-fp16" not in cpu
    assert "torch-fp16" in set(plan("cpu", include_slow=True).runs)
    fake_gpu()
    assert plan("cuda").device_of("onnx-int8") == "cpu"  # no CUDA kernels for dynamic int8: the CPU's


def test_openvino_variants_are_cpu_only_and_resolvable(fake_gpu, cpu_flags):
    cpu_flags("avx2 avx512f avx512_vnni avx512_bf16")  # ov-bf16 and ov-int8 resolve where their fast paths exist
    assert resolve(8, backend="openvino").name == "ov-int8"
    assert resolve(16, backend="openvino").name == "ov-bf16"
    assert resolve(32, backend="openvino").name == "ov-fp32"
    assert {"ov-fp32", "ov-bf16", "ov-int8"} <= set(plan("cpu", include_slow=True).runs)
    fake_gpu()
    assert all(plan("cuda").device_of(n) == "cpu" for n in ("ov-fp32", "ov-bf16", "ov-int8"))
    with pytest.raises(QserveError, match="no CUDA kernels"):
        resolve(8, backend="openvino", device="cuda")


# -- the backend registry -------------------------------------------------------------------


def test_registry_entries_are_consistent():
    from qserve.variants import BACKENDS, REGISTRY

    assert BACKENDS == ("torch", "bnb", "onnx", "openvino")
    for name, backend in REGISTRY.items():
        assert backend.name == name and backend.variants
        assert {s.backend for s in backend.variants} == {name}
        for opt in backend.options:
            assert set(opt.defaults) <= {s.name for s in backend.variants}, (name, opt.key)
            assert all(v is None or isinstance(v, opt.kind) for v in opt.defaults.values()), (name, opt.key)
    assert sum(len(b.variants) for b in REGISTRY.values()) == len(VARIANTS) == 13


def test_every_registry_target_resolves():
    import exporters
    from qserve.runtime import Runtime, runtime_class
    from qserve.variants import REGISTRY

    for backend in REGISTRY:
        assert issubclass(runtime_class(backend), Runtime)
        assert callable(exporters.get_builder(REGISTRY[backend]))


def test_a_missing_backend_fails_only_its_own_variants(monkeypatch):
    import sys

    import exporters
    from qserve.runtime import runtime_class
    from qserve.variants import REGISTRY

    monkeypatch.setitem(sys.modules, "exporters.openvino", None)  # makes `import exporters.openvino` fail
    monkeypatch.setitem(sys.modules, "qserve.runtime.openvino_rt", None)
    with pytest.raises(
        QserveError,
        match=r"openvino backend \(ov-fp32, ov-bf16, ov-int8\) is unavailable.*"
        r"pip install 'qserve\[openvino\]'",
    ):
        exporters.get_builder(REGISTRY["openvino"])
    with pytest.raises(QserveError, match="importing qserve.runtime.openvino_rt failed"):
        runtime_class("openvino")
    assert callable(exporters.get_builder(REGISTRY["onnx"]))
    assert runtime_class("onnx").__name__ == "OnnxRuntime"


def test_exporter_options_and_flags_derive_from_the_registry():
    from exporters.cli import OPTION_FLAGS
    from qserve.backends.bnb import BnbOptions
    from qserve.backends.onnx import OnnxOptions
    from qserve.backends.openvino import OpenVINOOptions

    assert OPTION_FLAGS == {
        "llm_int8_threshold": ("--llm-int8-threshold", {"bnb-int8"}),
        "double_quant": ("--double-quant", {"bnb-nf4", "bnb-fp4"}),
        "clip": ("--clip", {"bnb-nf4", "bnb-fp4"}),
        "calibration_samples": ("--calibration-samples", {"onnx-int8", "bnb-nf4", "bnb-fp4", "ov-int8"}),
        "per_channel": ("--per-channel", {"onnx-int8"}),
        "smooth": ("--smooth", {"onnx-int8"}),
        "correct_bias": ("--correct-bias", {"onnx-int8"}),
        "keep_fp32": ("--keep-fp32", {"onnx-int8", "onnx-int4", "bnb-int8", "bnb-nf4", "bnb-fp4", "ov-int8"}),
        "activation_scales": ("--activation-scales", {"onnx-int8"}),
        "row_by_row": ("--row-by-row", {"onnx-int8"}),
        "block_size": ("--block-size", {"onnx-int4"}),
        "accuracy_level": ("--accuracy-level", {"onnx-int4"}),
        "quantize_embeddings": ("--quantize-embeddings", {"onnx-int4"}),
        "inference_precision": ("--inference-precision", {"ov-int8"}),
    }
    assert BnbOptions.defaults("bnb-fp4") == {
        "double_quant": False,
        "clip": True,
        "calibration_samples": 64,
        "keep_fp32": "",
    }
    assert list(OnnxOptions.defaults("onnx-int4")) == [
        "opset",
        "keep_fp32",
        "block_size",
        "accuracy_level",
        "symmetric",
        "quantize_embeddings",
    ]
    assert [OpenVINOOptions.defaults(n) for n in ("ov-fp32", "ov-bf16")] == [{}, {}]
    assert OpenVINOOptions.merge("ov-int8", {"calibration_samples": 8}) == {
        "calibration_samples": 8,
        "inference_precision": "f32",
        "keep_fp32": "",
    }
    with pytest.raises(QserveError, match=r"unknown option\(s\) 'clip' for onnx-int8; allowed: opset \(default None\)"):
        OnnxOptions.merge("onnx-int8", {"clip": True})
    assert BnbOptions.defaults("bnb-int8") == {"llm_int8_threshold": 6.0, "keep_fp32": ""}


def test_each_variant_fact_is_a_field_of_its_one_declaration():
    """Tolerance, default-for-bits, slow-on and the unsupported reasons live on the VariantSpec; the tables
    other modules read are derived from them, and a manifest records only what the variant stores."""
    from exporters.core import TOLERANCE
    from qserve import variantflags, variants

    assert variantflags.DEFAULT_FOR_BITS == {
        dev: {
            bits: next(s.name for s in VARIANTS.values() if dev in s.default_for and s.bits == bits)
            for bits in variantflags.BITS
        }
        for dev in variants.DEVICES
    }
    assert variantflags.DEFAULT_FOR_BITS["cpu"] == {32: "onnx-fp32", 16: "torch-bf16", 8: "onnx-int8", 4: "onnx-int4"}
    assert variantflags.SLOW_ON == {"cpu": {"torch-fp16"}, "cuda": set()} and VARIANTS["torch-fp16"].slow_on == ("cpu",)
    assert all(TOLERANCE[s.dtype] == s.tolerance > 0 for s in VARIANTS.values())
    stored = VARIANTS["onnx-int8"].to_json()
    assert list(stored) == list(variants.STORED)  # the manifest's spec keeps its keys and bytes
    assert spec_of(stored).default_for == ("cpu",)  # the policy comes back from the declaration


# -- typed options (issue 29): one dataclass per backend, every value checked in one place -------------
def test_an_option_out_of_range_is_refused_naming_the_option_the_allowed_values_and_the_flag():
    from qserve.backends.onnx import OnnxOptions
    from qserve.backends.openvino import OpenVINOOptions

    with pytest.raises(
        QserveError,
        match=r"option block_size for onnx-int4 must be a power of two >= 16, e\.g\. "
        r"32, 64, 128 \(got 20\); flag --block-size",
    ):
        OnnxOptions.resolve("onnx-int4", {"block_size": 20})
    with pytest.raises(
        QserveError,
        match=r"option calibration_samples for ov-int8 must be an integer from 1 to 1024 "
        r"\(training texts that calibrate NNCF's .*; got 2000\); flag "
        r"--calibration-samples",
    ):
        OpenVINOOptions.resolve("ov-int8", {"calibration_samples": 2000})
    with pytest.raises(QserveError, match=r"option accuracy_level for onnx-int4 must be one of 0, 1, 2, 3, 4 "):
        OnnxOptions.resolve("onnx-int4", {"accuracy_level": True})  # a bool is no integer
    with pytest.raises(QserveError, match=r"option opset for onnx-fp32 must be an integer from 14 to 21 \(got 9\)$"):
        OnnxOptions.resolve("onnx-fp32", {"opset": 9})  # no flag: set through exporters.export(options=...) only


def test_typed_options_are_typed_and_record_what_the_manifest_always_recorded():
    from qserve.backends.bnb import BnbOptions
    from qserve.backends.onnx import OnnxOptions

    bnb = BnbOptions.resolve("bnb-int8", {"llm_int8_threshold": "0"})
    assert bnb.llm_int8_threshold == 0.0 and bnb.to_json() == {"llm_int8_threshold": 0.0, "keep_fp32": ""}
    onnx = OnnxOptions.resolve("onnx-int8", {"optimize": True})  # asking for fusion turns smoothing off
    assert onnx.smooth is False and list(onnx.to_json()) == list(OnnxOptions.defaults("onnx-int8"))
    assert OnnxOptions.resolve("onnx-int4").block_size == 32 and OnnxOptions.resolve("onnx-int4").smooth is None


def test_an_option_is_declared_once_on_its_field():
    """The key is the field's name, the kind its type; the registry, the CLI and the exporters read these."""
    import dataclasses

    from qserve.backends.bnb import BnbOptions
    from qserve.exportoption import option, options_of
    from qserve.variants import REGISTRY

    opts = {o.key: o for o in REGISTRY["bnb"].options}
    assert list(opts) == ["llm_int8_threshold", "double_quant", "clip", "calibration_samples", "keep_fp32"]
    assert opts["llm_int8_threshold"].kind is float and opts["clip"].defaults == {"bnb-nf4": False, "bnb-fp4": True}
    assert REGISTRY["bnb"].options == options_of(BnbOptions)  # nothing to reconcile: one declaration

    @dataclasses.dataclass(frozen=True)
    class Bad:
        names: list | None = option({"x": None})

    with pytest.raises(TypeError, match=r"Bad.names: an option is `bool \| None`"):
        options_of(Bad)
