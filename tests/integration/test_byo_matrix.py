"""Bring your own model: every variant of every supported architecture exports, loads, keeps parity and answers.

    python -m pytest tests/integration/test_byo_matrix.py -q                          # ~2 min on 2 cores
    QSERVE_BYO_FULL=1 python -m pytest tests/integration/test_byo_matrix.py -q        # + OpenVINO on every architecture
    python -m benchmarks.render.byo_matrix                                # the full run, rewriting the page

One tiny random classifier per architecture (tests/tiny_archs.py, the embedded WordPiece tokenizer,
no qserve_model.json: a checkpoint qserve did not train). For each variant: `exporters.export` (its
parity gate included), `load_runtime(...).classify` against the fp32 checkpoint, and for one variant
per architecture a request to a real server. A variant the registry declares unsupported for the
architecture must be refused up front with its reason. Segment ids are checked separately: on a
model that has them, each graph backend must compute with the ids it is given, not zeros.
What the test observed is rendered by benchmarks/render/byo_matrix.py and must equal the committed
docs/byo-matrix.md and the README's block (cells a run did not observe are not compared).

Time: calibrated variants use 2-4 texts here. optimum-intel's export is most of an OpenVINO
variant's cost (5-20 s per tiny model on 2 cores), so by default the ov-* variants run on two
architectures: BERT, with ov-int8's default calibration (the architecture of issue #21's NNCF crash),
and ModernBERT (no segment ids, rotary attention); QSERVE_BYO_FULL=1 runs them on all eight.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import serving
from tiny_archs import ARCHS, build

from benchmarks.render import byo_matrix as render_byo_matrix
from qserve.modeling import ARCHITECTURES
from qserve.variants import VARIANTS, UnsupportedVariant

FULL = os.environ.get("QSERVE_BYO_FULL") == "1"
OV_ARCHS = ARCHS if FULL else ("bert", "modernbert")
FULL_NNCF = "bert"
SMALL = {
    "onnx-int8": {"calibration_samples": 4},
    "bnb-nf4": {"calibration_samples": 2},
    "bnb-fp4": {"calibration_samples": 4},
    "ov-int8": {"calibration_samples": 2},
}
# One served variant per architecture, spread over the backends.
SERVED = {
    "distilbert": "onnx-int8",
    "bert": "ov-int8",
    "roberta": "bnb-fp4",
    "xlm-roberta": "onnx-int4",
    "deberta-v2": "torch-bf16",
    "electra": "bnb-int8",
    "albert": "onnx-fp16",
    "modernbert": "ov-fp32",
}
TEXTS = [
    "A wonderful, moving film.",
    "Dull, and far too long for what it had to say.",
    "The plot is thin but the actors carry it. " * 30,
]  # past the checkpoints' 128 positions: cut
QUANTIZED = ("int8", "nf4", "fp4", "int4")

RESULTS: dict[str, dict[str, str]] = {}
"""model_type -> variant -> "yes" or "unsupported: <reason>", as observed (read by test_matrix_page)."""
SKIPPED: dict[str, dict[str, str]] = {}
"""Cells this machine could not observe (OpenVINO unavailable on its CPU)."""


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("byo")


def _checkpoint(root: Path, arch: str) -> Path:
    ckpt = root / arch / "checkpoint"
    if not (ckpt / "config.json").is_file():
        build(arch, ckpt, seed=ARCHS.index(arch))
    return ckpt


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _served_answer(variant_dir: Path) -> list[float]:
    import httpx2

    from qserve.serve.infra.config import ServeConfig

    with serving(ServeConfig(variant_dir=str(variant_dir), threads=1, max_wait_ms=1)) as srv:
        r = httpx2.post(srv.url + "/v1/classify", json={"inputs": TEXTS[:2]}, timeout=30, trust_env=False)
    assert r.status_code == 200, r.text
    return [max(p["score"] for p in preds) for preds in r.json()["predictions"]]


def _margins(logits: np.ndarray) -> np.ndarray:
    return logits[:, 1] - logits[:, 0]


@pytest.mark.parametrize("arch", ARCHS)
def test_every_variant(arch, root):
    """Each cell: exported (the parity gate: output shape, finite logits), loaded through the runtime
    contract, answering differently for different texts, truncating what is long, classify() agreeing with
    logits(); fp32, fp16 and bf16 variants within their |Δlogit| tolerance of the checkpoint. Quantized
    variants are not held to a tolerance here: on random weights int8 keeps little of what separates two
    texts (outlier-heavy activations), which says nothing about trained weights (benchmarks/studies/byo_bert.py)."""
    import exporters
    from exporters.core import TOLERANCE, checkpoint_info, reference_logits
    from qserve.runtime import load_runtime
    from qserve.runtime.ov_probe import OpenVINOUnavailable

    ckpt = _checkpoint(root, arch)
    max_length = checkpoint_info(ckpt).max_length
    ref = reference_logits(ckpt, TEXTS, max_length)
    cells: dict[str, str] = {}
    failures: list[str] = []
    t0 = time.perf_counter()
    for name, spec in VARIANTS.items():
        dest = root / arch / name
        reason = spec.unsupported.get(arch)  # none yet (docs/byo-matrix.md)
        if reason:
            with pytest.raises(UnsupportedVariant, match=f"^{name} unsupported for {ARCHITECTURES[arch]}: "):
                exporters.export(ckpt, name, dest)
            assert not dest.exists()
            cells[name] = f"unsupported: {reason}"
            continue
        if spec.backend == "openvino" and arch not in OV_ARCHS:
            continue
        options = {} if (name == "ov-int8" and arch == FULL_NNCF) else SMALL.get(name, {})
        try:
            parity = exporters.export(ckpt, name, dest, options=options, device="cpu").to_json()["parity"]
        except OpenVINOUnavailable as e:
            SKIPPED.setdefault(arch, {})[name] = str(e)
            continue
        except Exception as e:  # noqa: BLE001 - every cell is tried, then all failures reported at once
            failures.append(f"{name}: export: {type(e).__name__}: {e}")
            continue
        rt = load_runtime(dest, "cpu")
        try:
            got = rt.logits(TEXTS)
            res = rt.classify(TEXTS)
            probs, truncated = res.probs, res.truncated
        finally:
            rt.close()
        worst = max(float(np.abs(got - ref).max()), parity["max_abs_logit_diff"])  # these texts, the probes
        if spec.dtype not in QUANTIZED and worst > TOLERANCE[spec.dtype]:
            failures.append(f"{name}: max|Δlogit| {worst:.3g} > {TOLERANCE[spec.dtype]}")
            continue
        if np.ptp(_margins(got)) < 1e-3:
            failures.append(f"{name}: the same logits for every text ({got[0].tolist()})")
            continue
        np.testing.assert_allclose(probs, _softmax(got), atol=1e-5, err_msg=f"{name}: classify")
        if truncated != [False, False, True]:
            failures.append(f"{name}: truncated flags {truncated} for {[len(t) for t in TEXTS]}-character texts")
            continue
        if name == SERVED[arch]:
            served = _served_answer(dest)
            rt = load_runtime(dest, "cpu")  # the served batch: both texts in one call
            np.testing.assert_allclose(served, rt.predict(TEXTS[:2]).max(-1), atol=1e-5, err_msg=f"{name} served")
            rt.close()
        cells[name] = "yes"
        print(f"  {name} {time.perf_counter() - t0:.1f}s max|Δlogit| {worst:.3g}", flush=True)
    print(f"{arch}: {len(cells)} variants in {time.perf_counter() - t0:.1f}s")
    assert not failures, f"{ARCHITECTURES[arch]}: " + "; ".join(failures)
    RESULTS[arch] = cells


SEGMENT_ARCHS = [a for a in ARCHS if a in ("bert", "electra", "albert")]  # type_vocab_size 2


@pytest.mark.parametrize("arch", SEGMENT_ARCHS)
def test_segment_ids_reach_every_backend(arch, root):
    """A text pair's second segment (token_type_ids 1) changes a BERT-layout model's answer: each backend
    must compute with the ids its batch carries, where a runtime that fed zeros would match segment 0."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from qserve.runtime import load_runtime

    ckpt = _checkpoint(root, arch)
    rt0 = load_runtime(root / arch / "torch-fp32", "cpu") if (root / arch / "torch-fp32").is_dir() else None
    if rt0 is None:
        pytest.skip("runs after test_every_variant exported the variants")
    batch = rt0.tokenize(TEXTS[:2])
    rt0.close()
    assert "token_type_ids" in batch
    batch["token_type_ids"] = np.where(np.arange(batch["input_ids"].shape[1]) >= 3, 1, 0)[None].repeat(2, 0)
    batch["token_type_ids"] *= batch["attention_mask"]
    model = AutoModelForSequenceClassification.from_pretrained(ckpt).eval()
    with torch.no_grad():
        want = model(**{k: torch.from_numpy(v) for k, v in batch.items()}).logits.numpy()
        zeros = model(**{k: torch.from_numpy(v) for k, v in batch.items() if k != "token_type_ids"}).logits.numpy()
    assert np.abs(want - zeros).max() > 1e-3  # the segment ids matter to this model
    for name in ("torch-fp32", "onnx-fp32", "ov-fp32"):
        if not (root / arch / name).is_dir():
            continue  # OpenVINO unavailable on this CPU
        rt = load_runtime(root / arch / name, "cpu")
        try:
            np.testing.assert_allclose(rt.run(batch), want, atol=1e-4, err_msg=name)
        finally:
            rt.close()


def test_matrix_page():
    """docs/byo-matrix.md is what test_every_variant observed (rewritten with QSERVE_BYO_MATRIX=write, which
    needs a run that observed every cell: QSERVE_BYO_FULL=1 on a CPU where OpenVINO works)."""
    render = render_byo_matrix
    missing = [a for a in ARCHS if a not in RESULTS]
    if missing:
        pytest.skip(f"test_every_variant did not pass for {', '.join(missing)} in this run")
    variants = list(VARIANTS)
    unseen = {a: sorted(set(variants) - set(RESULTS[a])) for a in ARCHS if set(variants) - set(RESULTS[a])}
    if os.environ.get(render.ENV) == "write":
        if unseen:
            pytest.fail(
                f"cannot write the page from a partial run (unobserved: {unseen}; {SKIPPED}); "
                "run it with QSERVE_BYO_FULL=1 on a CPU where OpenVINO works"
            )
        render.PAGE.parent.mkdir(exist_ok=True)
        render.PAGE.write_text(render.render(RESULTS, ARCHITECTURES, variants), encoding="utf-8")
        render.README.write_text(
            render.with_readme_block(
                render.README.read_text(encoding="utf-8"), render.table(RESULTS, ARCHITECTURES, variants)
            ),
            encoding="utf-8",
        )
    committed = render.parse(render.PAGE.read_text(encoding="utf-8"))
    assert sorted(committed) == sorted(ARCHITECTURES) == sorted(ARCHS)
    for arch in ARCHS:
        assert set(committed[arch]) == set(variants), arch
        seen = {v: c for v, c in committed[arch].items() if v in RESULTS[arch]}
        assert {v: RESULTS[arch][v] for v in seen} == seen, (
            f"{render.PAGE} disagrees with what the test observed for {arch}; "
            "run `python -m benchmarks.render.byo_matrix` and commit the page"
        )
    assert render.PAGE.read_text(encoding="utf-8") == render.render(committed, ARCHITECTURES, variants)
    # the README's "Bring your own model" section shows the same matrix
    assert render.readme_block(render.README.read_text(encoding="utf-8")) == render.table(
        committed, ARCHITECTURES, variants
    ), "README.md's byo-matrix block differs from docs/byo-matrix.md"
