"""Repair on real components: a layer made fragile on purpose is ranked first, kept in fp32, and the variant passes.

    python -m pytest tests/integration/test_repair.py -q

The fragile layer: one outlier weight 1000x the layer's largest in the head's dense layer (DistilBERT's
pre_classifier, BERT's pooler), its unit biased never to fire (the fp32 model does not use it). It breaks ONNX
Runtime's dynamic int8 with per-tensor weights (onnx-int8 per_channel=false): the one scale the outlier sets rounds
every other weight of the layer to zero, so the head answers the same for every text. The data: embedded sentences the
fp32 model is decided on (its two logits further apart than for 60% of them), so only a broken layer flips an answer.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from tiny_archs import build

FRAGILE = {"distilbert": ("pre_classifier", "/pre_classifier/Gemm"), "bert": ("bert.pooler.dense", None)}
PER_TENSOR = {"per_channel": False, "smooth": False}


def fragile(arch: str, root: Path) -> Path:
    """A tiny `arch` checkpoint with its head's dense layer made fragile, and a csv of texts it is decided on."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from exporters.core import checkpoint_info, reference_logits
    from qserve.data.datasets import load_dataset

    ckpt = build(arch, root / "checkpoint")
    model = AutoModelForSequenceClassification.from_pretrained(ckpt)
    layer = model.get_submodule(FRAGILE[arch][0])
    with torch.no_grad():
        big = 1000 * layer.weight.abs().max()
        layer.weight[0, 0] = big
        layer.bias[0] = -6 * big  # its input is a LayerNorm's, |x| < sqrt(32): the unit never fires
    model.save_pretrained(ckpt)
    train = load_dataset("rotten-tomatoes", seed=42).train  # short texts: a cheap scan
    texts, labels = train.texts[:5000], train.labels[:5000]
    logits = reference_logits(ckpt, texts, checkpoint_info(ckpt).max_length)  # as the variants read them
    margin = np.abs(logits[:, 1] - logits[:, 0])
    with open(root / "decided.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        w.writerows(
            [t, ["negative", "positive"][lab]] for t, lab, m in zip(texts, labels, margin) if m > np.median(margin)
        )
    return ckpt


@pytest.fixture(scope="module")
def distilbert(tmp_path_factory) -> Path:
    """The fragile DistilBERT with its dataset recorded (the exporters calibrate on it), torch-fp32 and onnx-int8."""
    import exporters

    root = tmp_path_factory.mktemp("repair")
    ckpt = fragile("distilbert", root)
    meta = {"model_name": "tiny-fragile", "dataset": str(root / "decided.csv"), "seed": 42}
    (ckpt / "qserve_model.json").write_text(json.dumps(meta))
    exporters.export(ckpt, "torch-fp32", root / "variants" / "torch-fp32")
    exporters.export(ckpt, "onnx-int8", root / "variants" / "onnx-int8", options=PER_TENSOR)
    return root


def test_the_fragile_layer_is_ranked_first_kept_and_the_variant_then_passes(distilbert):
    from qserve.bench.analysis import VariantMeta, variant_entry
    from qserve.gate.config import GateConfig
    from qserve.repair import RepairConfig, repair
    from qserve.verify import verify

    variant, name = distilbert / "variants" / "onnx-int8", FRAGILE["distilbert"][1]
    gate = GateConfig(threads=1)
    r = repair(variant, distilbert / "checkpoint", gate, RepairConfig(search_texts=300))
    rec = r["repair"]
    assert r["needed"] and r["before"]["agreement"] < 0.9  # the head answers alike for every text
    gains = [r["gain"] for r in rec["ranking"]]
    assert rec["ranking"][0]["layer"] == name and gains[0] > 10 * max(abs(g) for g in gains[1:])
    assert rec["kept"] == [name] and rec["reached"] and rec["trace"][0]["kept"] == []
    assert [len(s["kept"]) for s in rec["trace"]] == [0, 1] and rec["trace"][1]["agreement"] >= 0.99
    assert rec["target"]["texts"]["split"] == "val" and rec["ranked_on"]["split"] == "train"
    g = r["gate"]
    assert g["passed"] and g["decision"] == "passed" and g["data"]["split"] == "test"  # texts the search never saw
    repaired = verify(Path(r["dir"]))
    assert repaired.records["repair"] == rec and repaired.gate == g
    assert repaired.record("onnx")["kept_fp32"] == [name] and repaired.spec.options["keep_fp32"] == name
    # the unrepaired variant fails its gate on the same texts
    (before,) = __import__("qserve.gate.run", fromlist=["run_gate"]).run_gate([variant], gate)
    assert before["gate"]["decision"] == "failed"
    # the bench's row carries the repair, under the repaired variant's own name
    entry = variant_entry(VariantMeta(r["dir"], manifest=repaired), {"status": "ok"})
    assert entry["name"] == "onnx-int8-repaired" and entry["repair"]["of"] == "onnx-int8"
    assert entry["gate"]["decision"] == "passed" and entry["gate"]["n"] == g["n"]


def test_a_bring_your_own_bert_goes_through_export_with_repair_and_the_gate(tmp_path, capsys):
    """BERT (its pooler made fragile), no qserve_model.json: `qserve export --repair --data` with the user's csv."""
    from qserve.cli import main
    from qserve.verify import verify

    ckpt = fragile("bert", tmp_path)
    out = tmp_path / "variants" / "onnx-int8"
    argv = ["export", str(ckpt), "--variant", "onnx-int8", "--out", str(out), "--no-per-channel", "--no-smooth"]
    assert main([*argv, "--repair", "--data", str(tmp_path / "decided.csv"), "--search-texts", "300"]) == 0
    said = capsys.readouterr().out
    assert "1 layer(s) kept in fp32" in said and "gate passed" in said
    repaired = verify(tmp_path / "variants" / "onnx-int8-repaired")
    rec = repaired.records["repair"]
    assert rec["kept"] == [rec["ranking"][0]["layer"]] and "/bert/pooler/dense/" in rec["kept"][0]
    assert repaired.gate is not None and repaired.gate["passed"]
    assert (tmp_path / "variants" / "torch-fp32" / "manifest.json").is_file()  # the reference it exported to compare


@pytest.mark.parametrize("name", ["onnx-int4", "ov-int8", "bnb-nf4"])
def test_each_backend_puts_layers_back_on_its_graph_and_keeps_one_in_its_export(tiny_checkpoint, tmp_path, name):
    """On the served graph: no layer back is the variant as served, every layer back is fp32's answers (ov-int8:
    closer to them; NNCF also quantizes inside attention); exported with keep_fp32, the layer is no longer quantized."""
    import exporters
    from exporters.core import PROBES, reference_logits
    from exporters.layers import open_layers
    from qserve.runtime import load_runtime

    small = {"calibration_samples": 4} if name == "ov-int8" else {}
    exporters.export(tiny_checkpoint, name, tmp_path / name, options=small)
    rt = load_runtime(tmp_path / name, "cpu")
    served = rt.logits(PROBES)
    rt.close()
    layers = open_layers(tmp_path / name, tiny_checkpoint, threads=1)
    names, ref = list(layers.names), reference_logits(tiny_checkpoint, PROBES, 64)
    assert len(names) >= 12  # 2 layers x (q, k, v, out, lin1, lin2) at least
    layers.use([])
    assert np.abs(layers.rt.logits(PROBES) - served).max() < 1e-5
    layers.use(names)
    back = np.abs(layers.rt.logits(PROBES) - ref).max()
    assert back < 1e-4 if name != "ov-int8" else back < np.abs(served - ref).max()
    layers.close()
    exporters.export(tiny_checkpoint, name, tmp_path / "kept", options={**small, "keep_fp32": names[0]})
    kept = open_layers(tmp_path / "kept", tiny_checkpoint, threads=1)
    assert kept.names == names[1:]
    kept.close()
