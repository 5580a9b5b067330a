"""Length buckets (qserve.runtime.buckets): parsing, auto buckets, per-text bucket, the forward plan, and the
runtime contract that variants without fixed shapes never get buckets.

    python -m pytest tests/integration/test_buckets.py -q
"""

from __future__ import annotations

import numpy as np
import pytest

from qserve import QserveError
from qserve.runtime.buckets import auto_buckets, bucket_for, fit_rows, parse, plan, resolve


def test_parse_accepts_auto_off_and_lists_and_names_the_flag():
    assert parse("auto") == "auto" and parse(None) == "auto" and parse("OFF") == "off" and parse("none") == "off"
    assert parse("128,32, 64,32") == (32, 64, 128) and parse((64, 16)) == (16, 64)
    for bad in ("", "32,x", "1", "0,64", (32, True), "-8"):
        with pytest.raises(QserveError, match="--length-buckets must be auto, off, or comma-separated"):
            parse(bad)


def test_resolve_only_gives_fixed_shape_variants_buckets():
    assert auto_buckets(128) == (32, 64, 128) and auto_buckets(512) == (32, 64, 128, 256, 512)
    assert auto_buckets(20) == (20,) and auto_buckets(64) == (32, 64)
    assert resolve("auto", 128, True) == (32, 64, 128)
    assert resolve("off", 128, True) == (128,)  # every text at max_length: the behaviour before buckets
    assert resolve("16,48,256", 128, True) == (16, 48, 128)  # clipped to max_length, which is always there
    for spec in ("auto", "off", "16,32"):
        assert resolve(spec, 128, False) is None  # unpadded, invariant variants: their answers do not move


def test_a_text_bucket_depends_on_its_own_length_only():
    buckets = (32, 64, 128)
    assert [bucket_for(n, buckets) for n in (1, 32, 33, 64, 65, 128, 300)] == [32, 32, 64, 64, 128, 128, 300]
    lengths = [10, 100, 40, 12, 128, 33]
    assert plan(lengths, buckets, None) == [(32, [0, 3]), (64, [2, 5]), (128, [1, 4])]
    # --max-batch-tokens: bucket x rows per forward; a bucket over the cap still runs, one row at a time
    assert plan(lengths, buckets, 64) == [(32, [0, 3]), (64, [2]), (64, [5]), (128, [1]), (128, [4])]
    assert plan([5] * 5, buckets, 64) == [(32, [0, 1]), (32, [2, 3]), (32, [4])]


def test_fit_rows_keeps_each_row_as_tokenized_alone():
    batch = {
        "input_ids": np.array([[101, 5, 102, 0, 0], [101, 5, 6, 7, 102]]),
        "attention_mask": np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]),
    }
    out = fit_rows(batch, [0], 4, pad_id=0)
    assert out["input_ids"].tolist() == [[101, 5, 102, 0]] and out["attention_mask"].tolist() == [[1, 1, 1, 0]]
    assert out["input_ids"].dtype == batch["input_ids"].dtype


def test_unpadded_variant_ignores_buckets_and_max_batch_tokens_keeps_answers(tiny_variant):
    from qserve.runtime import RuntimeOptions, load_runtime

    texts = ["ok", "a fine film with a slow start and a strong finish " * 3, "bad", "fine " * 40]
    plain = load_runtime(tiny_variant, "cpu", RuntimeOptions(threads=1))
    capped = load_runtime(tiny_variant, "cpu", RuntimeOptions(threads=1, length_buckets="16,32", max_batch_tokens=64))
    assert plain.buckets is None and capped.buckets is None  # torch-fp32 runs unpadded
    calls: list[tuple[int, int]] = []
    forward = capped.forward
    capped.forward = lambda b: calls.append(b["input_ids"].shape) or forward(b)
    assert np.abs(capped.predict(texts) - plain.predict(texts)).max() <= 1e-5
    assert len(calls) > 1 and all(r * s <= 64 or r == 1 for r, s in calls)
    with pytest.raises(QserveError, match="--max-batch-tokens"):
        RuntimeOptions(max_batch_tokens=1)
    with pytest.raises(QserveError, match="--length-buckets"):
        RuntimeOptions(length_buckets="short")


def test_each_text_runs_at_the_same_padded_length_alone_and_in_any_batch(tiny_variant):
    # The structural half of one text, one answer: whatever shares its batch, a text is fed at its own bucket.
    from qserve.loadtest import default_texts
    from qserve.runtime import RuntimeOptions, load_runtime

    rt = load_runtime(tiny_variant, "cpu", RuntimeOptions(threads=1))
    rt.buckets = (16, 32, 64)  # as a fixed-shape variant gets them
    seen: dict[tuple[int, ...], set[int]] = {}
    forward = rt.forward

    def spy(batch):
        for ids, mask in zip(batch["input_ids"], batch["attention_mask"]):
            seen.setdefault(tuple(ids[mask.astype(bool)]), set()).add(ids.shape[0])
        return forward(batch)

    rt.forward = spy
    texts = default_texts(24) + ["fine " * 50]
    alone = np.concatenate([rt.predict([t]) for t in texts])
    mixed = rt.predict(texts[::-1])[::-1]
    assert len(seen) == len(texts) and all(len(widths) == 1 for widths in seen.values())
    assert {w for widths in seen.values() for w in widths} == {16, 32, 64}
    assert np.abs(alone - mixed).max() <= 1e-5


def test_each_window_of_a_long_text_runs_at_its_own_bucket_and_the_text_keeps_one_answer(tiny_variant):
    # Buckets and long texts compose: a windowed text's pieces are rows like any other, each padded to the
    # bucket of its own length; the pieces aggregate back into the text's one answer, whatever shares the batch.
    from qserve.runtime import RuntimeOptions, load_runtime

    rt = load_runtime(tiny_variant, "cpu", RuntimeOptions(threads=1, max_rows=4))
    rt.buckets = (16, 32, 64)
    widths: list[int] = []
    forward = rt.forward
    rt.forward = lambda b: widths.extend([b["input_ids"].shape[1]] * len(b["input_ids"])) or forward(b)
    long = " ".join(f"scene{i % 30} was {'great' if i % 3 else 'dull'}" for i in range(60))
    pieces = rt.split([long], "windows:24:16")
    assert pieces.windows[0] > 2 and {len(p) for p in pieces.ids} == {24}
    alone = rt.classify([long], "windows:24:16")
    assert widths == [32] * len(pieces.ids)  # each window at its own bucket, not at max_length (64)
    widths.clear()
    texts = ["ok", long, "a fine film " * 4, "bad " * 40]
    mixed = rt.classify(texts, ["head", "windows:24:16", "windows", None])
    assert sorted(widths) == sorted(
        bucket_for(len(p), rt.buckets) for p in rt.split(texts, ["head", "windows:24:16", "windows", None]).ids
    ) and {16, 32, 64} <= set(widths)
    assert mixed.windows[1] == alone.windows[0] and mixed.tokens[1] == alone.tokens[0]
    assert np.abs(mixed.probs[1] - alone.probs[0]).max() <= 1e-6
