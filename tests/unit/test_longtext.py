"""The long-text policy: parse/format, resolve, cut, aggregate (no model needed)."""

from __future__ import annotations

import numpy as np
import pytest

from qserve.longtext import (
    FORMS,
    LongTextError,
    LongTextPolicy,
    Pieces,
    aggregate,
    cut,
    pad,
    parse,
    parse_list,
    resolve,
    split,
    template,
)


@pytest.mark.parametrize(
    "text,full",
    [
        ("head", "head"),
        ("tail", "tail"),
        ("head-tail", "head-tail:64"),
        ("head-tail:40", "head-tail:40"),
        ("windows", "windows:128:96:mean"),
        ("windows:64", "windows:64:48:mean"),
        ("windows:64:32", "windows:64:32:mean"),
        ("windows:100:50:max", "windows:100:50:max"),
        ("windows::48", "windows:128:48:mean"),
        ("windows:64:100", "windows:64:100:mean"),
    ],
)
def test_resolve_writes_the_policy_out_in_full_and_round_trips(text, full):
    p = resolve(text, 128)
    assert str(p) == full and p.resolved
    assert resolve(str(p), 128) == p  # the recorded form reads back as itself


@pytest.mark.parametrize(
    "text",
    [
        "",
        "middle",
        "head:3",
        "tail:1",
        "head-tail:x",
        "head-tail:1:2",
        "windows:a",
        "windows:64:32:median",
        "windows:1:2:3:4",
        "head-tail:-3",
        " head",
        "Head",
        "head-tail:064",
        "windows:64:1234567890",
        "head-tail:\u00b2",
    ],
)
def test_a_bad_policy_string_names_the_allowed_forms(text):
    with pytest.raises(LongTextError) as e:
        parse(text, "--long-text")
    assert "--long-text" in str(e.value) and FORMS in str(e.value)


@pytest.mark.parametrize("text", ["head-tail:128", "head-tail:0", "windows:129", "windows:2", "windows:0"])
def test_a_policy_that_does_not_fit_the_model_is_refused(text):
    with pytest.raises(LongTextError, match="allowed forms"):
        resolve(text, 128)


def test_only_windows_is_inference_only():
    assert [parse(p).trainable for p in ("head", "tail", "head-tail", "windows")] == [True, True, True, False]
    assert parse(None) == LongTextPolicy("head")
    assert parse_list("head, head-tail,windows,head", "--long-text") == ["head", "head-tail", "windows"]
    with pytest.raises(LongTextError):
        parse_list("head,nope", "--long-text")


IDS = list(range(1000, 1300))  # 300 text tokens


def test_a_text_that_fits_is_scored_once_unchanged_under_every_policy():
    short = IDS[:126]
    for text in ("head", "tail", "head-tail", "windows", "windows:64:16:max"):
        c = cut(short, resolve(text, 128), 128, specials=2, prefix=1)
        assert c.pieces == [short] and c.tokens == 128 and not c.truncated


def test_head_tail_and_head_tail_cut_as_documented():
    c = cut(IDS, resolve("head", 128), 128, 2, 1)
    assert c.pieces == [IDS[:126]] and c.truncated and c.tokens == 302
    assert cut(IDS, resolve("tail", 128), 128, 2, 1).pieces == [IDS[-126:]]
    # head-tail:H counts model tokens: [CLS] + 63 head tokens, then 63 from the end + [SEP]
    (piece,) = cut(IDS, resolve("head-tail:64", 128), 128, 2, 1).pieces
    assert piece == IDS[:63] + IDS[-63:] and len(piece) == 126


def test_windows_cover_the_text_at_the_stride_the_last_one_ends_at_the_end():
    c = cut(IDS, resolve("windows:64:40", 128), 128, 2, 1)  # 62 text tokens per window
    assert [p[0] for p in c.pieces] == [1000, 1040, 1080, 1120, 1160, 1200, 1238]
    assert all(len(p) == 62 for p in c.pieces) and c.pieces[-1][-1] == IDS[-1] and not c.truncated


def test_a_long_text_gets_at_most_max_windows_spread_over_it_and_is_flagged_truncated():
    ids = list(range(998))  # 1,000 tokens with [CLS] and [SEP]
    c = cut(ids, resolve("windows", 64), 64, 2, 1, max_windows=8)
    assert len(c.pieces) == 8 and c.truncated and c.tokens == 1000
    assert c.pieces[0][0] == 0 and c.pieces[-1][-1] == 997  # the first and the last token are both read
    # capped, but the spread windows still overlap: every token seen, so not truncated
    c = cut(list(range(200)), resolve("windows:64:16", 64), 64, 2, 1, max_windows=4)
    assert len(c.pieces) == 4 and not c.truncated


def test_split_wraps_each_piece_and_aggregate_combines_a_texts_own_pieces():
    from qserve.longtext import Template

    tmpl = Template((101,), (102,))
    texts = ["a", "b", "c"]
    ids = {"a": [5] * 10, "b": list(range(40)), "c": list(range(40))}
    policies = [resolve("windows:12:10", 12), resolve("windows:12:10", 12), resolve("windows:12:10:max", 12)]
    p = split(lambda ts: [ids[t] for t in ts], tmpl, texts, policies, 12)
    assert p.windows == [1, 4, 4] and p.owner == [0, 1, 1, 1, 1, 2, 2, 2, 2] and p.tokens == [12, 42, 42]
    assert all(r[0] == 101 and r[-1] == 102 for r in p.ids) and p.truncated == [False, False, False]
    logits = np.arange(18, dtype=np.float32).reshape(9, 2)
    out = aggregate(logits, p)
    assert out.shape == (3, 2)
    assert np.allclose(out[0], logits[0]) and np.allclose(out[1], logits[1:5].mean(0))
    assert np.allclose(out[2], logits[5:9].max(0))
    batch = pad([[1, 2, 3], [4]], 0)
    assert batch["input_ids"].tolist() == [[1, 2, 3], [4, 0, 0]] and batch["attention_mask"].tolist() == [
        [1, 1, 1],
        [1, 0, 0],
    ]
    # one piece per text: each text's logits are its piece's, untouched
    np.testing.assert_array_equal(
        aggregate(logits[:3], Pieces([], [0, 1, 2], [], [1, 1, 1], [], ["mean"] * 3)), logits[:3]
    )


def test_the_template_is_read_from_the_tokenizer():
    from qserve.modeling import default_tokenizer

    tok = default_tokenizer()
    t = template(tok)
    assert t.prefix == (tok.cls_token_id,) and t.suffix == (tok.sep_token_id,)
    # head under the policy is exactly the tokenizer's own truncation
    text = "a fine film " * 100
    body = tok(text, add_special_tokens=False)["input_ids"]
    (piece,) = cut(body, parse("head"), 64, t.specials, len(t.prefix)).pieces
    assert t.wrap(piece) == tok(text, truncation=True, max_length=64)["input_ids"]


def test_a_stride_past_the_window_leaves_gaps_and_flags_the_text():
    c = cut(IDS, resolve("windows:32:40", 128), 128, 2, 1)
    assert [p[0] for p in c.pieces] == [1000, 1040, 1080, 1120, 1160, 1200, 1240, 1270] and c.truncated


def test_int_range_pattern_matches_exactly_the_range():
    import re

    from qserve.longtext import int_range_pattern

    for lo, hi in [(1, 1), (1, 9), (1, 63), (3, 64), (1, 511), (3, 512), (7, 1000), (95, 2048)]:
        rx = re.compile(f"(?:{int_range_pattern(lo, hi)})")
        assert [n for n in range(0, 2 * hi + 10) if rx.fullmatch(str(n))] == list(range(lo, hi + 1))
        assert not rx.fullmatch("0" + str(lo))


def test_the_published_pattern_accepts_exactly_what_the_server_accepts():
    import itertools
    import re

    from qserve.longtext import pattern

    nums = ["", "0", "1", "2", "3", "31", "32", "33", "63", "64", "65", "999999999", "1000000000", "01", "x"]
    cands = {"head", "tail", "head-tail", "windows", "Head", " tail", "head:1", "windows:"}
    cands |= {f"head-tail:{n}" for n in nums}
    for w, st, agg in itertools.product(nums, nums, ["", "mean", "max", "median"]):
        cands |= {f"windows:{w}", f"windows:{w}:{st}", f"windows:{w}:{st}:{agg}"}
    shape, bounded = re.compile(pattern()), re.compile(pattern(64))

    def ok(fn, c):
        try:
            fn(c)
            return True
        except LongTextError:
            return False

    for c in sorted(cands):
        assert bool(shape.fullmatch(c)) == ok(parse, c), c
        assert bool(bounded.fullmatch(c)) == ok(lambda x: resolve(x, 64), c), c
