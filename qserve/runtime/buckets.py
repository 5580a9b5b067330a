"""Length buckets: how a variant that needs fixed shapes (ov-int8) runs a batch without padding it to max_length.

    python -c "from qserve.runtime.buckets import resolve, plan; b = resolve('auto', 128, True); \\
print(b, plan([9, 40, 12, 128], b, None))"

A text runs padded to the smallest bucket that holds it, picked by its own token count alone, so batchmates never move
its answer; one forward per bucket (`max_batch_tokens` caps bucket x rows). Batch-invariant variants get no buckets.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from qserve import QserveError

AUTO, OFF = "auto", "off"
MIN_AUTO_BUCKET = 32
FLAG = "--length-buckets"


def parse(spec: str | Sequence[int] | None) -> str | tuple[int, ...]:
    """'auto' | 'off' | '32,64,128' (or a sequence of ints) -> AUTO, OFF or sorted distinct buckets."""
    if spec is None:
        return AUTO
    if isinstance(spec, str):
        text = spec.strip().lower()
        if text in (AUTO, OFF, "none"):
            return OFF if text == "none" else text
        try:
            values = [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            values = []
    else:
        values = [v for v in spec if isinstance(v, int) and not isinstance(v, bool)]
        if len(values) != len(spec):
            values = []
    if not values or any(v < 2 for v in values):
        raise QserveError(
            f"{FLAG} must be auto, off, or comma-separated token lengths >= 2 such as 32,64,128 (got {spec!r})"
        )
    return tuple(sorted(set(values)))


def auto_buckets(max_length: int, first: int = MIN_AUTO_BUCKET) -> tuple[int, ...]:
    """`first` (32) doubled while below max_length, then max_length itself: 128 -> (32, 64, 128)."""
    out, b = [], first
    while b < max_length:
        out.append(b)
        b *= 2
    return (*out, max_length)


def resolve(spec: str | Sequence[int] | None, max_length: int, fixed_shapes: bool) -> tuple[int, ...] | None:
    """The buckets a variant runs with, or None (it runs unpadded: buckets do not apply).

    fixed_shapes: whether the variant pads every text to a length that depends on the text alone.
    For such a variant `off` is one bucket, max_length (every text at max_length, as before buckets);
    a list is clipped to max_length, which is always added so that every (truncated) text fits."""
    parsed = parse(spec)
    if not fixed_shapes:
        return None
    if parsed == OFF:
        return (max_length,)
    if parsed == AUTO:
        return auto_buckets(max_length)
    assert not isinstance(parsed, str)  # parse() answers OFF, AUTO or the lengths
    return tuple(sorted({b for b in parsed if b < max_length} | {max_length}))


def bucket_for(length: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds `length` tokens (a text longer than every bucket runs at its own length)."""
    for b in buckets:
        if length <= b:
            return b
    return int(length)


def plan(lengths: Sequence[int], buckets: Sequence[int], max_batch_tokens: int | None) -> list[tuple[int, list[int]]]:
    """[(bucket, row indices)]: one forward per bucket, in bucket order, each at most max_batch_tokens // bucket
    rows (at least one)."""
    groups: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        groups.setdefault(bucket_for(int(n), buckets), []).append(i)
    out = []
    for b in sorted(groups):
        rows = groups[b]
        step = max(1, max_batch_tokens // b) if max_batch_tokens else len(rows)
        out += [(b, rows[i : i + step]) for i in range(0, len(rows), step)]
    return out


def fit_rows(batch: dict[str, np.ndarray], rows: Sequence[int], length: int, pad_id: int) -> dict[str, np.ndarray]:
    """The given rows as they tokenize alone (attention-masked tokens only), right-padded to `length` as the
    tokenizer pads: input_ids with pad_id, every other input with 0."""
    mask = batch["attention_mask"]
    picked = mask[list(rows)]
    kept = picked.sum(axis=1)
    width = min(mask.shape[1], length)
    # Right-padded rows (how the tokenizer and longtext.pad pad them): their tokens are a prefix, so the block is
    # column slices, the positions past each row's length set to the padding value; the same block as the
    # row-by-row copy, without a Python loop over rows (a CUDA graph's replay is shorter than that loop).
    prefix = bool((picked[:, :width] == (np.arange(width) < kept[:, None])).all()) and bool((kept <= width).all())
    past = np.arange(length) >= kept[:, None]
    out = {}
    for name, arr in batch.items():
        value = pad_id if name == "input_ids" else 0
        block = np.full((len(rows), length), value, dtype=arr.dtype)
        if prefix:
            block[:, :width] = arr[list(rows), :width]
            block[past] = value
        else:
            for j, i in enumerate(rows):
                tokens = arr[i][mask[i].astype(bool)]
                block[j, : len(tokens)] = tokens
        out[name] = block
    return out
