"""The long-text policy: which tokens of a text longer than max_length the model reads.

    python -c "from qserve.longtext import parse; print(parse('windows').resolve(128))"   # windows:128:96:mean

head, tail, head-tail:H, windows:W:S:AGG (docs/long-texts.md); shorthands resolve against a max_length, and what is
recorded is the written-out form. No heavy imports (numpy only inside the two array builders), so the CLI, the
artifact checks and the server's request validation use it freely.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from qserve import QserveError

KINDS = ("head", "tail", "head-tail", "windows")
TRAINING_KINDS = ("head", "tail", "head-tail")
AGGREGATIONS = ("mean", "max")
FORMS = "head, tail, head-tail[:H], windows[:W[:S[:mean|max]]]"
DEFAULT = "head"
"""The policy of a checkpoint or variant that records none: what qserve always did."""
TRAIN_DEFAULT = "head-tail"
"""`qserve train --long-text` default, chosen on validation accuracy (never test) with the pipeline's recipe
(docs/long-texts.md)."""
MAX_WINDOWS = 8
"""Default cap on the windows of one text (--max-windows)."""
DEFAULT_STRIDE_FRACTION = (3, 4)  # windows: stride = 3/4 of the window (measured: docs/long-texts.md)


NUMBER = "[1-9][0-9]{0,8}"
"""A policy's integers: positive, no leading zeros, at most 9 digits."""
_NUMBER = re.compile(NUMBER)


class LongTextError(QserveError):
    """A policy string that is not one of the allowed forms, or does not fit the model."""


def _bad(text: Any, why: str, flag: str) -> LongTextError:
    return LongTextError(
        f"{flag} {text!r}: {why}; allowed forms: {FORMS} (H, W, S integers: model tokens "
        "including the special tokens; S text tokens)"
    )


@dataclass(frozen=True)
class LongTextPolicy:
    """A parsed policy. Fields left None are shorthands that `resolve(max_length)` fills in."""

    kind: str = DEFAULT
    head: int | None = None
    """head-tail: tokens from the start (including the leading special tokens)."""
    window: int | None = None
    """windows: tokens per window (including the special tokens); None = max_length."""
    stride: int | None = None
    """windows: text tokens between the starts of consecutive windows; None = 3/4 of the window."""
    agg: str | None = None
    """windows: how the windows' logits become the text's: mean or max (None = mean)."""

    def __str__(self) -> str:
        if self.kind == "head-tail":
            return "head-tail" if self.head is None else f"head-tail:{self.head}"
        if self.kind == "windows":
            parts = [self.window, self.stride, self.agg]
            while parts and parts[-1] is None:
                parts.pop()
            return ":".join(["windows", *("" if p is None else str(p) for p in parts)])
        return self.kind

    @property
    def resolved(self) -> bool:
        if self.kind == "head-tail":
            return self.head is not None
        if self.kind == "windows":
            return None not in (self.window, self.stride, self.agg)
        return True

    def resolve(self, max_length: int, flag: str = "long_text") -> LongTextPolicy:
        """The written-out policy for a model that reads `max_length` tokens; refuses what cannot fit."""
        if self.kind == "head-tail":
            head = max_length // 2 if self.head is None else self.head
            if not 1 <= head < max_length:
                raise _bad(str(self), f"H must be 1..{max_length - 1} (the model reads {max_length} tokens)", flag)
            return LongTextPolicy("head-tail", head=head)
        if self.kind == "windows":
            window = max_length if self.window is None else self.window
            if not 3 <= window <= max_length:
                raise _bad(str(self), f"W must be 3..{max_length} (the model reads {max_length} tokens)", flag)
            num, den = DEFAULT_STRIDE_FRACTION
            # S may exceed the window: the tokens between windows are then unseen, and the text truncated
            stride = max(1, window * num // den) if self.stride is None else self.stride
            return LongTextPolicy("windows", window=window, stride=stride, agg=self.agg or "mean")
        return self

    @property
    def trainable(self) -> bool:
        return self.kind in TRAINING_KINDS


def parse(text: str | LongTextPolicy | None, flag: str = "long_text") -> LongTextPolicy:
    """'head' / 'tail' / 'head-tail[:H]' / 'windows[:W[:S[:AGG]]]' -> LongTextPolicy (None -> head).

    Errors name `flag` (the CLI flag or request field the string came from) and the allowed forms."""
    if text is None:
        return LongTextPolicy()
    if isinstance(text, LongTextPolicy):
        return text
    if not isinstance(text, str):
        raise _bad(text, f"must be a string, got {type(text).__name__}", flag)
    parts = text.split(":")
    kind, args = parts[0], parts[1:]
    if kind not in KINDS:
        raise _bad(text, f"unknown policy {kind!r}", flag)

    def integer(s: str, name: str) -> int:
        if not _NUMBER.fullmatch(s):
            raise _bad(text, f"{name} must be a positive integer of at most 9 digits, got {s!r}", flag)
        return int(s)

    if kind in ("head", "tail"):
        if args:
            raise _bad(text, f"{kind} takes no parameters", flag)
        return LongTextPolicy(kind)
    if kind == "head-tail":
        if len(args) > 1:
            raise _bad(text, "head-tail takes one parameter, H", flag)
        return LongTextPolicy(kind, head=integer(args[0], "H") if args else None)
    if len(args) > 3:
        raise _bad(text, "windows takes at most W, S and AGG", flag)
    window = integer(args[0], "W") if len(args) > 0 and args[0] != "" else None
    stride = integer(args[1], "S") if len(args) > 1 and args[1] != "" else None
    agg = args[2] if len(args) > 2 else None
    if agg is not None and agg not in AGGREGATIONS:
        raise _bad(text, f"AGG must be one of {', '.join(AGGREGATIONS)}, got {agg!r}", flag)
    return LongTextPolicy(kind, window=window, stride=stride, agg=agg)


def pattern(max_length: int | None = None) -> str:
    """A regular expression (Python re and ECMA-262 alike) matching exactly the policy strings parse()
    accepts, and with `max_length` exactly those resolve(.., max_length) accepts: what the server
    publishes in its OpenAPI schema."""
    h = w = NUMBER
    if max_length is not None:
        h, w = int_range_pattern(1, max_length - 1), int_range_pattern(3, max_length)
    agg = "|".join(AGGREGATIONS)
    return f"^(?:head|tail|head-tail(?::(?:{h}))?|windows(?::(?:{w})?(?::(?:{NUMBER})?(?::(?:{agg}))?)?)?)$"


def int_range_pattern(lo: int, hi: int) -> str:
    """A regex alternation matching exactly the decimal integers lo..hi (1 <= lo, no leading zeros)."""
    parts = []
    while lo <= hi:
        k = 0  # the largest block of 10**k numbers starting at lo that fits
        while lo % 10 ** (k + 1) == 0 and lo + 10 ** (k + 1) - 1 <= hi:
            k += 1
        size, n = 10**k, 1
        while (lo // size) % 10 + n <= 9 and lo + (n + 1) * size - 1 <= hi:
            n += 1
        a, b = str(lo), str(lo + n * size - 1)
        d1, d2 = a[len(a) - k - 1], b[len(b) - k - 1]
        parts.append(a[: len(a) - k - 1] + (d1 if d1 == d2 else f"[{d1}-{d2}]") + ("[0-9]" * k))
        lo += n * size
    return "|".join(parts)


def resolve(text: str | LongTextPolicy | None, max_length: int, flag: str = "long_text") -> LongTextPolicy:
    """parse() then resolve(): the written-out policy, checked against `max_length`."""
    return parse(text, flag).resolve(max_length, flag)


def parse_list(text: str, flag: str) -> list[str]:
    """'head,head-tail,windows' -> ['head', 'head-tail', 'windows'], each checked (bench --long-text)."""
    items = [t.strip() for t in str(text).split(",") if t.strip()]
    if not items:
        raise LongTextError(f"{flag} needs at least one policy; allowed forms: {FORMS}")
    for item in items:
        parse(item, flag)
    return list(dict.fromkeys(items))


# -- cutting token ids into the pieces the model scores ---------------------------------------------


@dataclass(frozen=True)
class Template:
    """How the tokenizer wraps one text's ids in special tokens: prefix + ids + suffix."""

    prefix: tuple[int, ...]
    suffix: tuple[int, ...]

    @property
    def specials(self) -> int:
        return len(self.prefix) + len(self.suffix)

    def wrap(self, ids: Sequence[int]) -> list[int]:
        return [*self.prefix, *ids, *self.suffix]


def template(tokenizer: Any) -> Template:
    """The special tokens `tokenizer` adds around one text, read from what it does to a probe text.

    Read from the tokenizer's own output (not from cls/sep attributes) so any single-text template
    works: BERT's [CLS] x [SEP], RoBERTa's <s> x </s>, a prefix-only or suffix-only one."""
    for probe in ("hello world", "a"):
        body = list(tokenizer(probe, add_special_tokens=False)["input_ids"])
        full = list(tokenizer(probe, add_special_tokens=True)["input_ids"])
        for i in range(len(full) - len(body) + 1):
            if body and full[i : i + len(body)] == body:
                return Template(tuple(full[:i]), tuple(full[i + len(body) :]))
    raise LongTextError(
        f"cannot tell which special tokens {type(tokenizer).__name__} adds around a text "
        "(its ids for a probe text do not contain the text's own ids)"
    )


@dataclass(frozen=True)
class Cut:
    """One text under one policy: its pieces (text ids, without special tokens) and what was seen."""

    pieces: list[list[int]]
    tokens: int
    """The text's token count, special tokens included."""
    truncated: bool
    """Whether some token of the text is in no piece."""


def cut(
    ids: Sequence[int],
    policy: LongTextPolicy,
    max_length: int,
    specials: int,
    prefix: int,
    max_windows: int = MAX_WINDOWS,
) -> Cut:
    """The pieces of one text's ids (no special tokens) under a resolved `policy`.

    `specials` is the number of special tokens a piece gets, `prefix` how many of them lead it."""
    ids = list(ids)
    n, budget = len(ids), max_length - specials
    if budget < 1:
        raise LongTextError(f"max_length {max_length} leaves no room for text beside {specials} special tokens")
    if n <= budget:
        return Cut([ids], n + specials, False)
    kind = policy.kind
    if kind == "head":
        return Cut([ids[:budget]], n + specials, True)
    if kind == "tail":
        return Cut([ids[n - budget :]], n + specials, True)
    if kind == "head-tail":
        h = min(max((policy.head or 0) - prefix, 0), budget)
        return Cut([ids[:h] + ids[n - (budget - h) :]], n + specials, True)
    if kind != "windows" or not policy.resolved:
        raise LongTextError(f"policy {policy} is not resolved; call resolve(max_length) first")
    width = min(int(policy.window or max_length), max_length) - specials
    if width < 1:
        raise LongTextError(
            f"windows of {policy.window} tokens leave no room for text beside {specials} special tokens; use a larger W"
        )
    if n <= width:  # W < max_length and the text fits one window (but not max_length: handled above)
        return Cut([ids], n + specials, False)
    last = n - width
    starts = list(range(0, last, int(policy.stride or width))) + [last]
    if len(starts) > max_windows:
        m = max(1, max_windows)
        starts = [0] if m == 1 else [round(i * last / (m - 1)) for i in range(m)]
    seen = starts[0] == 0 and starts[-1] + width >= n and all(b - a <= width for a, b in zip(starts, starts[1:]))
    return Cut([ids[s : s + width] for s in starts], n + specials, not seen)


@dataclass
class Pieces:
    """N texts cut into M >= N pieces, ready to pad and forward; `owner[j]` is piece j's text."""

    ids: list[list[int]]
    """Each piece with its special tokens."""
    owner: list[int]
    tokens: list[int]
    windows: list[int]
    truncated: list[bool]
    aggs: list[str]
    """Per text: how its pieces' logits combine (one piece: nothing to combine)."""
    types: list[list[int]] | None = None
    """Each piece's token_type_ids, for text pairs (qserve/textpairs.py); None: segment 0 throughout."""


Encoder = Callable[[list[str]], list[list[int]]]


def encoder(tokenizer: Any) -> Encoder:
    """texts -> their ids, tokenized once without truncation and without special tokens."""

    def encode(texts: list[str]) -> list[list[int]]:
        # verbose=False: a text past the model's length is expected here, the policy cuts it next
        return tokenizer(
            list(texts),
            add_special_tokens=False,
            truncation=False,
            verbose=False,
            return_attention_mask=False,
            return_token_type_ids=False,
        )["input_ids"]

    return encode


def split_texts(
    tokenizer: Any,
    texts: list[str],
    policy: str | LongTextPolicy | None,
    max_length: int,
    max_windows: int = MAX_WINDOWS,
) -> Pieces:
    """split() with one policy for every text and the tokenizer's own template (training, export, bench)."""
    p = resolve(policy, max_length)
    return split(encoder(tokenizer), template(tokenizer), list(texts), [p] * len(texts), max_length, max_windows)


def split(
    encode: Encoder,
    tmpl: Template,
    texts: list[str],
    policies: Sequence[LongTextPolicy],
    max_length: int,
    max_windows: int = MAX_WINDOWS,
) -> Pieces:
    """Tokenize `texts` once, without truncation (`encode`: texts -> ids without special tokens), then cut
    each by its own resolved policy and wrap every piece in the tokenizer's special tokens."""
    if len(policies) != len(texts):
        raise ValueError(f"{len(policies)} policies for {len(texts)} texts")
    out = Pieces([], [], [], [], [], [])
    for i, (ids, policy) in enumerate(zip(encode(list(texts)), policies)):
        c = cut(ids, policy, max_length, tmpl.specials, len(tmpl.prefix), max_windows)
        out.ids.extend(tmpl.wrap(p) for p in c.pieces)
        out.owner.extend([i] * len(c.pieces))
        out.tokens.append(c.tokens)
        out.windows.append(len(c.pieces))
        out.truncated.append(c.truncated)
        out.aggs.append(policy.agg or "mean")
    return out


PolicyArg = str | LongTextPolicy | Sequence[str | LongTextPolicy | None] | None
"""A policy for every text, one per text (None = the model's default), or None for the default."""


@dataclass(frozen=True)
class Reader:
    """How one model reads long texts (its template, max_length, the most windows a text gets): a request's policy
    resolved for it, one per text, and texts cut into the pieces it scores. The runtime holds one (runtime/base.py)."""

    template: Template
    max_length: int
    max_windows: int = MAX_WINDOWS

    def resolve(self, policy: str | LongTextPolicy, flag: str = "long_text") -> LongTextPolicy:
        """A policy written out in full for this model; a window with no room for text is refused, naming `flag`."""
        p = resolve(policy, self.max_length, flag)
        if p.kind == "windows" and int(p.window or 0) <= self.template.specials:
            raise LongTextError(
                f"{flag} {policy!s}: a window of {p.window} tokens leaves no room for text "
                f"beside the {self.template.specials} special tokens; allowed forms: {FORMS}"
            )
        return p

    def per_text(self, policy: PolicyArg, n: int, default: LongTextPolicy) -> list[LongTextPolicy]:
        """One resolved policy per text (None: `default`); a batch's few distinct policies are resolved once each."""
        if policy is None or isinstance(policy, (str, LongTextPolicy)):
            return [default if policy is None else self.resolve(policy)] * n
        if len(policy) != n:
            raise ValueError(f"{len(policy)} long-text policies for {n} texts")
        cache: dict[Any, LongTextPolicy] = {}
        out = []
        for p in policy:
            if p not in cache:
                cache[p] = default if p is None else self.resolve(p)
            out.append(cache[p])
        return out

    def split(self, encode: Encoder, texts: list[str], policy: PolicyArg, default: LongTextPolicy) -> Pieces:
        """`texts` cut into the pieces the model scores, each by its own policy (split)."""
        policies = self.per_text(policy, len(texts), default)
        return split(encode, self.template, list(texts), policies, self.max_length, self.max_windows)


def pad(
    rows: list[list[int]],
    pad_id: int,
    side: str = "right",
    segments: bool = False,
    types: list[list[int]] | None = None,
) -> dict[str, Any]:
    """int64 input_ids / attention_mask [len(rows), longest], padded as the tokenizer pads; with `segments`
    (a tokenizer whose model_input_names has token_type_ids: BERT, ALBERT, ELECTRA, DeBERTa) also the
    token_type_ids: each row's `types` (a text pair's segments, Pieces.types), else all 0 (one text)."""
    width = max((len(r) for r in rows), default=0)
    input_ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    for i, r in enumerate(rows):
        sl = slice(width - len(r), width) if side == "left" else slice(0, len(r))
        input_ids[i, sl] = r
        mask[i, sl] = 1
    if segments:
        tt = np.zeros_like(input_ids)
        for i, t in enumerate(types or ()):
            tt[i, slice(width - len(t), width) if side == "left" else slice(0, len(t))] = t
        return {"input_ids": input_ids, "attention_mask": mask, "token_type_ids": tt}
    return {"input_ids": input_ids, "attention_mask": mask}


def aggregate(logits: Any, pieces: Pieces) -> Any:
    """Piece logits [M, k] -> text logits [N, k]: each text's pieces, in order, by its policy's aggregation.

    A text's answer depends on its own pieces only, so it does not move with its batchmates."""
    logits = np.asarray(logits, dtype=np.float32)
    n = len(pieces.windows)
    if len(pieces.owner) == n:  # one piece per text: nothing to combine
        return logits
    out = np.empty((n, logits.shape[1]), dtype=np.float32)
    owner = np.asarray(pieces.owner)
    for i in range(n):
        rows = logits[owner == i]
        out[i] = rows.max(axis=0) if pieces.aggs[i] == "max" else rows.mean(axis=0, dtype=np.float64)
    return out
