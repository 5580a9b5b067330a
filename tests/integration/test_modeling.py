"""qserve.modeling: the exact BERT -> DistilBERT map, and the three ways to name a model.

python -m pytest tests/integration/test_modeling.py -q
"""

from __future__ import annotations

import json

import pytest

from qserve import QserveError
from qserve.modeling import (
    DEFAULT_NAME,
    bert_to_distilbert,
    default_model_dir,
    default_tokenizer,
    load_for_training,
    model_name_for,
)

TEXTS = [
    "A wonderful film.",
    "Terrible acting, a plot full of holes, and an ending I saw coming an hour early.",
    "ok",
    "Not bad at all! Would watch again with friends.",
]


@pytest.fixture(scope="module")
def minilm():
    from safetensors.torch import load_file

    src = default_model_dir()
    return load_file(src / "model.safetensors"), json.loads((src / "config.json").read_text())


def test_mapped_distilbert_matches_bert_hidden_states(minilm):
    import torch
    from transformers import BertModel, DistilBertModel

    state, cfg = minilm
    bert = BertModel.from_pretrained(default_model_dir()).eval()
    dcfg, mapped = bert_to_distilbert(state, cfg)
    distil = DistilBertModel(dcfg).eval()
    result = distil.load_state_dict(mapped, strict=False)
    assert not result.unexpected_keys and all(k.endswith("position_ids") for k in result.missing_keys)
    enc = default_tokenizer()(TEXTS, padding=True, return_tensors="pt")
    assert enc["attention_mask"].min() == 0  # the batch really is padded
    with torch.no_grad():
        ref = bert(
            input_ids=enc["input_ids"],
            attention_mask=enc["attention_mask"],
            token_type_ids=torch.zeros_like(enc["input_ids"]),
        ).last_hidden_state
        got = distil(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).last_hidden_state
    real = enc["attention_mask"].bool()
    assert (ref - got)[real].abs().max().item() < 1e-4
    assert (dcfg.n_layers, dcfg.dim, dcfg.n_heads, dcfg.hidden_dim) == (6, 384, 12, 1536)


def test_map_folds_segment_zero_into_positions(minilm):
    state, cfg = minilm
    _, mapped = bert_to_distilbert(state, cfg)
    expected = state["embeddings.position_embeddings.weight"] + state["embeddings.token_type_embeddings.weight"][0]
    assert mapped["embeddings.position_embeddings.weight"].equal(expected)
    assert mapped["transformer.layer.5.attention.q_lin.weight"].equal(
        state["encoder.layer.5.attention.self.query.weight"]
    )
    assert mapped["transformer.layer.0.output_layer_norm.bias"].equal(state["encoder.layer.0.output.LayerNorm.bias"])
    assert not any(k.startswith("pooler") for k in mapped)


def test_map_refuses_what_it_cannot_map_exactly(minilm):
    state, cfg = minilm
    with pytest.raises(QserveError, match="position_embedding_type"):
        bert_to_distilbert(state, {**cfg, "position_embedding_type": "relative_key"})
    with pytest.raises(QserveError, match="layer_norm_eps"):
        bert_to_distilbert(state, {**cfg, "layer_norm_eps": 1e-5})
    with pytest.raises(QserveError, match="no DistilBERT counterpart"):
        bert_to_distilbert({**state, "encoder.extra.weight": state["pooler.dense.bias"]}, cfg)
    partial = {k: v for k, v in state.items() if "layer.3." not in k}
    with pytest.raises(QserveError, match="lacks 'encoder.layer.3"):
        bert_to_distilbert(partial, cfg)


def test_load_default_is_a_distilbert_classifier():
    model, tok, name = load_for_training("default", ["negative", "positive"])
    assert name == DEFAULT_NAME == "minilm-l6-distilbert"
    assert type(model).__name__ == "DistilBertForSequenceClassification"
    assert model.config.id2label == {0: "negative", 1: "positive"}
    assert model.config.label2id == {"negative": 0, "positive": 1}
    enc = tok(TEXTS[:2], padding=True, return_tensors="pt")
    assert set(enc) == {"input_ids", "attention_mask"}  # DistilBERT takes no token_type_ids
    assert model(**enc).logits.shape == (2, 2)


def test_load_local_directory_resizes_head(tiny_checkpoint):
    model, tok, name = load_for_training(str(tiny_checkpoint), ["a", "b", "c"])
    assert name == tiny_checkpoint.name and model.config.num_labels == 3
    assert model.config.id2label == {0: "a", 1: "b", 2: "c"}
    assert model.classifier.out_features == 3


def test_bad_labels_and_paths(tmp_path):
    with pytest.raises(QserveError, match="at least two distinct"):
        load_for_training("default", ["only"])
    with pytest.raises(QserveError, match="not a directory"):
        load_for_training(str(tmp_path / "missing-dir"), 2)
    (tmp_path / "empty").mkdir()
    with pytest.raises(QserveError, match="could not load the directory"):
        load_for_training(str(tmp_path / "empty"), 2)


def test_hub_id_offline_is_a_qserve_error_with_hint(monkeypatch):
    # HF_HUB_OFFLINE=1 (conftest) means this never reaches the network.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(QserveError, match=r"hub id 'qserve-tests/not-a-real-model'.*huggingface\.co"):
        load_for_training("qserve-tests/not-a-real-model", 2)


def test_hub_id_passes_labels_to_from_pretrained(monkeypatch, tiny_checkpoint):
    import transformers

    calls = {}
    real_model, real_tok = (
        transformers.AutoModelForSequenceClassification.from_pretrained,
        transformers.AutoTokenizer.from_pretrained,
    )

    def fake_model(source, **kw):
        calls["model"] = (source, kw)
        return real_model(tiny_checkpoint, **kw)

    def fake_tok(source, **kw):
        calls["tok"] = source
        return real_tok(tiny_checkpoint)

    monkeypatch.setattr(transformers.AutoModelForSequenceClassification, "from_pretrained", fake_model)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", fake_tok)
    model, _, name = load_for_training("distilbert/distilbert-base-uncased", ["neg", "pos"])
    assert name == "distilbert-base-uncased" and calls["tok"] == "distilbert/distilbert-base-uncased"
    source, kw = calls["model"]
    assert source == "distilbert/distilbert-base-uncased"
    assert kw["num_labels"] == 2 and kw["id2label"] == {0: "neg", 1: "pos"} and kw["ignore_mismatched_sizes"]


def test_model_name_for(tmp_path):
    assert model_name_for("default") == "minilm-l6-distilbert"
    assert model_name_for("distilbert-base-uncased") == "distilbert-base-uncased"
    assert model_name_for("org/some-model/") == "some-model"
    (tmp_path / "my-ckpt").mkdir()
    assert model_name_for(str(tmp_path / "my-ckpt")) == "my-ckpt"


def test_model_commands_load_torch_models_without_scikit_learn_or_scipy(tiny_checkpoint, tmp_path):
    """modeling.skip_unused_imports, as the CLI's model commands call it: after one of them (here an export
    refused for a checkpoint that is not there), a torch model loads without transformers importing scikit-learn or
    scipy
    (seconds of every start) and answers the same logits; a plain load does pull both in, so this checks the
    call, not the environment."""
    import subprocess
    import sys

    load = (
        "from transformers import AutoModelForSequenceClassification as A; "
        f"m = A.from_pretrained({str(tiny_checkpoint)!r}).eval(); import torch; "
        "print(m(input_ids=torch.tensor([[101, 2204, 102]])).logits.tolist()); "
        "print('sklearn' in sys.modules, 'scipy' in sys.modules)"
    )
    cli = (
        "from qserve.cli import main; "
        f"rc = main(['export', {str(tmp_path / 'missing')!r}, '--variant', 'torch-fp32', "
        f"'--out', {str(tmp_path / 'v')!r}]); assert rc == 2, rc; "
    )

    def run(code: str) -> list[str]:
        return subprocess.run(
            [sys.executable, "-c", "import sys; " + code], capture_output=True, text=True, check=True
        ).stdout.split("\n")[-3:-1]

    (plain_logits, plain_mods), (logits, mods) = run(load), run(cli + load)
    assert plain_mods == "True True" and mods == "False False"
    assert logits == plain_logits


def test_skipping_the_unused_imports_imports_no_transformers():
    """skip_unused_imports runs at every model command's start, `qserve serve` of an ONNX dir included: it imports
    nothing (a serving install has no transformers), and the checks are still replaced once transformers loads."""
    import subprocess
    import sys

    code = (
        "import sys; from qserve.modeling import skip_unused_imports; skip_unused_imports(); skip_unused_imports(); "
        "print('transformers' in sys.modules); import transformers.utils as u; "
        "print(u.is_sklearn_available(), u.import_utils.is_scipy_available())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[:2] == ["False", "False False"], out
