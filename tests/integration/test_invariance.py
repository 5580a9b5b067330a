"""One text, one answer: a text scores the same alone and inside random mixed batches, per backend.

    python -m pytest tests/integration/test_invariance.py -q

Tiny fixture models, texts from one token to past max_length (64), so a batch pads short
texts next to long ones. Bounds: fp32 and onnx-int8 1e-5 in probability (the issue's
invariant); torch-bf16 and the bitsandbytes variants the bounds the README publishes for
them (their own kernels' rounding, measured on the embedded default).
"""

from __future__ import annotations

import numpy as np
import pytest

import exporters
from qserve.bench.invariance import compare
from qserve.runtime import RuntimeOptions, load_runtime

TEXTS = [
    "ok",
    "bad",
    "Worst movie of the year. Avoid.",
    "A wonderful, moving film with superb performances.",
    "It was fine, I guess. Some good scenes, some boring ones.",
    "The cinematography is gorgeous but the script is lazy and the ending is predictable. " * 6,
    "I expected to hate it, and I did not: the second half completely won me over.",
    "Not bad at all! Would watch again with friends.",
    "dull",
    "An instant classic, " * 9,
    "The acting was wooden and the plot made no sense at all.",
    "Loved it.",
]
# Probability bounds (README, "One text, one answer"): exact-rounding variants 1e-5; bf16 and
# bitsandbytes the bound measured for them on the embedded default.
BOUND = {
    "torch-fp32": 1e-5,
    "onnx-fp32": 1e-5,
    "onnx-int8": 1e-5,
    "onnx-int8 per-row": 1e-5,
    "onnx-int4": 1e-5,
    "torch-bf16": 1e-2,
    "bnb-int8": 1e-5,
    "bnb-nf4": 1e-2,
    "bnb-fp4": 1e-2,
}
VARIANTS = {
    "torch-fp32": ("torch-fp32", {}),
    "torch-bf16": ("torch-bf16", {}),
    "onnx-fp32": ("onnx-fp32", {}),
    "onnx-int8": ("onnx-int8", {}),
    "onnx-int8 per-row": ("onnx-int8", {"activation_scales": "per-row"}),
    "onnx-int4": ("onnx-int4", {}),
}


@pytest.fixture(scope="module")
def variants(tiny_checkpoint, tmp_path_factory):
    root = tmp_path_factory.mktemp("invariance")
    out = {}
    for key, (name, options) in VARIANTS.items():
        out[key] = root / key.replace(" ", "-")
        exporters.export(tiny_checkpoint, name, out[key], options=options)
    return out


def random_mixed_batches(runtime, texts: list[str], seed: int, trials: int = 3) -> tuple[float, int]:
    """Largest |Δprob| and label flips: each text alone vs inside random batches of random sizes."""
    rng = np.random.default_rng(seed)
    alone = np.concatenate([runtime.predict([t]) for t in texts])
    worst, flips = 0.0, 0
    for _ in range(trials):
        order = rng.permutation(len(texts))
        got = np.empty_like(alone)
        start = 0
        while start < len(order):
            idx = order[start : start + int(rng.integers(2, len(texts) + 1))]
            got[idx] = runtime.predict([texts[i] for i in idx])
            start += len(idx)
        worst = max(worst, float(np.abs(got - alone).max()))
        flips += int((got.argmax(1) != alone.argmax(1)).sum())
    return worst, flips


@pytest.mark.parametrize("key", list(VARIANTS))
def test_text_scores_the_same_alone_and_in_random_mixed_batches(variants, key):
    runtime = load_runtime(variants[key], "cpu", RuntimeOptions(threads=1))
    assert runtime.tokenize(TEXTS)["attention_mask"].sum(1).min() <= 3  # really padded next to 64-token rows
    worst, flips = random_mixed_batches(runtime, TEXTS, seed=len(key))
    assert worst <= BOUND[key], f"{key}: max |Δprob| {worst:.3g} alone vs in batches"
    assert flips == 0


def test_onnx_int8_runs_its_per_batch_graph_row_by_row(variants):
    """The per-tensor graph lets a row see its batchmates; the runtime hides that by running rows alone,
    and the comparison option still reaches the graph's own batched answers (which differ)."""
    path = variants["onnx-int8"]
    served = load_runtime(path, "cpu", RuntimeOptions(threads=1))
    batched = load_runtime(path, "cpu", RuntimeOptions(threads=1, batch_dependent="batched"))
    assert not served.batch_invariant and served.row_by_row and not batched.row_by_row
    assert compare(served.predict, TEXTS)["max_abs_dprob"] == 0.0
    # Same graph, one forward for the whole batch: answers move with the batch (why rows run alone).
    assert compare(batched.predict, TEXTS)["max_abs_dprob"] > 1e-5
    # Row by row gives exactly the graph's answers for each text alone, batch order preserved.
    alone = np.concatenate([batched.predict([t]) for t in TEXTS])
    np.testing.assert_array_equal(served.predict(TEXTS), alone)
    result = served.classify(TEXTS)
    np.testing.assert_array_equal(result.probs, alone)
    assert result.truncated == served.truncated(TEXTS)


def test_per_row_graph_is_row_independent_when_batched(variants):
    rt = load_runtime(variants["onnx-int8 per-row"], "cpu", RuntimeOptions(threads=1))
    assert rt.batch_invariant and not rt.row_by_row  # one forward per batch, no row splitting needed
    assert rt.manifest.record("onnx")["quantization"]["activation_scales"] == "per-row"
    assert (
        "MatMulIntegerToFloat" in rt.manifest.record("onnx")["ops"]
        and "DynamicQuantizeLinear" not in rt.manifest.record("onnx")["ops"]
    )
    batch = rt.tokenize(TEXTS)
    alone = np.concatenate([rt.forward(rt.tokenize([t])) for t in TEXTS])
    assert np.abs(rt.forward(batch) - alone).max() <= 1e-5  # the raw batched forward itself


def test_rows_run_side_by_side_still_get_their_alone_answers(variants):
    """row_workers > 1: a batch's rows run at once on single-threaded workers of a second session;
    each text still gets the answer it gets alone (from the full-pool session), in batch order."""
    path = variants["onnx-int8"]
    side = load_runtime(path, "cpu", RuntimeOptions(threads=2, row_workers=3))
    one = load_runtime(path, "cpu", RuntimeOptions(threads=2, row_workers=1))
    assert side.row_workers == 3 and side.row_session is not None and one.row_session is None
    alone = np.concatenate([side.predict([t]) for t in TEXTS])  # b1: the main session, not the workers
    np.testing.assert_allclose(side.predict(TEXTS), alone, rtol=0, atol=1e-6)
    np.testing.assert_allclose(side.predict(TEXTS[::-1]), alone[::-1], rtol=0, atol=1e-6)  # order kept
    np.testing.assert_array_equal(one.predict(TEXTS), alone)
    worst, flips = random_mixed_batches(side, TEXTS, seed=5)
    assert worst <= BOUND["onnx-int8"] and flips == 0
    # A batch-invariant graph is forwarded whole: no second session for it.
    assert load_runtime(variants["onnx-fp32"], "cpu", RuntimeOptions(threads=2)).row_session is None
    side.close()
    assert side.row_pool is None


def test_bad_batch_dependent_option_names_the_allowed_values():
    from qserve import QserveError

    with pytest.raises(QserveError, match="rows, batched"):
        RuntimeOptions(batch_dependent="sometimes")
    with pytest.raises(QserveError, match=r"row_workers must be an integer >= 1 or None \(got 0\)"):
        RuntimeOptions(row_workers=0)


def test_llm_int8_is_run_row_by_row_only_where_it_picks_outliers_per_batch():
    """bnb-int8 takes its 16-bit outlier columns over the whole batch (batch-dependent: 0.056 in probability
    measured on the embedded default), unless the threshold is 0; the 4-bit variants have no outliers."""
    from types import SimpleNamespace

    from qserve.runtime.torch_rt import _llm_int8_picks_outliers_per_batch as per_batch
    from qserve.variants import VARIANTS

    int8, nf4 = VARIANTS["bnb-int8"], VARIANTS["bnb-nf4"]
    model = SimpleNamespace(config=SimpleNamespace(quantization_config={"llm_int8_threshold": 6.0}))
    assert per_batch(model, int8, "cuda:0") and per_batch(model, int8, "cpu")
    assert not per_batch(model, nf4, "cuda")
    model.config.quantization_config = {"llm_int8_threshold": 0.0}  # no outlier decomposition: rows independent
    assert not per_batch(model, int8, "cuda")


def test_row_by_row_false_rebuilds_the_graph_of_before(tiny_checkpoint, variants, tmp_path):
    """The exporter option keeps the per-batch behaviour reachable for side-by-side runs: the same graph,
    forwarded as one batch by default (answers move with batchmates)."""
    m = exporters.export(tiny_checkpoint, "onnx-int8", tmp_path / "v", options={"row_by_row": False}).to_json()
    assert m["onnx"]["quantization"]["row_by_row"] is False
    before = load_runtime(tmp_path / "v", "cpu", RuntimeOptions(threads=1))
    assert not before.row_by_row and compare(before.predict, TEXTS)["max_abs_dprob"] > 1e-5
    now = load_runtime(variants["onnx-int8"], "cpu", RuntimeOptions(threads=1))
    assert now.manifest.record("onnx")["quantization"]["row_by_row"] is True and now.row_by_row
    # The same graph, bit for bit: only how the runtime runs it differs.
    assert (tmp_path / "v" / "model.onnx").read_bytes() == (variants["onnx-int8"] / "model.onnx").read_bytes()
