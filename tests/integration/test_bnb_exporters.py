"""bitsandbytes variants: export, reload from the variant alone, real bnb modules, parity, options.

python -m pytest tests/integration/test_bnb_exporters.py -q
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_refused_before_writing

import exporters
from exporters.core import PROBES, TOLERANCE
from qserve import QserveError
from qserve.artifact import read_manifest, write_manifest
from qserve.runtime import load_runtime

BNB = ["bnb-int8", "bnb-nf4", "bnb-fp4"]
TEXTS = ["a wonderful film", "terrible, I walked out", "ok"]


@pytest.fixture(scope="module")
def bnb_variants(tiny_checkpoint, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bnb")
    for name in BNB:
        exporters.export(tiny_checkpoint, name, root / name)
    return {name: root / name for name in BNB}


def _reference(checkpoint: Path, texts: list[str]) -> np.ndarray:
    from exporters.core import reference_logits

    return reference_logits(checkpoint, texts, 64)


@pytest.mark.parametrize("name", BNB)
def test_export_records_config_and_parity(bnb_variants, name):
    manifest = read_manifest(bnb_variants[name]).to_json()
    assert manifest["spec"]["name"] == name and manifest["spec"]["backend"] == "bnb"
    bnb = manifest["bnb"]
    # tiny model: 2 layers x (q, k, v, out, lin1, lin2); the head is not counted
    assert bnb["quantized_linear_modules"] == 12
    assert bnb["skipped_modules"] == ["pre_classifier", "classifier"]
    qc = bnb["quantization_config"]
    if name == "bnb-int8":
        assert qc["load_in_8bit"] is True and qc["llm_int8_threshold"] == 6.0
    else:
        assert qc["load_in_4bit"] is True and qc["bnb_4bit_quant_type"] == name.split("-")[1]
        assert qc["bnb_4bit_compute_dtype"] == "bfloat16" and qc["bnb_4bit_use_double_quant"] is False
    parity = manifest["parity"]
    assert parity["probes"] == len(PROBES) and parity["within_tolerance"]
    assert parity["max_abs_logit_diff"] <= TOLERANCE[manifest["spec"]["dtype"]]
    # the saved config.json carries everything needed to rebuild the quantized model
    cfg = json.loads((bnb_variants[name] / "config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == "bitsandbytes"
    assert cfg["quantization_config"]["llm_int8_skip_modules"] == ["pre_classifier", "classifier"]


@pytest.mark.parametrize("name", BNB)
def test_loaded_model_holds_bnb_modules_and_fp32_head(bnb_variants, name):
    import bitsandbytes as bnb
    import torch

    rt = load_runtime(bnb_variants[name], device="cpu")
    layer = rt.model.distilbert.transformer.layer[0]
    linears = [
        layer.attention.q_lin,
        layer.attention.k_lin,
        layer.attention.v_lin,
        layer.attention.out_lin,
        layer.ffn.lin1,
        layer.ffn.lin2,
    ]
    for lin in linears:
        if name == "bnb-int8":
            assert isinstance(lin, bnb.nn.Linear8bitLt)
            assert lin.weight.dtype == torch.int8 and tuple(lin.weight.shape) == (lin.out_features, lin.in_features)
        else:
            assert isinstance(lin, bnb.nn.Linear4bit)
            assert lin.weight.dtype == torch.uint8  # two 4-bit codes per byte
            assert lin.weight.numel() == lin.out_features * lin.in_features // 2
            assert lin.weight.quant_state.quant_type == name.split("-")[1]
    for head in (rt.model.pre_classifier, rt.model.classifier):
        assert type(head) is torch.nn.Linear and head.weight.dtype == torch.float32
    assert rt.model.distilbert.embeddings.word_embeddings.weight.dtype == torch.float32
    probs = rt.predict(TEXTS)
    assert probs.shape == (3, 2) and np.allclose(probs.sum(-1), 1, atol=1e-5)
    rt.close()


@pytest.mark.parametrize("name", BNB)
def test_saved_sizes_match_the_bit_width(bnb_variants, name):
    bnb = read_manifest(bnb_variants[name]).to_json()["bnb"]
    ratio = bnb["quantized_linear_bytes"] / bnb["quantized_linear_bytes_fp32"]
    # int8: 1/4 + a fp32 scale per row; 4-bit: 1/8 + absmax per 64-block + quant map/state
    # (the per-tensor part weighs more on 32-wide test layers than on real ones)
    assert (0.25 < ratio < 0.3) if name == "bnb-int8" else (0.125 < ratio < 0.2)


@pytest.mark.parametrize("name", ["bnb-int8", "bnb-nf4"])
def test_variant_loads_without_the_source_checkpoint(tiny_checkpoint, tmp_path, name):
    source = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, source)
    ref = _reference(source, TEXTS)
    made = tmp_path / "made" / name
    exporters.export(source, name, made)
    moved = tmp_path / "elsewhere" / name
    shutil.copytree(made, moved)
    shutil.rmtree(made)
    shutil.rmtree(source)  # the fp32 weights are gone: only the variant directory remains
    rt = load_runtime(moved, device="cpu")
    got = rt.logits(TEXTS)
    assert got.shape == ref.shape
    assert np.max(np.abs(got - ref)) <= TOLERANCE[name.split("-")[1]]
    assert (got.argmax(-1) == ref.argmax(-1)).all()
    rt.close()


def test_double_quant_and_threshold_options_reach_the_config(tiny_checkpoint, tmp_path):
    out = tmp_path / "nf4-dq"
    manifest = exporters.export(tiny_checkpoint, "bnb-nf4", out, options={"double_quant": True}).to_json()
    assert manifest["bnb"]["quantization_config"]["bnb_4bit_use_double_quant"] is True
    assert json.loads((out / "config.json").read_text())["quantization_config"]["bnb_4bit_use_double_quant"]
    assert manifest["parity"]["within_tolerance"]
    rt = load_runtime(out, device="cpu")
    assert rt.model.distilbert.transformer.layer[0].ffn.lin2.weight.quant_state.nested
    rt.close()

    out8 = tmp_path / "int8-t0"
    manifest = exporters.export(tiny_checkpoint, "bnb-int8", out8, options={"llm_int8_threshold": "0"}).to_json()
    assert manifest["bnb"]["quantization_config"]["llm_int8_threshold"] == 0.0
    assert json.loads((out8 / "config.json").read_text())["quantization_config"]["llm_int8_threshold"] == 0.0


@pytest.mark.parametrize(
    ("name", "options", "words"),
    [
        ("bnb-int8", {"bogus": 1}, ["'bogus'", "llm_int8_threshold"]),
        ("bnb-int8", {"double_quant": True}, ["'double_quant'", "llm_int8_threshold"]),
        ("bnb-nf4", {"llm_int8_threshold": 3.0}, ["'llm_int8_threshold'", "double_quant"]),
        ("bnb-int8", {"llm_int8_threshold": -1}, ["llm_int8_threshold", ">= 0", "-1"]),
        ("bnb-fp4", {"double_quant": "maybe"}, ["double_quant", "true or false", "maybe"]),
        ("bnb-fp4", {"clip": "sometimes"}, ["clip", "true or false", "sometimes"]),
        ("bnb-nf4", {"calibration_samples": 0}, ["calibration_samples", "from 1 to 1024", "0"]),
        ("bnb-int8", {"clip": True}, ["'clip'", "llm_int8_threshold"]),
    ],
)
def test_bad_options_are_refused_before_anything_is_written(tiny_checkpoint, tmp_path, name, options, words):
    assert_refused_before_writing(tiny_checkpoint, tmp_path, name, options, words)


def test_missing_bitsandbytes_gives_an_install_hint(bnb_variants, tiny_checkpoint, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # makes `import bitsandbytes` fail
    with pytest.raises(QserveError, match=r"pip install bitsandbytes"):
        exporters.export(tiny_checkpoint, "bnb-int8", tmp_path / "x")
    with pytest.raises(QserveError, match=r"bnb-int8 needs bitsandbytes.*pip install bitsandbytes"):
        load_runtime(bnb_variants["bnb-int8"], device="cpu")


def test_bnb_variant_without_quantization_config_is_refused(bnb_variants, tmp_path):
    from qserve.artifact import VariantError

    broken = tmp_path / "broken"
    shutil.copytree(bnb_variants["bnb-int8"], broken)
    cfg = json.loads((broken / "config.json").read_text())
    del cfg["quantization_config"]
    (broken / "config.json").write_text(json.dumps(cfg))
    write_manifest(broken, read_manifest(broken))  # re-hashed, so only the missing config is wrong
    with pytest.raises(VariantError, match="quantization_config"):
        load_runtime(broken, device="cpu")


@pytest.mark.parametrize("name", ["bnb-nf4", "bnb-fp4"])
def test_4bit_layers_compute_with_bitsandbytes_own_quantization(tiny_checkpoint, tmp_path, name):
    """Each 4-bit layer multiplies by bitsandbytes' quantization of the checkpoint weight, whose
    blocks run over the flattened weight: also for rows shorter than a block (in_features 32
    here), where bitsandbytes 0.50.2's own CPU dequantize blocks per row and gets it wrong."""
    import bitsandbytes.functional as F
    import torch
    from safetensors.torch import load_file

    out = tmp_path / name
    exporters.export(tiny_checkpoint, name, out, options={"clip": False})
    rt = load_runtime(out, device="cpu")
    ref = load_file(str(tiny_checkpoint / "model.safetensors"))
    modules = dict(rt.model.named_modules())
    g = torch.Generator().manual_seed(0)
    for layer in ("distilbert.transformer.layer.0.attention.q_lin", "distilbert.transformer.layer.1.ffn.lin2"):
        module, w = modules[layer], ref[f"{layer}.weight"]
        q, state = F.quantize_4bit(w.reshape(-1).contiguous(), blocksize=64, quant_type=name.split("-")[1])
        w4 = F.dequantize_4bit(q, state).reshape(w.shape)
        x = torch.randn(2, 5, module.in_features, generator=g)
        expected = torch.nn.functional.linear(x.bfloat16(), w4.bfloat16(), ref[f"{layer}.bias"].bfloat16()).float()
        with torch.inference_mode():
            got = module(x)
        torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-3)
    rt.close()


@pytest.mark.parametrize("name", BNB)
def test_text_scores_within_the_published_bound_alone_and_in_mixed_batches(bnb_variants, name):
    """One text, one answer (README): bitsandbytes stays within its kernels' rounding when batched."""
    from test_invariance import BOUND, TEXTS, random_mixed_batches

    from qserve.runtime import RuntimeOptions

    runtime = load_runtime(bnb_variants[name], "cpu", RuntimeOptions(threads=1))
    worst, flips = random_mixed_batches(runtime, TEXTS, seed=7)
    assert worst <= BOUND[name], f"{name}: max |Δprob| {worst:.3g} alone vs in batches"
    assert flips == 0
