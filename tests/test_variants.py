import pytest

from qserve import QserveError
from qserve.variants import VARIANTS, VariantSpec, resolve, supported


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
        assert VariantSpec.from_json(spec.to_json()) == spec


def test_supported_per_device():
    cpu = {s.name for s in supported("cpu")}
    assert "onnx-int8" in cpu and "torch-fp16" not in cpu
    assert "torch-fp16" in {s.name for s in supported("cpu", include_slow=True)}
    assert "onnx-int8" not in {s.name for s in supported("cuda")}


def test_openvino_variants_are_cpu_only_and_resolvable():
    assert resolve(8, backend="openvino").name == "ov-int8"
    assert resolve(16, backend="openvino").name == "ov-bf16"
    assert resolve(32, backend="openvino").name == "ov-fp32"
    assert {"ov-fp32", "ov-bf16", "ov-int8"} <= {s.name for s in supported("cpu")}
    assert not {"ov-fp32", "ov-bf16", "ov-int8"} & {s.name for s in supported("cuda")}
    with pytest.raises(QserveError, match="no CUDA kernels"):
        resolve(8, backend="openvino", device="cuda")
