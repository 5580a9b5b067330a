"""Text pairs (NLI, cross-encoders, rerankers): the tokenizer's own pair encoding, in every stage.

    python -c "from qserve.modeling import default_tokenizer as t; from qserve.textpairs import split_pairs; \\
print(split_pairs(t(), ['a cat sat'], ['a dog ran'], 16).types)"

Each pair is encoded on its own as `tokenizer(text, text_pair)` does, truncated longest_first and never windowed (every
long-text policy falls back to that); a model takes pairs when its `inputs` say so (docs/long-texts.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from qserve import QserveError
from qserve.longtext import Pieces

TEXT = "text"
TEXT_PAIR = "text_pair"
SINGLE = (TEXT,)
PAIR = (TEXT, TEXT_PAIR)
ALLOWED = (SINGLE, PAIR)

# Parity probes for a pair model: premise/hypothesis-like pairs, short and long, so that both the untruncated
# path and the tokenizer's longest_first truncation (the long one, past 128 tokens) are exercised.
PROBE_PAIRS = [
    ("A man is playing a guitar on stage.", "Someone is performing music."),
    ("A man is playing a guitar on stage.", "The stage is empty."),
    ("The film won three awards.", "The film was a commercial failure."),
    ("ok", "fine"),
    (
        "The cinematography is gorgeous but the script is lazy and the ending is predictable. " * 12,
        "The reviewer liked the pictures.",
    ),
    ("Two dogs run through the snow.", "Animals are outside. " * 40),
    ("She bought a red car yesterday.", "She owns a car."),
    ("Worst movie of the year. Avoid.", "The reviewer recommends the movie."),
]


class PairError(QserveError):
    """A pair where a model takes one text, or a recorded `inputs` that is neither allowed form."""


def split_pairs(tokenizer: Any, texts: Sequence[str], pairs: Sequence[str], max_length: int) -> Pieces:
    """One piece per pair: the ids (and token_type_ids where the tokenizer makes them) that
    `tokenizer(text, text_pair, truncation="longest_first", max_length=max_length)` gives, with each
    pair's full token count and whether truncation hid part of it."""
    texts, pairs = list(texts), list(pairs)
    if len(texts) != len(pairs):
        raise ValueError(f"{len(pairs)} text pairs for {len(texts)} texts")
    segments = "token_type_ids" in getattr(tokenizer, "model_input_names", ())
    kw = dict(add_special_tokens=True, return_attention_mask=False, return_token_type_ids=segments, verbose=False)
    full = tokenizer(texts, pairs, truncation=False, **kw)  # the full lengths; most pairs fit as they are
    ids = [list(r) for r in full["input_ids"]]
    types = [list(r) for r in full["token_type_ids"]] if segments else None
    tokens = [len(r) for r in ids]
    long = [i for i, n in enumerate(tokens) if n > max_length]
    if long:  # only these are cut, by the tokenizer itself (its tie-breaking is the model's training)
        cut = tokenizer(
            [texts[i] for i in long], [pairs[i] for i in long], truncation="longest_first", max_length=max_length, **kw
        )
        for j, i in enumerate(long):
            ids[i] = list(cut["input_ids"][j])
            if types is not None:
                types[i] = list(cut["token_type_ids"][j])
    n = len(texts)
    return Pieces(ids, list(range(n)), tokens, [1] * n, [t > max_length for t in tokens], ["mean"] * n, types)
