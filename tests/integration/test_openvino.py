"""OpenVINO variants: export, manifest, tamper refusal, parity, load_runtime, batch invariance, probe crash.

    python -m pytest tests/integration/test_openvino.py -q

On a CPU where OpenVINO's probe fails (crash or no bf16), the variant tests skip with the probe's
"unavailable on this CPU: <reason>"; the simulated-crash tests run everywhere.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("openvino")
pytest.importorskip("nncf")
pytest.importorskip("optimum.intel")

from conftest import MIXED_TEXTS as TEXTS  # noqa: E402

import exporters  # noqa: E402
from exporters.core import TOKENIZER_FILES, reference_logits  # noqa: E402
from qserve.artifact import VariantError  # noqa: E402
from qserve.runtime import (
    load_runtime,  # noqa: E402
    ov_probe,  # noqa: E402
)

OV_VARIANTS = ["ov-fp32", "ov-bf16", "ov-int8"]
# Error relative to the tiny model's logit scale (|logit| ~ 0.2), as in test_onnx_exporters.
RELATIVE_TOL = {"fp32": 1e-4, "bf16": 3e-2, "int8": 0.1}


@pytest.fixture(scope="module")
def ov_variants(tiny_checkpoint, tmp_path_factory) -> dict[str, tuple[Path, dict] | str]:
    root = tmp_path_factory.mktemp("ov-variants")
    out: dict[str, tuple[Path, dict] | str] = {}
    for name in OV_VARIANTS:
        try:
            # 16 calibration texts: the fixture has no dataset, so they are the 8 parity probes anyway
            opts = {"calibration_samples": 16} if name == "ov-int8" else {}
            out[name] = (root / name, exporters.export(tiny_checkpoint, name, root / name, options=opts).to_json())
        except ov_probe.OpenVINOUnavailable as e:
            out[name] = str(e)
    return out


def _variant(ov_variants, name) -> tuple[Path, dict]:
    got = ov_variants[name]
    if isinstance(got, str):
        pytest.skip(got)  # "ov-bf16 unavailable on this CPU: ..." (e.g. no avx512_bf16/AMX)
    return got


@pytest.fixture(scope="module")
def reference(tiny_checkpoint) -> np.ndarray:
    return reference_logits(tiny_checkpoint, TEXTS, max_length=64)


@pytest.mark.parametrize("name", OV_VARIANTS)
def test_export_writes_the_variant_files_and_manifest(ov_variants, tiny_checkpoint, name):
    path, manifest = _variant(ov_variants, name)
    expected = {"openvino_model.xml", "openvino_model.bin", "config.json", "qserve_model.json", "manifest.json"}
    expected |= {n for n in TOKENIZER_FILES if (tiny_checkpoint / n).is_file()}
    assert {p.name for p in path.iterdir()} == expected
    spec = manifest["spec"]
    assert spec["name"] == name and spec["backend"] == "openvino" and spec["cuda"] is False
    assert set(manifest["files"]) == expected - {"manifest.json"}
    assert manifest["parity"]["within_tolerance"] and manifest["parity"]["agreement"] == 1.0
    assert manifest["versions"]["openvino"] and manifest["versions"]["nncf"]
    ov = manifest["openvino"]
    assert ov["inference_precision"] == ("bf16" if name == "ov-bf16" else "f32")
    if name == "ov-int8":
        q = ov["quantization"]
        assert q["model_type"] == "TRANSFORMER" and q["fake_quantize_ops"] == ov["ops"]["FakeQuantize"] > 0
        assert q["subset_size"] == 8 and "parity probe" in q["calibration"]
    else:
        assert "FakeQuantize" not in ov["ops"]


@pytest.mark.parametrize("name", OV_VARIANTS)
def test_runtime_matches_fp32_reference_and_is_batch_invariant(ov_variants, reference, name):
    path, manifest = _variant(ov_variants, name)
    rt = load_runtime(path, "cpu")
    got = rt.logits(TEXTS)
    assert got.dtype == np.float32 and got.shape == (len(TEXTS), 2)
    assert np.abs(got - reference).max() <= RELATIVE_TOL[manifest["spec"]["dtype"]] * np.abs(reference).max()
    assert (got.argmax(-1) == reference.argmax(-1)).all()
    # One text, one answer: alone (no padding) vs in the mixed, mostly padded batch.
    alone = np.concatenate([rt.predict([t]) for t in TEXTS])
    assert np.abs(alone - rt.predict(TEXTS)).max() <= 1e-5
    # ov-int8 runs each text at its length bucket (see openvino_rt.fixed_length); the float variants as padded
    assert rt.fixed_length is (name == "ov-int8")
    assert rt.buckets == ((32, 64) if name == "ov-int8" else None)  # auto buckets for the fixture's max_length 64


def test_fit_rows_pads_like_the_tokenizer():
    from qserve.runtime.buckets import fit_rows

    batch = {
        "input_ids": np.array([[101, 7, 102, 0], [101, 7, 8, 102]]),
        "attention_mask": np.array([[1, 1, 1, 0], [1, 1, 1, 1]]),
    }
    out = fit_rows(batch, [0], 5, pad_id=0)
    assert out["input_ids"].tolist() == [[101, 7, 102, 0, 0]] and out["attention_mask"].tolist() == [[1, 1, 1, 0, 0]]
    out = fit_rows(batch, [1, 0], 4, pad_id=9)
    assert out["input_ids"].tolist() == [[101, 7, 8, 102], [101, 7, 102, 9]]


def test_ov_int8_runs_each_text_at_its_bucket_and_answers_alike_in_any_batch(ov_variants):
    from qserve.runtime import RuntimeOptions

    path, _ = _variant(ov_variants, "ov-int8")
    texts = TEXTS * 3
    shapes: list[tuple[int, int]] = []
    rt = load_runtime(path, "cpu", RuntimeOptions(length_buckets="auto", max_batch_tokens=128))
    forward = rt.forward
    rt.forward = lambda b: shapes.append(b["input_ids"].shape) or forward(b)
    batched = rt.predict(texts)
    assert {s for _, s in shapes} == {32, 64} and all(r * s <= 128 for r, s in shapes)
    alone = np.concatenate([rt.predict([t]) for t in texts])
    assert np.array_equal(alone, batched)  # the bucket is the text's own: no batchmate moves a bit
    # off: every text at max_length, as before buckets (one length for every forward)
    off = load_runtime(path, "cpu", RuntimeOptions(length_buckets="off"))
    assert off.buckets == (64,)
    shapes.clear()
    off_forward = off.forward
    off.forward = lambda b: shapes.append(b["input_ids"].shape) or off_forward(b)
    assert (off.predict(texts).argmax(-1) == batched.argmax(-1)).all()
    assert {s for _, s in shapes} == {64}


@pytest.mark.parametrize("name", OV_VARIANTS)
def test_a_batch_runs_as_shares_on_single_threaded_streams_with_the_same_answers(ov_variants, name):
    from qserve.devices import usable_cores
    from qserve.runtime import RuntimeOptions

    if usable_cores() < 2:
        pytest.skip("OpenVINO gives one stream per core: side-by-side shares need 2 cores")
    path, _ = _variant(ov_variants, name)
    texts = TEXTS * 3
    side = load_runtime(path, "cpu", RuntimeOptions(threads=2, row_workers=2))
    one = load_runtime(path, "cpu", RuntimeOptions(threads=2, row_workers=1))
    assert side.row_workers == 2 and one.row_workers == 1
    assert side.compiled is one.compiled  # the lone-row model is the same one, shared
    # more workers than cores: one per core, the most streams the plugin gives
    assert load_runtime(path, "cpu", RuntimeOptions(threads=2, row_workers=64)).row_workers == usable_cores()
    shares: list[int] = []
    for req in side._side_requests():  # record every share a stream is handed, then run it for real
        start = req.start_async
        req.start_async = lambda feed, _start=start: shares.append(len(feed["input_ids"])) or _start(feed)
    batched = side.logits(texts)
    streams = side._side_requests()[0].get_compiled_model()
    assert streams.get_property("NUM_STREAMS") == 2 and streams.get_property("INFERENCE_NUM_THREADS") == 2
    assert shares and max(shares) < len(texts) and sum(shares) == len(texts)  # split over the streams, every row once
    assert np.array_equal(batched, one.logits(texts))  # same bits as one stream on every thread
    shares.clear()
    alone = np.concatenate([side.logits([t]) for t in texts])  # a lone row: the one stream, never a share
    assert shares == []
    if name == "ov-int8":  # each text at its own bucket: alone and batched bit for bit (see test above)
        assert np.array_equal(alone, batched)


def test_runtime_is_thread_safe(ov_variants):
    path, _ = _variant(ov_variants, "ov-int8")
    rt = load_runtime(path, "cpu")
    want = [rt.predict([t]) for t in TEXTS]
    errors: list[str] = []

    def worker(k: int) -> None:
        for i in range(20):
            j = (i + k) % len(TEXTS)
            if not np.array_equal(rt.predict([TEXTS[j]]), want[j]):
                errors.append(f"thread {k} call {i}")

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    # one compiled model per process: a second runtime on the same variant shares it
    assert load_runtime(path, "cpu").compiled is rt.compiled


def test_tampered_variant_is_refused(ov_variants, tmp_path):
    import shutil

    path, _ = _variant(ov_variants, "ov-fp32")
    copy = tmp_path / "ov-fp32"
    shutil.copytree(path, copy)
    weights = copy / "openvino_model.bin"
    original = weights.read_bytes()
    data = bytearray(original)
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(VariantError, match="openvino_model.bin does not match its sha256"):
        load_runtime(copy, "cpu")
    weights.write_bytes(original)
    (copy / "openvino_model.xml").unlink()
    with pytest.raises(VariantError, match="openvino_model.xml is listed in the manifest but missing"):
        load_runtime(copy, "cpu")


def test_variant_dir_loads_unchanged_in_optimum_intel(ov_variants):
    from optimum.intel import OVModelForSequenceClassification
    from transformers import AutoTokenizer

    path, _ = _variant(ov_variants, "ov-int8")
    model = OVModelForSequenceClassification.from_pretrained(path, ov_config={"INFERENCE_PRECISION_HINT": "f32"})
    enc = AutoTokenizer.from_pretrained(path)(TEXTS[:2], padding=True, return_tensors="np")
    got = np.asarray(model(**enc).logits)
    np.testing.assert_allclose(got, load_runtime(path, "cpu").logits(TEXTS[:2]), atol=1e-5)


def test_bad_options_name_the_allowed_ones(tiny_checkpoint, tmp_path):
    from qserve import QserveError

    with pytest.raises(QserveError, match="calibration_samples for ov-int8 must be an integer from 1 to 1024"):
        exporters.export(tiny_checkpoint, "ov-int8", tmp_path / "a", options={"calibration_samples": 0})
    with pytest.raises(QserveError, match=r"unknown option\(s\) 'smooth' for ov-fp32; allowed: none"):
        exporters.export(tiny_checkpoint, "ov-fp32", tmp_path / "b", options={"smooth": True})
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.fixture
def probe_crashes(monkeypatch):
    """The OpenVINO probe child dies with SIGFPE, as the CPU plugin does on some AMD EPYC parts."""
    monkeypatch.setenv(ov_probe.FAULT_ENV, "SIGFPE")
    ov_probe.reset()
    yield
    monkeypatch.delenv(ov_probe.FAULT_ENV)
    ov_probe.reset()


def test_probe_crash_skips_ov_variants_and_the_others_export(
    probe_crashes, tiny_checkpoint, tmp_path, capsys, monkeypatch
):
    import exporters.cli as export_cli
    from qserve import placement
    from qserve.cli import main

    # --all over a short list (the full list would export all 13 variants: minutes, for no more coverage)
    names = ["ov-fp32", "torch-fp32", "ov-int8", "ov-bf16"]
    monkeypatch.setattr(export_cli, "plan", lambda device, include_slow=False: placement.plan(device, names))
    assert main(["export", str(tiny_checkpoint), "--all", "--out", str(tmp_path), "--device", "cpu"]) == 0
    err = capsys.readouterr().err
    for name in ("ov-fp32", "ov-int8", "ov-bf16"):
        assert f"skipped: {name} unavailable on this CPU: OpenVINO's CPU plugin died with SIGFPE" in err
        assert not (tmp_path / name).exists()
    assert json.loads((tmp_path / "torch-fp32" / "manifest.json").read_text())["spec"]["name"] == "torch-fp32"
    assert [p.name for p in tmp_path.iterdir()] == ["torch-fp32"]  # no half-written ov dirs left behind


def test_probe_crash_is_an_error_not_a_crash_when_loading(ov_variants, monkeypatch):
    path, _ = _variant(ov_variants, "ov-fp32")  # exported while the probe still worked
    monkeypatch.setenv(ov_probe.FAULT_ENV, "SIGSEGV")
    ov_probe.reset()
    try:
        with pytest.raises(
            ov_probe.OpenVINOUnavailable,
            match="ov-fp32 unavailable on this CPU: OpenVINO's CPU plugin died with SIGSEGV",
        ):
            load_runtime(path, "cpu")
        monkeypatch.setenv(ov_probe.FAULT_ENV, "refuse")
        ov_probe.reset()
        with pytest.raises(ov_probe.OpenVINOUnavailable, match="simulated refusal"):
            load_runtime(path, "cpu")
    finally:
        monkeypatch.delenv(ov_probe.FAULT_ENV)
        ov_probe.reset()


def test_probe_crash_keeps_the_pipeline_exporting(probe_crashes, tiny_checkpoint, tmp_path, capsys):
    from qserve.pipeline import _export_stage
    from qserve.placement import plan
    from qserve.rundir import RunDir

    dirs, skipped, failed = _export_stage(
        tiny_checkpoint, RunDir(tmp_path), plan("cpu", ["ov-int8", "torch-fp32"]), force=False
    )
    assert dirs == [tmp_path / "variants" / "torch-fp32"] and set(skipped) == {"ov-int8"} and not failed
    assert "skipped: ov-int8 unavailable on this CPU: OpenVINO's CPU plugin died with SIGFPE" in capsys.readouterr().out
