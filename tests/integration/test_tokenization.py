"""qserve's tokenizer (qserve/tokenization.py) answers as transformers' own tokenizer does, without importing it.

    python -m pytest tests/integration/test_tokenization.py -q

The same calls on the same texts through both, on the embedded default's tokenizer, a checkpoint's as
save_pretrained writes it (tests/conftest.py), that one under another class name and with the input names training
records, a byte-level BPE tokenizer in RoBERTa's layout that pads on the left and a Unigram one in XLM-R's (made here
with the tokenizers library), and the two a transformers install builds (no tokenizer.json; no class named): the
same ids, attention masks, token type ids and offsets, whole dicts compared. Then: loading and tokenizing import no
transformers, and without transformers a directory only it can read is refused naming the extra that installs it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip(
    "transformers", reason="the reference is transformers' own tokenizer (pip install 'qserve[toolkit]')"
)

TEXTS = [
    "",
    "hello world",
    "Café naïve résumé, Ærøskøbing — “quoted” 😀🎬 emoji",
    "a [PAD] b [SEP] c <s> d </s> e <pad>",  # special tokens written in the text
    "the film was long and the ending predictable. " * 120,  # past every max_length used here
    "x",
    "日本語のテキストと中文",
    "don't , stop . ok ? it 's fine !",
    "  spaces\tand\nnewlines  ",
]
PAIRS = ["a pair", "", "the other side of a long pair " * 60, "b", "c", "ünïcödé", "e", "f", "g"]
CALLS = [
    {},
    {"add_special_tokens": False},
    {"truncation": True, "max_length": 16},
    {"truncation": "longest_first", "max_length": 9},
    {"max_length": 20},  # a max_length alone truncates, in transformers
    {"truncation": True},  # to model_max_length (or none: a tokenizer without one)
    {"padding": True},
    {"padding": "longest", "truncation": True, "max_length": 64, "return_tensors": "np"},
    {"padding": "max_length", "truncation": True, "max_length": 40},
    {"add_special_tokens": False, "truncation": False, "return_attention_mask": False, "return_token_type_ids": False},
    {"return_token_type_ids": True, "padding": True},
    {"return_offsets_mapping": True},
    {"return_offsets_mapping": True, "add_special_tokens": False, "truncation": False},
]


def _byte_level_bpe(out: Path) -> Path:
    """A RoBERTa-layout tokenizer (byte-level BPE, <s> a </s></s> b </s>, pad id 1) trained here, padding on the left,
    model_max_length 64."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import RobertaTokenizer

    corpus = [*TEXTS[1:4], *TEXTS[5:], "the movie was great and the actors were fine"] * 20
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    bpe.train_from_iterator(
        corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=specials, initial_alphabet=alphabet)
    )
    model = json.loads(bpe.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    RobertaTokenizer(vocab=model["vocab"], merges=merges, padding_side="left", model_max_length=64).save_pretrained(out)
    return out


def _unigram(out: Path) -> Path:
    """An XLM-R-layout tokenizer (Unigram over Metaspace) trained here, with no model_max_length."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import XLMRobertaTokenizer

    uni = Tokenizer(models.Unigram())
    uni.pre_tokenizer = pre_tokenizers.Metaspace()
    trainer = trainers.UnigramTrainer(
        vocab_size=120, special_tokens=["<s>", "<pad>", "</s>", "<unk>"], unk_token="<unk>"
    )
    uni.train_from_iterator([*TEXTS, "the movie was great"] * 20, trainer)
    vocab = [tuple(v) for v in json.loads(uni.to_str())["model"]["vocab"]] + [("<mask>", 0.0)]
    XLMRobertaTokenizer(vocab=vocab).save_pretrained(out)
    return out


def _edited(src: Path, out: Path, **config) -> Path:
    """`src` with tokenizer_config.json's keys set (None: removed)."""
    shutil.copytree(src, out)
    path = out / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    for k, v in config.items():
        cfg.pop(k, None) if v is None else cfg.__setitem__(k, v)
    path.write_text(json.dumps(cfg))
    return out


@pytest.fixture(scope="module")
def tokenizer_dirs(tiny_checkpoint, tmp_path_factory) -> dict[str, Path]:
    from qserve.modeling import default_model_dir

    root = tmp_path_factory.mktemp("tokenizers")
    vocab_only = root / "vocab-only"  # a slow-only save: vocab.txt, no tokenizer.json
    vocab_only.mkdir()
    shutil.copy(default_model_dir() / "vocab.txt", vocab_only)
    shutil.copy(default_model_dir() / "tokenizer_config.json", vocab_only)
    return {
        "embedded": default_model_dir(),
        "checkpoint": tiny_checkpoint,
        "distilbert-class": _edited(tiny_checkpoint, root / "distilbert", tokenizer_class="DistilBertTokenizerFast"),
        "trained-inputs": _edited(tiny_checkpoint, root / "inputs", model_input_names=["input_ids", "attention_mask"]),
        "roberta-bpe-left": _byte_level_bpe(root / "roberta"),
        "xlmr-unigram": _unigram(root / "xlmr"),
        "no-class": _edited(tiny_checkpoint, root / "no-class", tokenizer_class=None),
        "vocab-only": vocab_only,
    }


def _plain(enc) -> dict:
    """An encoding's dict with offsets as lists of pairs (transformers gives tuples) and arrays kept as arrays."""
    out = {}
    for k, v in dict(enc).items():
        if isinstance(v, np.ndarray):
            out[k] = (v.dtype, v.shape, v.tolist())
        elif k == "offset_mapping":
            out[k] = [[list(p) for p in row] for row in v] if v and isinstance(v[0], list) else [list(p) for p in v]
        else:
            out[k] = v
    return out


@pytest.mark.parametrize(
    "name",
    [
        "embedded",
        "checkpoint",
        "distilbert-class",
        "trained-inputs",
        "roberta-bpe-left",
        "xlmr-unigram",
        "no-class",
        "vocab-only",
    ],
)
def test_same_encodings_as_transformers(tokenizer_dirs, name):
    from transformers import AutoTokenizer

    from qserve.tokenization import load_tokenizer

    folder = tokenizer_dirs[name]
    ours, theirs = load_tokenizer(folder), AutoTokenizer.from_pretrained(str(folder))
    for attr in ("model_input_names", "padding_side", "truncation_side", "model_max_length", "pad_token_id"):
        assert getattr(ours, attr) == getattr(theirs, attr), (name, attr)
    assert ours.all_special_tokens == theirs.all_special_tokens and ours.all_special_ids == theirs.all_special_ids
    for kw in CALLS:
        for args in ((TEXTS,), (TEXTS, PAIRS)):
            assert _plain(ours(*args, **kw)) == _plain(theirs(*args, **kw)), (name, kw, len(args))
        for text, pair in zip(TEXTS, PAIRS):
            assert _plain(ours(text, **kw)) == _plain(theirs(text, **kw)), (name, kw, text[:20])
            assert _plain(ours(text, pair, **kw)) == _plain(theirs(text, pair, **kw)), (name, kw, text[:20])
    # what TEI's /tokenize and /decode use: the ids' tokens and the text back, unknown ids included
    for row in [*theirs(TEXTS)["input_ids"], [0, 1, 10**9, 5]]:
        assert ours.convert_ids_to_tokens(row) == theirs.convert_ids_to_tokens(row), name
        for skip in (False, True):
            assert ours.decode(row, skip_special_tokens=skip) == theirs.decode(row, skip_special_tokens=skip), name


def test_the_default_and_a_checkpoint_make_segment_ids_and_the_trained_inputs_do_not(tokenizer_dirs):
    """The settings a runtime reads (qserve/runtime/base.py: segments, pad id, padding side) come from the files."""
    from qserve.tokenization import load_tokenizer

    assert "token_type_ids" in load_tokenizer(tokenizer_dirs["embedded"]).model_input_names
    assert "token_type_ids" not in load_tokenizer(tokenizer_dirs["distilbert-class"]).model_input_names
    assert "token_type_ids" not in load_tokenizer(tokenizer_dirs["trained-inputs"]).model_input_names
    bpe = load_tokenizer(tokenizer_dirs["roberta-bpe-left"])
    assert (bpe.padding_side, bpe.pad_token_id, bpe.model_max_length) == ("left", 1, 64)


def test_the_class_defaults_are_transformers(tokenizer_dirs):
    """CLASS_INPUTS and LEFT_PADDED (the defaults of a config that saves neither) agree with every tokenizer class
    transformers names, its aliases included."""
    import transformers
    from transformers.convert_slow_tokenizer import SLOW_TO_FAST_CONVERTERS
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES

    from qserve.tokenization import CLASS_INPUTS, DEFAULT_INPUTS, LEFT_PADDED

    names = set(SLOW_TO_FAST_CONVERTERS) | {n for n in dir(transformers) if n.endswith(("Tokenizer", "TokenizerFast"))}
    for value in TOKENIZER_MAPPING_NAMES.values():
        names.update(v for v in (value if isinstance(value, (list, tuple)) else [value]) if v)
    checked, wrong = 0, []
    for name in sorted(names | set(CLASS_INPUTS) | LEFT_PADDED):
        cls_name = name[: -len("Fast")] if name.endswith("Fast") and name != "PreTrainedTokenizerFast" else name
        try:
            cls = getattr(transformers, cls_name)
            inputs, side = tuple(cls.model_input_names), cls.padding_side
        except Exception:  # noqa: BLE001 - a class needing sentencepiece, or a name that is not a tokenizer class
            continue
        checked += 1
        if CLASS_INPUTS.get(cls_name, DEFAULT_INPUTS) != inputs or (cls_name in LEFT_PADDED) != (side == "left"):
            wrong.append((cls_name, inputs, side))
    assert checked > 50 and not wrong, wrong


def _run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_loading_and_tokenizing_import_no_transformers(tokenizer_dirs):
    out = _run(
        "import sys; from qserve.tokenization import load_tokenizer; "
        f"t = load_tokenizer({str(tokenizer_dirs['checkpoint'])!r}); "
        "t(['a text', 'another'], ['a pair', 'b'], truncation=True, max_length=8, padding=True, return_tensors='np'); "
        "t('x', return_offsets_mapping=True); t.decode([101, 2000, 102]); "
        "print(sorted(m for m in ('transformers', 'torch') if m in sys.modules))"
    )
    assert out == "[]", out


def test_without_transformers_a_dir_only_it_reads_names_the_extra(tokenizer_dirs):
    """A serving install (no transformers) loads a tokenizer.json dir and refuses a slow-only one, naming the extra."""
    code = (
        "import sys; sys.modules['transformers'] = None\n"  # what `import transformers` meets where it is absent
        "from qserve.tokenization import TokenizerError, load_tokenizer\n"
        f"print(load_tokenizer({str(tokenizer_dirs['checkpoint'])!r})('ok')['input_ids'])\n"
        f"try:\n    load_tokenizer({str(tokenizer_dirs['vocab-only'])!r})\n"
        "except TokenizerError as e:\n    print(e)\n"
    )
    ids, message = _run(code).splitlines()
    assert ids == "[101, 7929, 102]"
    assert "vocab-only" in message and "transformers is not installed" in message
    assert "pip install 'qserve[toolkit]'" in message


@pytest.fixture(scope="module")
def onnx_variant(tiny_checkpoint, tmp_path_factory) -> Path:
    import exporters

    out = tmp_path_factory.mktemp("onnx") / "onnx-fp32"
    exporters.export(tiny_checkpoint, "onnx-fp32", out)
    return out


def test_an_onnx_variant_serves_without_transformers_as_with_it(onnx_variant):
    """What a serving install runs (transformers and torch unimportable): the runtime's padded batch, its scores
    and TEI's /tokenize answer are transformers' tokenizer's, and this process's (which has transformers)."""
    from transformers import AutoTokenizer

    from qserve.runtime import load_runtime
    from qserve.serve.protocols.tei import _tokenize

    code = (
        "import sys, json; sys.modules['transformers'] = None; sys.modules['torch'] = None\n"
        "from qserve.runtime import load_runtime\n"
        "from qserve.serve.protocols.tei import _tokenize\n"
        f"rt = load_runtime({str(onnx_variant)!r}, 'cpu'); texts = json.loads(sys.stdin.read())\n"
        "batch = rt.tokenize(texts)\n"
        "print(json.dumps({'batch': {k: v.tolist() for k, v in batch.items()},"
        " 'probs': rt.classify(texts).probs.tolist(), 'tei': _tokenize(rt.tokenizer, texts, True)}))\n"
    )
    served = json.loads(
        subprocess.run(
            [sys.executable, "-c", code], input=json.dumps(TEXTS), capture_output=True, text=True, check=True
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    reference = AutoTokenizer.from_pretrained(str(onnx_variant))
    rt = load_runtime(onnx_variant, "cpu")
    hf = reference(TEXTS, truncation=True, max_length=rt.max_length, padding=True, return_tensors="np")
    assert served["batch"] == {k: hf[k].tolist() for k in served["batch"]}  # head: the tokenizer's own cut
    assert np.allclose(served["probs"], rt.classify(TEXTS).probs, atol=1e-6, rtol=0)
    assert served["tei"] == _tokenize(reference, TEXTS, True)


def test_a_checkpoint_without_tokenizer_json_exports_a_variant_with_one(tiny_checkpoint, tmp_path):
    """A checkpoint saved with a slow-only tokenizer (vocab.txt, no tokenizer.json) exports a variant that has one,
    which loads without transformers and encodes as the checkpoint's tokenizer does."""
    from transformers import AutoTokenizer

    import exporters
    from qserve.modeling import default_model_dir

    slow = tmp_path / "slow"
    shutil.copytree(tiny_checkpoint, slow)
    (slow / "tokenizer.json").unlink()
    shutil.copy(default_model_dir() / "vocab.txt", slow)
    variant = tmp_path / "torch-fp32"
    exporters.export(slow, "torch-fp32", variant)
    assert (variant / "tokenizer.json").is_file()
    code = (
        "import sys, json; sys.modules['transformers'] = None\n"
        "from qserve.tokenization import load_tokenizer\n"
        f"t = load_tokenizer({str(variant)!r}); texts = json.loads(sys.stdin.read())\n"
        "print(json.dumps(t(texts, texts[::-1], truncation=True, max_length=32)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], input=json.dumps(TEXTS), capture_output=True, text=True, check=True
    )
    reference = AutoTokenizer.from_pretrained(str(slow))
    assert json.loads(out.stdout.strip().splitlines()[-1]) == dict(
        reference(TEXTS, TEXTS[::-1], truncation=True, max_length=32)
    )
