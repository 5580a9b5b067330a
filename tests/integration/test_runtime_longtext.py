"""The long-text policy through checkpoint -> export -> manifest -> load_runtime, on the tiny fixtures."""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import replace

import numpy as np
import pytest

from qserve.longtext import FORMS, LongTextError

LONG = " ".join(f"word{i % 50} scene {i}" for i in range(400))  # well past 1,000 tokens


@pytest.fixture(scope="module")
def head_tail_checkpoint(tiny_checkpoint, tmp_path_factory):
    """The tiny checkpoint as `qserve train --long-text head-tail` records it."""
    out = tmp_path_factory.mktemp("ht") / "checkpoint"
    shutil.copytree(tiny_checkpoint, out)
    meta = json.loads((out / "qserve_model.json").read_text())
    (out / "qserve_model.json").write_text(json.dumps({**meta, "long_text": "head-tail:32"}))
    return out


@pytest.fixture(scope="module")
def runtime(tiny_variant):
    from qserve.runtime import RuntimeOptions, load_runtime

    return load_runtime(tiny_variant, "cpu", RuntimeOptions(threads=1))


def test_the_policy_round_trips_through_checkpoint_and_manifest(head_tail_checkpoint, tmp_path):
    import exporters
    from qserve.runtime import load_runtime

    m = exporters.export(head_tail_checkpoint, "torch-fp32", tmp_path / "ht").to_json()
    assert m["long_text"] == "head-tail:32"
    rt = load_runtime(tmp_path / "ht", "cpu")
    assert str(rt.long_text) == "head-tail:32"
    # qserve export --long-text overrides what the checkpoint recorded; the manifest has it in full
    m = exporters.export(head_tail_checkpoint, "torch-fp32", tmp_path / "win", long_text="windows").to_json()
    assert m["long_text"] == "windows:64:48:mean" and m["parity"]["within_tolerance"]
    assert str(load_runtime(tmp_path / "win", "cpu").long_text) == "windows:64:48:mean"


def test_an_old_manifest_without_a_policy_serves_as_head(tiny_variant, tmp_path, runtime):
    from qserve.artifact import read_manifest, write_manifest
    from qserve.runtime import load_runtime

    old = tmp_path / "old"
    shutil.copytree(tiny_variant, old)
    manifest = read_manifest(old)
    assert manifest.long_text == "head"
    write_manifest(old, replace(manifest, long_text=None))  # as a manifest from before the policy was recorded
    rt = load_runtime(old, "cpu")
    assert "long_text" not in read_manifest(old).to_json() and str(rt.long_text) == "head"
    texts = ["short and sweet", LONG]
    np.testing.assert_allclose(rt.predict(texts), runtime.predict(texts, "head"), atol=1e-6)
    # head is exactly the tokenizer's own truncation (what every runtime did before the policy)
    enc = rt.tokenizer(texts, truncation=True, max_length=64, padding=True, return_tensors="np")
    np.testing.assert_array_equal(rt.tokenize(texts)["input_ids"], enc["input_ids"])


def test_a_1000_token_text_gets_8_windows_and_is_flagged_truncated(runtime):
    words = " ".join(f"w{i}" for i in range(2000))
    ids = runtime.tokenizer(words, add_special_tokens=False)["input_ids"][:998]
    text = runtime.tokenizer.decode(ids)
    r = runtime.classify([text, "fine"], "windows")
    assert r.tokens[0] == 1000 and r.windows == [8, 1] and r.truncated == [True, False]
    assert r.tokens[1] == 3 and r.probs.shape == (2, 2)
    # the cap is a runtime option (serve --max-windows)
    from qserve.runtime import RuntimeOptions, load_runtime

    few = load_runtime(runtime.variant_dir, "cpu", RuntimeOptions(threads=1, max_windows=3))
    assert few.classify([text], "windows").windows == [3]


def test_a_windowed_text_is_the_aggregate_of_its_windows_scored_alone(runtime):
    pieces = runtime.split([LONG], "windows:64:48:mean")
    alone = np.concatenate([runtime.run(runtime.pad([p])) for p in pieces.ids])
    assert len(alone) == pieces.windows[0] > 1
    np.testing.assert_allclose(runtime.logits([LONG], "windows:64:48:mean")[0], alone.mean(0), atol=1e-5)
    np.testing.assert_allclose(runtime.logits([LONG], "windows:64:48:max")[0], alone.max(0), atol=1e-5)


def test_a_windowed_texts_answer_is_the_same_alone_and_in_a_shuffled_batch(runtime, tiny_variant):
    from qserve.runtime import RuntimeOptions, load_runtime

    rng = random.Random(0)
    words = LONG.split()
    texts = [" ".join(words[: rng.randint(3, len(words))]) for _ in range(24)]
    policies = [rng.choice(["head", "tail", "head-tail", "windows", "windows:32:16:max"]) for _ in texts]
    alone = np.concatenate([runtime.predict([t], p) for t, p in zip(texts, policies)])
    order = list(range(len(texts)))
    rng.shuffle(order)
    # mixed policies in one call, and forwards capped at 5 pieces (serve's max batch): same answers
    capped = load_runtime(tiny_variant, "cpu", RuntimeOptions(threads=1, max_rows=5))
    for rt in (runtime, capped):
        got = rt.predict([texts[i] for i in order], [policies[i] for i in order])
        assert np.abs(got - alone[order]).max() < 1e-5


@pytest.mark.parametrize("bad", ["middle", "windows:64:32:median", "head-tail:64", "windows:65"])
def test_a_bad_policy_is_refused_naming_the_allowed_forms(runtime, tiny_checkpoint, tmp_path, bad):
    import exporters
    from qserve.runtime import RuntimeOptions, load_runtime

    with pytest.raises(LongTextError, match="allowed forms") as e:
        runtime.predict(["x"], bad)
    assert FORMS in str(e.value)
    with pytest.raises(LongTextError, match="--long-text"):
        load_runtime(runtime.variant_dir, "cpu", RuntimeOptions(long_text=bad))
    with pytest.raises(LongTextError, match="--long-text"):
        exporters.export(tiny_checkpoint, "torch-fp32", tmp_path / "v", long_text=bad)
    assert not (tmp_path / "v").exists()


def test_an_edited_policy_in_the_manifest_is_refused(tiny_variant, tmp_path):
    from qserve.artifact import VariantError, read_manifest, write_manifest
    from qserve.verify import verify

    vdir = tmp_path / "v"
    shutil.copytree(tiny_variant, vdir)
    manifest = read_manifest(vdir)
    write_manifest(vdir, replace(manifest, long_text="windows"))  # resealed, but not written out in full
    with pytest.raises(VariantError, match="not written out in full"):
        verify(vdir)


def test_classify_carries_the_raw_logits_its_scores_come_from(runtime):
    """Classification.logits (what TEI's raw_scores answers) are the aggregated logits before softmax, for a
    windowed text too, traced or not."""
    texts = ["a fine film", " ".join(["long"] * 300)]
    for phases in (None, []):
        r = runtime.classify(texts, ["head", "windows"], phases)
        np.testing.assert_allclose(
            r.logits,
            np.concatenate([runtime.logits(texts[:1], "head"), runtime.logits(texts[1:], "windows")]),
            atol=1e-6,
        )
        np.testing.assert_allclose(runtime.scores(r.logits), r.probs, atol=1e-7)
        assert r.logits.shape == r.probs.shape and r.windows[1] > 1
