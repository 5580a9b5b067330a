"""ONNX variants: export, load through the runtime contract and optimum, parity, graph contents.

python -m pytest tests/integration/test_onnx_exporters.py -q
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from conftest import MIXED_TEXTS as TEXTS  # noqa: E402
from conftest import assert_refused_before_writing

import exporters  # noqa: E402
from exporters.core import TOKENIZER_FILES, TOLERANCE, reference_logits  # noqa: E402
from qserve import QserveError  # noqa: E402
from qserve.artifact import read_manifest  # noqa: E402
from qserve.runtime import RuntimeOptions, load_runtime  # noqa: E402

ONNX_VARIANTS = ["onnx-fp32", "onnx-fp16", "onnx-int8", "onnx-int4"]


# The tiny model's logits are small (|logit| ~ 0.2), so the absolute export tolerances say little
# here; these bound the error relative to the logit scale instead.
RELATIVE_TOL = {"fp32": 1e-4, "fp16": 1e-2, "int8": 0.1, "int4": 0.15}
# Through the runtime contract (run/logits) every variant is batch-invariant: dynamic int8's graph
# quantizes activations per tensor (per batch), so the runtime runs it row by row
# (tests/integration/test_invariance.py).
BATCH_TOL = {"fp32": 1e-5, "fp16": 1e-3, "int8": 1e-5, "int4": 1e-5}


@pytest.fixture(scope="module")
def onnx_variants(tiny_checkpoint, tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    root = tmp_path_factory.mktemp("onnx-variants")
    return {
        name: (root / name, exporters.export(tiny_checkpoint, name, root / name).to_json()) for name in ONNX_VARIANTS
    }


@pytest.fixture(scope="module")
def reference(tiny_checkpoint) -> np.ndarray:
    return reference_logits(tiny_checkpoint, TEXTS, max_length=64)


def _graph(path: Path):
    import onnx

    return onnx.load(str(path / "model.onnx"))


def _ops(path: Path) -> set[str]:
    return {n.op_type for n in _graph(path).graph.node}


@pytest.mark.parametrize("name", ONNX_VARIANTS)
def test_export_writes_exactly_the_variant_files(onnx_variants, tiny_checkpoint, name):
    path, manifest = onnx_variants[name]
    expected = {"model.onnx", "config.json", "qserve_model.json", "manifest.json"}
    expected |= {n for n in TOKENIZER_FILES if (tiny_checkpoint / n).is_file()}
    assert {p.name for p in path.iterdir()} == expected
    assert manifest["spec"]["name"] == name and manifest["spec"]["backend"] == "onnx"
    assert isinstance(manifest["onnx"]["opset"], int) and manifest["onnx"]["opset"] >= 14
    assert manifest["parity"]["within_tolerance"] and manifest["parity"]["agreement"] == 1.0


@pytest.mark.parametrize("name", ONNX_VARIANTS)
def test_runtime_matches_fp32_reference(onnx_variants, reference, name):
    path, manifest = onnx_variants[name]
    dtype = manifest["spec"]["dtype"]
    runtime = load_runtime(path, "cpu")
    got = runtime.logits(TEXTS)
    assert got.dtype == np.float32 and got.shape == (len(TEXTS), 2)
    err = np.abs(got - reference).max()
    assert err <= TOLERANCE[dtype]
    assert err <= RELATIVE_TOL[dtype] * np.abs(reference).max(), f"{name}: max |Δlogit| {err:.3g}"
    probs = runtime.predict(TEXTS)
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-5)
    assert runtime.truncated(TEXTS) == [False, False, False, True, False]


@pytest.mark.parametrize("name", ONNX_VARIANTS)
def test_padded_batch_equals_each_text_alone(onnx_variants, name):
    path, manifest = onnx_variants[name]
    runtime = load_runtime(path, "cpu")
    batch = runtime.tokenize(TEXTS)
    assert batch["attention_mask"].sum(1).min() <= 3 < 64 == batch["input_ids"].shape[1]  # really padded
    together = runtime.run(batch)
    alone = np.concatenate([runtime.logits([t]) for t in TEXTS])
    scale = np.abs(alone).max()
    assert np.abs(together - alone).max() <= BATCH_TOL[manifest["spec"]["dtype"]] * max(scale, 1.0)
    # Reordering the batch permutes the outputs: no text leaks into another's row.
    order = [4, 2, 0, 3, 1]
    shuffled = runtime.logits([TEXTS[i] for i in order])
    np.testing.assert_allclose(shuffled, runtime.logits(TEXTS)[order], atol=BATCH_TOL[manifest["spec"]["dtype"]])


@pytest.mark.parametrize("name", ONNX_VARIANTS)
def test_optimum_ortmodel_loads_variant_unchanged(onnx_variants, name):
    # optimum.onnxruntime lives in optimum-onnx, which qserve does not install (its 0.1.0 caps transformers
    # below 4.58): where a user has it, the variant's directory is the layout it reads.
    pytest.importorskip("optimum.onnxruntime", reason="optimum-onnx is not installed (qserve does not need it)")
    import torch
    from optimum.onnxruntime import ORTModelForSequenceClassification
    from transformers import AutoTokenizer

    path, _ = onnx_variants[name]
    model = ORTModelForSequenceClassification.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    enc = tok(TEXTS, truncation=True, max_length=64, padding=True, return_tensors="pt")
    with torch.inference_mode():
        theirs = model(**enc).logits.float().numpy()
    # optimum runs the padded batch as one forward: so does ours with batch_dependent="batched" (the
    # same graph; by default onnx-int8 runs row by row, see tests/integration/test_invariance.py)
    ours = load_runtime(path, "cpu", RuntimeOptions(batch_dependent="batched")).logits(TEXTS)
    np.testing.assert_allclose(theirs, ours, atol=1e-5)
    assert model.config.id2label == {0: "negative", 1: "positive"}


def test_fp32_graph_has_dynamic_batch_and_sequence_axes(onnx_variants):
    graph = _graph(onnx_variants["onnx-fp32"][0]).graph
    assert [i.name for i in graph.input] == ["input_ids", "attention_mask"]
    for inp in graph.input:
        dims = inp.type.tensor_type.shape.dim
        assert [d.dim_param for d in dims] == ["batch_size", "sequence_length"]
    assert [o.name for o in graph.output] == ["logits"]


def test_fp32_export_is_qserves_own(tiny_checkpoint, tmp_path):
    """The fp32 graph comes from torch.onnx alone: with optimum unimportable the export still runs, with the
    opset it records and the inputs the tiny DistilBERT takes."""
    code = (
        "import sys; sys.modules['optimum'] = None; from pathlib import Path; from exporters.onnx import export_fp32; "
        f"print(export_fp32(Path({str(tiny_checkpoint)!r}), Path({str(tmp_path / 'out')!r}), opset=17))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "17"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["config.json", "model.onnx"]
    graph = _graph(tmp_path / "out").graph
    assert [i.name for i in graph.input] == ["input_ids", "attention_mask"]


def test_fp16_keeps_fp32_io_and_stores_fp16_weights(onnx_variants):
    import onnx

    graph = _graph(onnx_variants["onnx-fp16"][0]).graph
    assert graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert {i.type.tensor_type.elem_type for i in graph.input} == {onnx.TensorProto.INT64}
    big = [t for t in graph.initializer if np.prod(t.dims) >= 1024]
    assert big and all(t.data_type == onnx.TensorProto.FLOAT16 for t in big)


def _assert_signed_int8_linear_weights(path: Path) -> None:
    import onnx

    big = [t for t in _graph(path).graph.initializer if np.prod(t.dims) >= 1024]
    # Linear weights are signed int8 (the VNNI u8s8 kernel); embedding tables may be uint8
    # (ORT's Gather/EmbedLayerNormalization quantizers pick that themselves). Nothing stays float.
    linear = [t for t in big if "embeddings" not in t.name]
    assert len(linear) >= 2 * 4 + 1  # per layer: q/k/v (maybe fused), out, ffn in, ffn out; + pre_classifier
    assert all(t.data_type == onnx.TensorProto.INT8 for t in linear)
    assert all(t.data_type in (onnx.TensorProto.INT8, onnx.TensorProto.UINT8) for t in big)


def test_int8_graph_holds_signed_int8_quantized_ops(onnx_variants):
    path, manifest = onnx_variants["onnx-int8"]
    ops = _ops(path)
    assert {"MatMulInteger", "DynamicQuantizeLinear"} <= ops
    float_matmuls_with_weights = [
        n
        for n in _graph(path).graph.node
        if n.op_type in ("MatMul", "Gemm") and n.input[1] in {t.name for t in _graph(path).graph.initializer}
    ]
    assert float_matmuls_with_weights == []
    _assert_signed_int8_linear_weights(path)
    q = manifest["onnx"]["quantization"]
    assert (q["preset"], q["weight_type"], q["per_channel"], q["reduce_range"]) == ("avx512_vnni", "QInt8", True, False)
    assert "fusions" not in manifest["onnx"]


def test_int8_optimize_fuses_attention_before_quantizing(tiny_checkpoint, reference, tmp_path):
    out = tmp_path / "onnx-int8-fused"
    manifest = exporters.export(
        tiny_checkpoint, "onnx-int8", out, options={"optimize": True, "per_channel": False}
    ).to_json()
    assert {"QAttention", "SkipLayerNormalization"} <= _ops(out)
    assert manifest["onnx"]["fusions"]["Attention"] == 2  # one per layer of the tiny model
    assert manifest["onnx"]["quantization"]["per_channel"] is False
    _assert_signed_int8_linear_weights(out)
    runtime = load_runtime(out, "cpu")
    got = runtime.logits(TEXTS)
    assert np.abs(got - reference).max() <= RELATIVE_TOL["int8"] * np.abs(reference).max()
    alone = np.concatenate([runtime.logits([t]) for t in TEXTS])
    assert np.abs(got - alone).max() <= BATCH_TOL["int8"] * max(np.abs(alone).max(), 1.0)


def test_int8_is_a_quarter_of_fp32(onnx_variants):
    fp32 = (onnx_variants["onnx-fp32"][0] / "model.onnx").stat().st_size
    int8 = (onnx_variants["onnx-int8"][0] / "model.onnx").stat().st_size
    assert 0.2 < int8 / fp32 < 0.3, f"int8/fp32 size ratio {int8 / fp32:.3f}"


def test_int4_graph_holds_matmulnbits(onnx_variants):
    import onnx

    path, manifest = onnx_variants["onnx-int4"]
    nodes = [n for n in _graph(path).graph.node if n.op_type == "MatMulNBits"]
    assert len(nodes) == 2 * 6  # 2 layers x (q, k, v, out, ffn in, ffn out)
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in nodes[0].attribute}
    assert (attrs["bits"], attrs["block_size"], attrs["accuracy_level"]) == (4, 32, 4)
    assert "Gather" in _ops(path) and "GatherBlockQuantized" not in _ops(path)  # embeddings stay fp32
    assert manifest["onnx"]["quantization"]["block_size"] == 32


def test_int4_quantize_embeddings_and_block_size(tiny_checkpoint, onnx_variants, reference, tmp_path):
    out = tmp_path / "onnx-int4-emb"
    manifest = exporters.export(
        tiny_checkpoint, "onnx-int4", out, options={"quantize_embeddings": True, "block_size": 16}
    ).to_json()
    assert {"MatMulNBits", "GatherBlockQuantized"} <= _ops(out)
    assert manifest["spec"]["options"] == {"quantize_embeddings": True, "block_size": 16}
    assert manifest["onnx"]["quantization"]["op_types"] == ["MatMul", "Gather"]
    # Embeddings dominate the tiny model, so 4-bit embeddings shrink it well below the default int4.
    default = (onnx_variants["onnx-int4"][0] / "model.onnx").stat().st_size
    assert (out / "model.onnx").stat().st_size < 0.35 * default
    got = load_runtime(out, "cpu").logits(TEXTS)
    assert np.abs(got - reference).max() <= RELATIVE_TOL["int4"] * np.abs(reference).max()


@pytest.mark.parametrize(
    "name,options,words",
    [
        ("onnx-int8", {"bogus": 1}, ["'bogus'", "onnx-int8", "per_channel", "reduce_range"]),
        ("onnx-fp32", {"per_channel": True}, ["'per_channel'", "onnx-fp32", "allowed: opset"]),
        ("onnx-int4", {"block_size": 33}, ["block_size", "power of two"]),
        ("onnx-int4", {"accuracy_level": 7}, ["accuracy_level", "0, 1, 2, 3, 4"]),
        ("onnx-int8", {"per_channel": "yes"}, ["per_channel", "true or false"]),
    ],
)
def test_bad_options_are_refused_before_anything_is_written(tiny_checkpoint, tmp_path, name, options, words):
    assert_refused_before_writing(tiny_checkpoint, tmp_path, name, options, words)


def test_threads_option_gives_same_logits(onnx_variants):
    path, _ = onnx_variants["onnx-fp32"]
    one = load_runtime(path, "cpu", RuntimeOptions(threads=1))
    assert one.session.get_session_options().intra_op_num_threads == 1
    np.testing.assert_allclose(one.logits(TEXTS), load_runtime(path, "cpu").logits(TEXTS), atol=1e-5)


def test_cpu_sessions_skip_the_slow_fused_skip_layernorm(onnx_variants, monkeypatch, tmp_path):
    """The runtime turns off ORT's SkipLayerNormFusion on CPU (slower there, see onnx_rt.py)."""
    import onnxruntime as ort

    path, _ = onnx_variants["onnx-int8"]
    seen = {}
    real = ort.InferenceSession

    def spy(model, sess_options=None, providers=None, **kw):
        seen.update(kw)
        sess_options.optimized_model_filepath = str(tmp_path / "optimized.onnx")  # what ORT really ran
        return real(model, sess_options=sess_options, providers=providers, **kw)

    monkeypatch.setattr(ort, "InferenceSession", spy)
    load_runtime(path, "cpu").logits(TEXTS)
    assert seen["disabled_optimizers"] == ["SkipLayerNormFusion"]
    import onnx

    ops = {n.op_type for n in onnx.load(str(tmp_path / "optimized.onnx")).graph.node}
    assert "SkipLayerNormalization" not in ops and "LayerNormalization" in ops
    # With the fusion left on, ORT does fuse this graph: the option is what keeps it out.
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "fused.onnx")
    real(str(path / "model.onnx"), sess_options=so, providers=["CPUExecutionProvider"])
    assert "SkipLayerNormalization" in {n.op_type for n in onnx.load(str(tmp_path / "fused.onnx")).graph.node}


def _ort_has_cuda() -> bool:
    import onnxruntime as ort

    return "CUDAExecutionProvider" in ort.get_available_providers()


def test_cuda_without_cuda_provider_names_the_gpu_extra(onnx_variants):
    from qserve.runtime.onnx_rt import OnnxRuntime

    if _ort_has_cuda():
        pytest.skip("this onnxruntime has the CUDA provider")
    path, manifest = onnx_variants["onnx-fp32"]
    with pytest.raises(QserveError, match=r"qserve\[gpu\]"):
        OnnxRuntime(path, read_manifest(path), "cuda", RuntimeOptions())


def test_int8_on_cuda_is_refused(onnx_variants):
    from qserve.runtime.onnx_rt import OnnxRuntime

    path, manifest = onnx_variants["onnx-int8"]
    with pytest.raises(QserveError, match="no CUDA kernels"):
        OnnxRuntime(path, read_manifest(path), "cuda", RuntimeOptions())


def test_missing_onnxruntime_names_the_cpu_extra(onnx_variants, monkeypatch):
    from qserve.runtime.onnx_rt import OnnxRuntime

    path, manifest = onnx_variants["onnx-fp32"]
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # what `import` sees when it is not installed
    with pytest.raises(QserveError, match=r"pip install 'qserve\[cpu\]'"):
        OnnxRuntime(path, read_manifest(path), "cpu", RuntimeOptions())
