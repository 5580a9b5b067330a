"""Tiny random-initialised classifiers of every architecture qserve supports, as `save_pretrained` writes them.

    python -c "import sys; sys.path.insert(0, 'tests'); from tiny_archs import build; \\
print(build('bert', __import__('pathlib').Path('/tmp/tiny-bert')))"

What a user brings: a checkpoint qserve did not train (config.json, model.safetensors, tokenizer
files, no qserve_model.json), here 2 layers of width 32-64 with the embedded uncased WordPiece
tokenizer, so every exporter runs in seconds. The configs keep each architecture's own layout
(RoBERTa's padding-offset positions, DeBERTa-v3's relative attention, ALBERT's factorised and shared
layers, ELECTRA's small embeddings, ModernBERT's rotary local/global attention); only sizes shrink.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

ARCHS = ("distilbert", "bert", "roberta", "xlm-roberta", "deberta-v2", "electra", "albert", "modernbert")
LABELS = ("negative", "positive")
MAX_POSITIONS = 128


def config_kwargs(arch: str, vocab_size: int) -> tuple[str, dict[str, Any]]:
    """(transformers config class name, its arguments) for a tiny `arch` classifier."""
    # initializer_range 0.2 (10x the usual): at 0.02 a random 2-layer encoder gives every text the same
    # logits to 2 decimals, and parity agreement would then hold for a variant that ignored its input.
    common = {
        "vocab_size": vocab_size,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "max_position_embeddings": MAX_POSITIONS,
        "pad_token_id": 0,
        "initializer_range": 0.2,
    }
    if arch == "distilbert":
        return "DistilBertConfig", {
            "vocab_size": vocab_size,
            "dim": 32,
            "n_layers": 2,
            "n_heads": 2,
            "hidden_dim": 64,
            "max_position_embeddings": MAX_POSITIONS,
            "pad_token_id": 0,
            "initializer_range": 0.2,
        }
    if arch == "bert":
        return "BertConfig", common
    if arch in ("roberta", "xlm-roberta"):
        # Positions start after padding_idx (= pad_token_id): room for MAX_POSITIONS tokens after it.
        name = "RobertaConfig" if arch == "roberta" else "XLMRobertaConfig"
        return name, {**common, "max_position_embeddings": MAX_POSITIONS + 2, "type_vocab_size": 1}
    if arch == "deberta-v2":
        # DeBERTa-v3's layout: relative attention with log buckets, no absolute positions, no segment ids.
        return "DebertaV2Config", {
            **common,
            "relative_attention": True,
            "pos_att_type": ["p2c", "c2p"],
            "position_biased_input": False,
            "position_buckets": 32,
            "max_relative_positions": -1,
            "norm_rel_ebd": "layer_norm",
            "share_att_key": True,
            "type_vocab_size": 0,
        }
    if arch == "electra":
        return "ElectraConfig", {**common, "embedding_size": 16}
    if arch == "albert":
        return "AlbertConfig", {**common, "embedding_size": 16, "num_hidden_groups": 1, "hidden_act": "gelu_new"}
    if arch == "modernbert":
        # head dim 32 for the rotary embedding; every other layer global, local window 64.
        return "ModernBertConfig", {
            **common,
            "hidden_size": 64,
            "intermediate_size": 96,
            "local_attention": 64,
            "global_attn_every_n_layers": 2,
            "cls_token_id": 101,
            "sep_token_id": 102,
            "bos_token_id": 101,
            "eos_token_id": 102,
            "reference_compile": False,
            "classifier_bias": True,
        }
    raise ValueError(f"unknown architecture {arch!r}; known: {', '.join(ARCHS)}")


def build(arch: str, out: Path, seed: int = 0) -> Path:
    """Write a tiny random `arch` sequence classifier + the embedded tokenizer to `out` (save_pretrained)."""
    import torch
    import transformers
    from transformers import AutoModelForSequenceClassification

    from qserve.modeling import default_tokenizer

    torch.manual_seed(seed)
    tok = default_tokenizer()
    cls_name, kwargs = config_kwargs(arch, tok.vocab_size)
    cfg = getattr(transformers, cls_name)(
        **kwargs,
        num_labels=len(LABELS),
        id2label=dict(enumerate(LABELS)),
        label2id={n: i for i, n in enumerate(LABELS)},
    )
    model = AutoModelForSequenceClassification.from_config(cfg).eval()
    # Centre the output bias on the parity probes, so that their predicted classes differ (a random
    # encoder leans one way for every text) and probe agreement can tell a wrong variant from a right one.
    from exporters.core import PROBES
    from qserve.modeling import model_inputs

    enc = tok(PROBES, truncation=True, max_length=64, padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**{k: enc[k] for k in model_inputs(model)}).logits
        # The output layer by its shape: transformers 5 registers XLM-RoBERTa's head before its encoder.
        head = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m.out_features == len(LABELS)][-1]
        head.bias.sub_(logits.mean(dim=0))
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out
