"""A variant's tokenizer on the `tokenizers` library alone: what transformers' tokenizer answers, without transformers.

    python -c "from qserve.modeling import default_model_dir; from qserve.tokenization import load_tokenizer; \\
print(load_tokenizer(default_model_dir())(['a cat sat'], ['a dog ran'])['token_type_ids'])"

`Tokenizer` runs tokenizer.json with the tokenizer_config.json settings transformers applies, answering as it does
(tests/integration/test_tokenization.py), so serving needs no transformers. Other dirs: docs/dependencies.md.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from qserve import QserveError
from qserve.extras import TOOLKIT

TOKENIZER_FILE = "tokenizer.json"
NAMED = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
"""transformers' named special tokens, in its order (all_special_tokens lists these first, then the extra ones)."""
DEFAULT_INPUTS = ("input_ids", "attention_mask")
CLASS_INPUTS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(
        (
            "BertTokenizer",
            "ConvBertTokenizer",
            "DPRContextEncoderTokenizer",
            "DPRQuestionEncoderTokenizer",
            "ElectraTokenizer",
            "LayoutLMTokenizer",
            "LxmertTokenizer",
            "MarkupLMTokenizer",
            "MobileBertTokenizer",
            "SqueezeBertTokenizer",
        ),
        ("input_ids", "token_type_ids", "attention_mask"),
    ),
    **dict.fromkeys(
        ("CanineTokenizer", "DebertaTokenizer", "DebertaV2Tokenizer", "LayoutLMv2Tokenizer", "TapasTokenizer"),
        ("input_ids", "attention_mask", "token_type_ids"),
    ),
    "FNetTokenizer": ("input_ids", "token_type_ids"),
    "LayoutLMv3Tokenizer": ("input_ids", "attention_mask", "bbox"),
}
"""The model inputs of the tokenizer classes whose default is not DEFAULT_INPUTS (transformers' class attribute,
used when tokenizer_config.json saves no model_input_names; a test checks the table against transformers)."""
LEFT_PADDED = frozenset(
    {
        "CodeLlamaTokenizer",
        "CohereTokenizer",
        "GemmaTokenizer",
        "LlamaTokenizer",
        "Phi3Tokenizer",
        "Siglip2Tokenizer",
        "XLNetTokenizer",
    }
)
"""The tokenizer classes that pad on the left by default (the rest pad on the right)."""
UNLIMITED = int(1e30)
"""model_max_length when none is saved (transformers' VERY_LARGE_INTEGER): truncation without max_length then cuts
nothing."""
_LARGE = int(1e20)


class TokenizerError(QserveError):
    """A tokenizer directory qserve cannot load (what is missing, and what to install or save)."""


class Tokenizer:
    """A `tokenizers.Tokenizer` with the settings transformers' tokenizer applies around it.

    Not thread-safe (each call sets the backend's truncation and padding): the runtime calls it under its
    tokenizer_lock."""

    def __init__(
        self,
        backend: Any,
        *,
        special_tokens: Sequence[str],
        pad_token: str | None,
        unk_token: str | None,
        model_max_length: int = UNLIMITED,
        padding_side: str = "right",
        truncation_side: str = "right",
        model_input_names: Sequence[str] = DEFAULT_INPUTS,
        pad_token_type_id: int = 0,
        clean_up_tokenization_spaces: bool = False,
    ):
        for name, side in (("padding_side", padding_side), ("truncation_side", truncation_side)):
            if side not in ("right", "left"):
                raise TokenizerError(f"{name} {side!r}: allowed values right, left")
        self.backend = backend
        """The `tokenizers.Tokenizer` (an untyped extension mypy does not follow)."""
        self.all_special_tokens: list[str] = list(dict.fromkeys(special_tokens))
        self.pad_token = pad_token
        self.unk_token = unk_token
        self.model_max_length = int(model_max_length)
        self.padding_side = padding_side
        self.truncation_side = truncation_side
        self.model_input_names: list[str] = list(model_input_names)
        self.pad_token_type_id = int(pad_token_type_id)
        self.clean_up_tokenization_spaces = bool(clean_up_tokenization_spaces)
        self._set: tuple[Any, ...] | None = None  # the truncation and padding the backend holds now

    # -- the vocabulary ------------------------------------------------------------------------------------------

    def convert_tokens_to_ids(self, tokens: Sequence[str]) -> list[int | None]:
        """Each token's id; one the vocabulary lacks is the unknown token's (None where there is none)."""
        unk = self.backend.token_to_id(self.unk_token) if self.unk_token is not None else None
        return [i if (i := self.backend.token_to_id(t)) is not None else unk for t in tokens]

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str | None]:
        """Each id's token (None for an id the vocabulary lacks)."""
        return [self.backend.id_to_token(int(i)) for i in ids]

    @property
    def pad_token_id(self) -> int | None:
        return None if self.pad_token is None else self.convert_tokens_to_ids([self.pad_token])[0]

    @property
    def all_special_ids(self) -> list[int]:
        """The ids of the named special tokens, then the extra ones (TEI's /tokenize marks these)."""
        return [i for i in self.convert_tokens_to_ids(self.all_special_tokens) if i is not None]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Token ids back to text (ids the vocabulary lacks decode to nothing)."""
        text = self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)
        if self.clean_up_tokenization_spaces:  # transformers' clean_up_tokenization, for configs that ask for it
            for a, b in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't")):
                text = text.replace(a, b)
            for a, b in ((" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
                text = text.replace(a, b)
        return text

    # -- encoding ------------------------------------------------------------------------------------------------

    def __call__(
        self,
        text: str | Sequence[str],
        text_pair: str | Sequence[str] | None = None,
        *,
        add_special_tokens: bool = True,
        padding: bool | str = False,
        truncation: bool | str | None = None,
        max_length: int | None = None,
        return_tensors: str | None = None,
        return_token_type_ids: bool | None = None,
        return_attention_mask: bool | None = None,
        return_offsets_mapping: bool = False,
        verbose: bool = True,
    ) -> dict[str, Any]:
        """Encode one text or a batch (with their pairs): what `transformers_tokenizer(...)` answers for the same
        arguments, as a dict. `padding`: False, True / "longest", "max_length"; `truncation`: None, False, True /
        "longest_first" (the longer of a pair loses tokens first); `return_tensors`: None (lists) or "np"
        (int64 arrays). `verbose` is accepted for transformers' signature (nothing here warns)."""
        batched = not isinstance(text, str)
        if batched:
            if isinstance(text_pair, str):
                raise TypeError("a batch of texts needs a batch of text_pair (a list as long as text), not one str")
            if text_pair is not None and len(text) != len(text_pair):
                raise ValueError(f"batch length of text ({len(text)}) and of text_pair ({len(text_pair)}) differ")
            inputs = list(zip(text, text_pair)) if text_pair is not None else list(text)
        self._configure(padding, truncation, max_length)
        if batched:  # offsets cost the batch path time; only TEI's /tokenize asks for them
            encode = self.backend.encode_batch if return_offsets_mapping else self.backend.encode_batch_fast
            encodings = encode(inputs, add_special_tokens=add_special_tokens)
        else:  # one text (an empty pair is no pair, as in transformers): no batch to spread over threads
            encodings = [self.backend.encode(text, text_pair or None, add_special_tokens=add_special_tokens)]
        if return_token_type_ids is None:
            return_token_type_ids = "token_type_ids" in self.model_input_names
        if return_attention_mask is None:
            return_attention_mask = "attention_mask" in self.model_input_names
        out: dict[str, Any] = {"input_ids": [e.ids for e in encodings]}
        if return_token_type_ids:
            out["token_type_ids"] = [e.type_ids for e in encodings]
        if return_attention_mask:
            out["attention_mask"] = [e.attention_mask for e in encodings]
        if return_offsets_mapping:
            out["offset_mapping"] = [e.offsets for e in encodings]
        if return_tensors == "np":
            return {k: np.asarray(v, dtype=np.int64) for k, v in out.items()}
        if return_tensors is not None:
            raise ValueError(f"return_tensors {return_tensors!r}: allowed values None, 'np'")
        return out if batched else {k: v[0] for k, v in out.items()}

    def _configure(self, padding: bool | str, truncation: bool | str | None, max_length: int | None) -> None:
        """Set the backend's truncation and padding for one call, as transformers resolves the same arguments."""
        if max_length is not None and padding is False and truncation is None:
            truncation = "longest_first"  # transformers: a max_length alone truncates
        if padding in (True, "longest"):
            pad = "longest"
        elif padding == "max_length":
            pad = "max_length"
        elif padding in (False, "do_not_pad"):
            pad = None
        else:
            raise ValueError(f"padding {padding!r}: allowed values False, True, 'longest', 'max_length'")
        if truncation in (True, "longest_first"):
            cut = True
        elif truncation in (None, False, "do_not_truncate"):
            cut = False
        else:
            raise ValueError(f"truncation {truncation!r}: allowed values None, False, True, 'longest_first'")
        if max_length is None:
            if pad == "max_length":
                pad, max_length = (None, None) if self.model_max_length > _LARGE else (pad, self.model_max_length)
            if cut:
                cut, max_length = (False, None) if self.model_max_length > _LARGE else (cut, self.model_max_length)
        pad_id = self.pad_token_id
        if pad is not None and (pad_id is None or pad_id < 0):
            raise ValueError("padding asks for a pad token, and this tokenizer has none")
        state = (cut and max_length, pad, max_length if pad == "max_length" else None)
        if state == self._set:
            return
        if cut:
            self.backend.enable_truncation(
                int(max_length or 0), stride=0, strategy="longest_first", direction=self.truncation_side
            )
        else:
            self.backend.no_truncation()
        if pad is None:
            self.backend.no_padding()
        else:
            self.backend.enable_padding(
                direction=self.padding_side,
                pad_id=pad_id,
                pad_type_id=self.pad_token_type_id,
                pad_token=self.pad_token,
                length=state[2],
            )
        self._set = state


def load_tokenizer(path: Path | str) -> Tokenizer:
    """The tokenizer saved in `path` (tokenizer.json + tokenizer_config.json), as transformers would load it.

        python -c "from qserve.modeling import default_model_dir; from qserve.tokenization import load_tokenizer; \\
print(load_tokenizer(default_model_dir()).model_input_names)"
    """
    folder = Path(path)
    config = _read(folder / "tokenizer_config.json")
    name = config.get("tokenizer_class")
    if (folder / TOKENIZER_FILE).is_file() and isinstance(name, str):
        return _from_files(folder, config, name)
    return _from_transformers(folder)


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise TokenizerError(f"{path} is not readable JSON ({e}); save the tokenizer again") from e
    return data if isinstance(data, dict) else {}


def _content(token: Any) -> str | None:
    """A saved token's text: a str, or the dict of an AddedToken (its `content`)."""
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) else None


def _from_files(folder: Path, config: dict[str, Any], name: str) -> Tokenizer:
    """transformers' from_pretrained of a tokenizers-backed class, over tokenizer.json: the special tokens of the
    config (special_tokens_map.json's where the config lists no added_tokens_decoder, as transformers reads it), the
    added tokens it declares and tokenizer.json lacks, and the class's defaults for what the config does not say."""
    from tokenizers import AddedToken
    from tokenizers import Tokenizer as Backend
    from tokenizers.processors import TemplateProcessing

    if "added_tokens_decoder" not in config:  # an older save: the special tokens are in special_tokens_map.json
        for key, value in _read(folder / "special_tokens_map.json").items():
            config[key] = [*(config.get(key) or []), *value] if key == "extra_special_tokens" else value
    backend = Backend.from_file(str(folder / TOKENIZER_FILE))
    named = {key: t for key in NAMED if (t := _content(config.get(key))) is not None}
    padding, truncation = backend.padding or {}, backend.truncation or {}
    if "pad_token" not in named and padding.get("pad_token"):
        named["pad_token"] = padding["pad_token"]
    extra = config.get("extra_special_tokens", config.get("additional_special_tokens")) or []
    if isinstance(extra, dict):  # named extra tokens (a multimodal model's), special like the rest
        extra = list(extra.values())
    # tokens whose key names them (`image_token`, ...) are special tokens of the model too
    extra = [*extra, *(v for k, v in config.items() if k.endswith("_token") and k not in NAMED and _content(v))]
    specials = [*named.values(), *(t for t in map(_content, extra) if t is not None)]

    def props(t: Any) -> tuple[Any, ...]:
        return (t.content, t.special, t.single_word, t.lstrip, t.rstrip, t.normalized)

    have = {props(t) for t in backend.get_added_tokens_decoder().values()}
    declared = config.get("added_tokens_decoder") or {}
    add = [
        token
        for _, spec in sorted(declared.items(), key=lambda kv: int(kv[0]))
        if props(token := AddedToken(**{k: v for k, v in spec.items() if k != "__type"})) not in have
    ]
    known = {t.content for t in backend.get_added_tokens_decoder().values()} | {t.content for t in add}
    add += [AddedToken(t, special=True) for t in dict.fromkeys(specials) if t not in known]
    if add:
        backend.add_tokens(add)
    if backend.post_processor is None:  # transformers' template when the file has none: no special tokens
        backend.post_processor = TemplateProcessing(single="$A:0", pair="$A:0 $B:1", special_tokens=[])
    backend.encode_special_tokens = bool(config.get("split_special_tokens", False))
    cls = name[: -len("Fast")] if name.endswith("Fast") and name != "PreTrainedTokenizerFast" else name
    return Tokenizer(
        backend,
        special_tokens=specials,
        pad_token=named.get("pad_token"),
        unk_token=named.get("unk_token"),
        model_max_length=config.get("model_max_length") or config.get("max_len") or UNLIMITED,
        padding_side=config.get("padding_side")
        or padding.get("direction")
        or ("left" if cls in LEFT_PADDED else "right"),
        truncation_side=config.get("truncation_side") or truncation.get("direction") or "right",
        model_input_names=config.get("model_input_names") or CLASS_INPUTS.get(cls, DEFAULT_INPUTS),
        pad_token_type_id=config.get("pad_token_type_id", padding.get("pad_type_id", 0)),
        clean_up_tokenization_spaces=bool(config.get("clean_up_tokenization_spaces", False)),
    )


def _from_transformers(folder: Path) -> Tokenizer:
    """A tokenizer only transformers can build (no tokenizer.json, or no class named): its class's `tokenizers`
    pipeline and settings."""
    try:
        import transformers
    except ImportError as e:
        raise TokenizerError(
            f"{folder} has no {TOKENIZER_FILE} with a tokenizer_class in tokenizer_config.json, so only transformers "
            f"can build its tokenizer, and transformers is not installed here; install it with: {TOOLKIT} "
            "(or save the tokenizer with transformers' save_pretrained, which writes both)"
        ) from e
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    backend = getattr(hf, "backend_tokenizer", None)
    if backend is None:
        raise TokenizerError(
            f"{folder}: {type(hf).__name__} runs in Python, not on the tokenizers library; qserve serves "
            "tokenizers-backed tokenizers (a tokenizer.json)"
        )
    return Tokenizer(
        backend,
        special_tokens=list(hf.all_special_tokens),
        pad_token=None if hf.pad_token is None else str(hf.pad_token),
        unk_token=None if hf.unk_token is None else str(hf.unk_token),
        model_max_length=hf.model_max_length,
        padding_side=hf.padding_side,
        truncation_side=hf.truncation_side,
        model_input_names=hf.model_input_names,
        pad_token_type_id=hf.pad_token_type_id,
        clean_up_tokenization_spaces=bool(getattr(hf, "clean_up_tokenization_spaces", False)),
    )
