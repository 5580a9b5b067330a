"""bnb 4-bit weight clipping: the search, its exactness under bitsandbytes' own quantizer, the export.

python -m pytest tests/integration/test_clipping.py -q
"""

from __future__ import annotations

import copy

import pytest

pytest.importorskip("bitsandbytes")

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

import exporters  # noqa: E402
from exporters import clipping  # noqa: E402
from exporters.calibration import calibration_batches, calibration_set  # noqa: E402
from qserve import QserveError  # noqa: E402
from qserve.artifact import read_manifest  # noqa: E402
from qserve.runtime import load_runtime  # noqa: E402


def _flat_dequantize(packed: torch.Tensor, state) -> torch.Tensor:
    """bitsandbytes' stored blocks run over the flattened weight; dequantize them in that layout.

    (bitsandbytes 0.50.2's 2-D CPU dequantize blocks each row instead, wrong when a row is not
    a whole number of blocks: see qserve.runtime.torch_rt.)
    """
    import bitsandbytes.functional as F

    flat = copy.copy(state)
    flat.shape = torch.Size([state.shape.numel()])
    return F.dequantize_4bit(packed.reshape(-1), flat).float().reshape(state.shape)


def _bnb_roundtrip(w: torch.Tensor, quant_type: str, block: int = 64) -> torch.Tensor:
    import bitsandbytes.functional as F

    q, state = F.quantize_4bit(w.contiguous(), blocksize=block, quant_type=quant_type)
    return _flat_dequantize(q, state)


def _weighted_error(w: torch.Tensor, dq: torch.Tensor, h: torch.Tensor) -> float:
    return float((h.reshape(1, -1) * (dq - w) ** 2).sum())


def _outlier_weight(shape: tuple[int, int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(shape, generator=g) * 0.05
    w.view(-1)[::97] *= 12  # a few large weights per block, as in trained encoders
    h = torch.rand(shape[1], generator=g) + 0.1
    h[:3] *= 30  # and a few loud input channels
    return w, h


@pytest.mark.parametrize("quant_type", ["fp4", "nf4"])
@pytest.mark.parametrize("shape", [(48, 128), (32, 48), (5, 50)])  # whole rows, blocks across rows, a partial block
def test_bitsandbytes_stores_exactly_the_simulated_clipped_grid(quant_type, shape):
    w, h = _outlier_weight(shape)
    clipped, ratios, before, after = clipping.clip_blocks(w, h, quant_type, 64)
    n_blocks = -(-w.numel() // 64)
    assert ratios.shape == (n_blocks,) and ((ratios > 0.29) & (ratios <= 1.0)).all()
    assert (ratios < 1).any()  # outliers: some block must prefer a clipped range
    # The clipped weights only ever move toward zero, and only the large ones.
    assert (clipped.abs() <= w.abs() + 1e-7).all() and (torch.sign(clipped) * torch.sign(w) >= 0).all()
    # bitsandbytes quantizing the clipped weight gives the error the search predicted ...
    got = _bnb_roundtrip(clipped, quant_type)
    assert _weighted_error(w, got, h) == pytest.approx(after, rel=1e-4)
    # ... and the unclipped weight the plain error: clipping is strictly better here.
    assert _weighted_error(w, _bnb_roundtrip(w, quant_type), h) == pytest.approx(before, rel=1e-4)
    assert after < before


def test_no_signal_means_no_clipping():
    w, _ = _outlier_weight((16, 64))
    clipped, ratios, before, after = clipping.clip_blocks(w, torch.zeros(64), "fp4", 64)
    assert before == after == 0.0 and (ratios == 1).all() and torch.equal(clipped, w)  # ties keep r = 1


def test_second_moments_skip_padding(tiny_checkpoint):
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(tiny_checkpoint, dtype=torch.float32).eval()
    name = "distilbert.transformer.layer.0.ffn.lin1"
    short, long_ = "ok", "a long and winding review of a film that goes nowhere at all"
    alone = clipping.second_moments(model, calibration_batches(tiny_checkpoint, [short], 64), [name])[name]
    padded = calibration_batches(tiny_checkpoint, [short, long_], 64, batch_size=2)
    both = clipping.second_moments(model, padded, [name])[name]
    n_short = int(calibration_batches(tiny_checkpoint, [short], 64)[0]["attention_mask"].sum())
    n_long = int(padded[0]["attention_mask"][1].sum())
    only_long = clipping.second_moments(model, calibration_batches(tiny_checkpoint, [long_], 64), [name])[name]
    # the mean over real tokens of both texts: the short text's padding rows never count
    torch.testing.assert_close(both, (alone * n_short + only_long * n_long) / (n_short + n_long), rtol=1e-4, atol=1e-7)


def _dequantized(variant, name: str) -> torch.Tensor:
    rt = load_runtime(variant, device="cpu")
    module = dict(rt.model.named_modules())[name]
    w = _flat_dequantize(module.weight.data, module.weight.quant_state)
    rt.close()
    return w


def test_clipped_export_lowers_every_layers_output_error(tiny_checkpoint, tmp_path):
    from transformers import AutoModelForSequenceClassification

    clipped = tmp_path / "clipped"
    plain = tmp_path / "plain"
    m = exporters.export(tiny_checkpoint, "bnb-fp4", clipped).to_json()
    exporters.export(tiny_checkpoint, "bnb-fp4", plain, options={"clip": False})
    rec = m["bnb"]["clipping"]
    assert m["spec"]["options"] == {} and m["bnb"]["options"]["clip"] is True
    assert rec["linears"] == 12 and rec["block_size"] == 64 and rec["quant_type"] == "fp4"
    assert (
        0 < rec["blocks_clipped"] <= rec["blocks"] and rec["weighted_error"]["clipped"] < rec["weighted_error"]["plain"]
    )
    assert "parity probe texts" in rec["calibration"]  # the tiny checkpoint records no dataset
    assert "clipping" not in read_manifest(plain).to_json()["bnb"]
    assert m["parity"]["within_tolerance"]
    # The stored weights themselves: per layer, the clipped variant's output error (weighted by
    # the same calibration activations) is below the plain variant's.
    fp32 = AutoModelForSequenceClassification.from_pretrained(tiny_checkpoint, dtype=torch.float32).eval()
    batches, _ = calibration_set(tiny_checkpoint, 64)  # what the exporter calibrated on
    names = [n for n, mod in fp32.named_modules() if isinstance(mod, torch.nn.Linear) and "classifier" not in n]
    moments = clipping.second_moments(fp32, batches, names)
    ref = load_file(str(tiny_checkpoint / "model.safetensors"))
    for n in names:
        w = ref[f"{n}.weight"].float()
        e_clip = _weighted_error(w, _dequantized(clipped, n), moments[n])
        e_plain = _weighted_error(w, _dequantized(plain, n), moments[n])
        assert e_clip <= e_plain * (1 + 1e-6), n
    assert not list(tmp_path.glob("**/qserve-clip-*"))
    nf4 = exporters.export(tiny_checkpoint, "bnb-nf4", tmp_path / "nf4").to_json()  # off by default for nf4 ...
    assert nf4["bnb"]["options"]["clip"] is False and "clipping" not in nf4["bnb"]
    nf4c = exporters.export(
        tiny_checkpoint, "bnb-nf4", tmp_path / "nf4c", options={"clip": True}
    ).to_json()  # ... on request
    assert nf4c["bnb"]["clipping"]["quant_type"] == "nf4"


def test_clipping_mismatch_with_what_bitsandbytes_quantized_is_refused(tiny_checkpoint, tmp_path, monkeypatch):
    from exporters import bnb

    real = bnb.quantization_kwargs

    def skip_ffn_too(spec, opts):  # transformers told to skip modules that clipping did clip
        kw = real(spec, opts)
        kw["llm_int8_skip_modules"] = [*kw["llm_int8_skip_modules"], "lin1"]
        return kw

    monkeypatch.setattr(bnb, "quantization_kwargs", skip_ffn_too)
    with pytest.raises(QserveError, match=r"clipping covered 12 Linears but bitsandbytes quantized 10.*--no-clip"):
        exporters.export(tiny_checkpoint, "bnb-nf4", tmp_path / "v", options={"clip": True})
    assert not list(tmp_path.iterdir())
