"""The variant directory format: round trip, tamper detection, no overwrite, atomicity."""

import json
import shutil

import pytest

import exporters
from qserve import QserveError
from qserve.artifact import VariantError, read_manifest
from qserve.files import staged_dir
from qserve.runtime import load_runtime
from qserve.verify import verify


def test_manifest_round_trip(tiny_variant, tiny_checkpoint):
    m = verify(tiny_variant).to_json()
    assert m["format"] == "qserve-variant/1"
    assert m["spec"]["name"] == "torch-fp32" and m["spec"]["backend"] == "torch"
    assert m["labels"] == ["negative", "positive"]
    assert m["model_name"] == "tiny-distilbert" and m["max_length"] == 64
    assert len(m["source"]["sha256"]) == 64
    assert m["parity"]["agreement"] == 1.0 and m["parity"]["max_abs_logit_diff"] < 1e-4
    assert "torch" in m["versions"] and "transformers" in m["versions"]
    # every file in the dir but the manifest is listed with its size
    on_disk = {p.name for p in tiny_variant.iterdir()} - {"manifest.json"}
    assert set(m["files"]) == on_disk
    assert read_manifest(tiny_variant).to_json() == m


def test_exact_files_of_a_torch_variant(tiny_variant):
    # the tokenizer files transformers 5 saves (no vocab.txt or special_tokens_map.json since 4.x)
    assert sorted(p.name for p in tiny_variant.iterdir()) == [
        "config.json",
        "manifest.json",
        "model.safetensors",
        "qserve_model.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]


@pytest.fixture
def copy_of(tiny_variant, tmp_path):
    dst = tmp_path / "v"
    shutil.copytree(tiny_variant, dst)
    return dst


def test_altered_file_is_refused(copy_of):
    cfg = copy_of / "config.json"
    data = cfg.read_bytes()
    cfg.write_bytes(data.replace(b"negative", b"NEGATIVE"))  # same size, other content
    with pytest.raises(VariantError, match=r"config\.json does not match its sha256"):
        load_runtime(copy_of, device="cpu")


def test_truncated_file_is_refused(copy_of):
    w = copy_of / "model.safetensors"
    w.write_bytes(w.read_bytes()[:1000])
    with pytest.raises(VariantError, match=r"model\.safetensors is 1000 bytes.*truncated"):
        verify(copy_of)


def test_missing_file_and_manifest(copy_of):
    (copy_of / "tokenizer.json").unlink()
    with pytest.raises(VariantError, match=r"tokenizer\.json is listed in the manifest but missing"):
        verify(copy_of)
    (copy_of / "manifest.json").unlink()
    with pytest.raises(VariantError, match=r"manifest\.json is missing"):
        verify(copy_of)


def test_garbled_manifest(copy_of):
    (copy_of / "manifest.json").write_text("{not json")
    with pytest.raises(VariantError, match="not valid JSON"):
        verify(copy_of)
    (copy_of / "manifest.json").write_text(json.dumps({"format": "other/9"}))
    with pytest.raises(VariantError, match="format 'other/9'"):
        verify(copy_of)


def test_refuses_to_overwrite_without_force(tiny_checkpoint, tiny_variant):
    before = (tiny_variant / "manifest.json").read_bytes()
    with pytest.raises(QserveError, match="already exists; pass --force"):
        exporters.export(tiny_checkpoint, "torch-fp32", tiny_variant)
    assert (tiny_variant / "manifest.json").read_bytes() == before


def test_force_replaces(tiny_checkpoint, tmp_path):
    out = tmp_path / "v"
    first = exporters.export(tiny_checkpoint, "torch-bf16", out).to_json()
    second = exporters.export(tiny_checkpoint, "torch-bf16", out, force=True).to_json()
    assert verify(out).to_json()["created"] == second["created"] and first["spec"] == second["spec"]
    assert [p.name for p in tmp_path.iterdir()] == ["v"]  # no temp or old dirs left behind


def test_failed_export_leaves_nothing(tiny_checkpoint, tmp_path, monkeypatch):
    import exporters.torch_dtype as td

    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(td, "build", boom)
    from exporters.core import ExportFailed

    # A library's exception reaches the user as one line naming the variant (the cause stays chained).
    with pytest.raises(ExportFailed, match="torch-fp32 failed for DistilBERT: RuntimeError: disk full") as e:
        exporters.export(tiny_checkpoint, "torch-fp32", tmp_path / "v")
    assert isinstance(e.value.__cause__, RuntimeError)
    assert list(tmp_path.iterdir()) == []


def test_failed_force_export_keeps_the_old_variant(tiny_checkpoint, tmp_path, monkeypatch):
    out = tmp_path / "v"
    exporters.export(tiny_checkpoint, "torch-fp32", out)
    before = (out / "manifest.json").read_bytes()
    import exporters.torch_dtype as td
    from exporters.core import ExportFailed

    monkeypatch.setattr(td, "build", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("crash")))
    with pytest.raises(ExportFailed, match="RuntimeError: crash"):
        exporters.export(tiny_checkpoint, "torch-fp32", out, force=True)
    assert (out / "manifest.json").read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["v"]


def test_staged_dir_refuses_existing_file(tmp_path):
    (tmp_path / "x").write_text("keep me")
    with pytest.raises(QserveError, match="already exists"):
        with staged_dir(tmp_path / "x"):
            pass
    assert (tmp_path / "x").read_text() == "keep me"


def test_parity_shape_mismatch_fails(tiny_checkpoint, tmp_path, monkeypatch):
    from exporters import core

    monkeypatch.setattr(
        core, "reference_logits", lambda c, t, m, p=None, pairs=None: __import__("numpy").zeros((len(t), 3))
    )
    with pytest.raises(core.ParityError, match="shape"):
        exporters.export(tiny_checkpoint, "torch-fp32", tmp_path / "v")
    assert list(tmp_path.iterdir()) == []


def test_parity_tolerance_miss_warns_and_is_recorded(tiny_checkpoint, tmp_path, monkeypatch):
    from exporters import core

    monkeypatch.setitem(core.TOLERANCE, "bf16", 1e-9)
    with pytest.warns(UserWarning, match=r"max \|Δlogit\| .* exceeds tolerance 1e-09"):
        m = exporters.export(tiny_checkpoint, "torch-bf16", tmp_path / "v").to_json()
    assert m["parity"]["within_tolerance"] is False
    assert verify(tmp_path / "v").to_json()["parity"]["tolerance"] == 1e-9


def test_runtime_predict_contract(tiny_variant):
    rt = load_runtime(tiny_variant, device="cpu")
    probs = rt.predict(["a great movie", "awful " * 200, "ok"])
    assert probs.shape == (3, 2) and probs.dtype.name == "float32"
    assert abs(float(probs.sum(axis=1).max()) - 1) < 1e-5
    assert rt.truncated(["short", "awful " * 200]) == [False, True]
    # the server's one-tokenization path gives the same probabilities and the same flags
    result = rt.classify(["a great movie", "awful " * 200, "ok"])
    assert result.truncated == [False, True, False] and abs(result.probs - probs).max() < 1e-6
    assert result.windows == [1, 1, 1] and result.tokens == [5, 202, 3]
    # the same text alone or padded in a batch gives the same probabilities
    alone = rt.predict(["a great movie"])[0]
    assert abs(alone - probs[0]).max() < 1e-5


# -- manifest integrity (issue 14): fields that change answers cannot be edited silently ---------------
def _edit_manifest(vdir, reseal: bool, **changes):
    from qserve.artifact import DIGEST_KEY, manifest_digest

    m = json.loads((vdir / "manifest.json").read_text())
    m.update(changes)
    if reseal:  # what a careful editor would do: recompute the digest too
        m[DIGEST_KEY] = manifest_digest(m)
    (vdir / "manifest.json").write_text(json.dumps(m))
    return m


def test_manifest_records_its_own_digest(tiny_variant):
    from qserve.artifact import DIGEST_KEY, manifest_digest

    m = verify(tiny_variant).to_json()
    assert len(m[DIGEST_KEY]) == 64 and m[DIGEST_KEY] == manifest_digest(m)


def test_swapped_labels_are_refused(copy_of):
    _edit_manifest(copy_of, reseal=False, labels=["positive", "negative"])
    with pytest.raises(VariantError, match="edited after export.*manifest_sha256"):
        load_runtime(copy_of, device="cpu")
    # Resealed: the hashed config.json still maps 0 -> negative.
    _edit_manifest(copy_of, reseal=True, labels=["positive", "negative"])
    with pytest.raises(VariantError, match=r"labels \['positive', 'negative'\] but the hashed config.json"):
        load_runtime(copy_of, device="cpu")


def test_edited_max_length_is_refused_even_when_resealed(copy_of):
    _edit_manifest(copy_of, reseal=True, max_length=16)
    with pytest.raises(VariantError, match="max_length 16 but the hashed qserve_model.json says 64"):
        verify(copy_of)
    _edit_manifest(copy_of, reseal=True, max_length=100_000)
    with pytest.raises(VariantError, match="max_length 100000"):
        verify(copy_of)


def test_edited_spec_is_refused(copy_of):
    m = json.loads((copy_of / "manifest.json").read_text())
    _edit_manifest(copy_of, reseal=False, spec={**m["spec"], "options": {"anything": 1}})
    with pytest.raises(VariantError, match="edited after export"):
        verify(copy_of)


def test_older_manifest_without_digest_loads_with_a_warning_and_is_still_cross_checked(copy_of, caplog):
    from qserve.artifact import DIGEST_KEY

    m = json.loads((copy_of / "manifest.json").read_text())
    del m[DIGEST_KEY]
    (copy_of / "manifest.json").write_text(json.dumps(m))
    with caplog.at_level("WARNING", logger="qserve.verify"):
        assert verify(copy_of).to_json()["labels"] == ["negative", "positive"]
    assert "no manifest_sha256" in caplog.text and "re-export" in caplog.text
    m["labels"] = ["positive", "negative"]
    (copy_of / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(VariantError, match="hashed config.json"):
        verify(copy_of)


def test_unexpected_file_is_refused_unless_allowed(copy_of, caplog):
    (copy_of / "notes.txt").write_text("dropped in later")
    (copy_of / "sub").mkdir()
    (copy_of / "sub" / "model.onnx").write_bytes(b"\0" * 10)
    with pytest.raises(
        VariantError,
        match=r"2 file\(s\) its manifest does not list: notes.txt, sub/model.onnx"
        r".*--allow-extra-files",
    ):
        load_runtime(copy_of, device="cpu")
    with caplog.at_level("WARNING", logger="qserve.verify"):
        rt = load_runtime(copy_of, device="cpu", allow_extra_files=True)
    assert rt.predict(["fine"]).shape == (1, 2) and "notes.txt" in caplog.text


def test_serve_and_bench_take_allow_extra_files(copy_of):
    from qserve.serve.infra.config import config_from_sources

    assert config_from_sources({}, {"QSERVE_ALLOW_EXTRA_FILES": "1"}).allow_extra_files is True
    assert config_from_sources({"allow_extra_files": True}, {}).allow_extra_files is True
    with pytest.raises(QserveError, match="QSERVE_ALLOW_EXTRA_FILES='maybe'"):
        config_from_sources({}, {"QSERVE_ALLOW_EXTRA_FILES": "maybe"})
    import subprocess
    import sys

    (copy_of / "extra.bin").write_bytes(b"x")
    proc = subprocess.run(
        [sys.executable, "-m", "qserve.serve", "serve", str(copy_of), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "extra.bin" in proc.stderr and "--allow-extra-files" in proc.stderr
    from qserve.cli import build_parser

    args = build_parser().parse_args(["bench", str(copy_of), "--allow-extra-files"])
    from qserve.bench.cli import config_from_args

    assert config_from_args(args).allow_extra_files is True


# -- typed artifacts (issue 29): Manifest and ModelMeta read once, validated once, versioned, same bytes ----
# A finished `make demo` run (models/ is git-ignored); QSERVE_DEMO_RUN points at one elsewhere (read-only).
SHARED_RUN = __import__("pathlib").Path(
    __import__("os").environ.get("QSERVE_DEMO_RUN")
    or (__import__("pathlib").Path(__file__).resolve().parents[1] / "models" / "minilm-l6-distilbert-imdb")
)


def _old_write_manifest(root, manifest: dict) -> bytes:
    """How qserve wrote a manifest before it was typed (the dict path), for the byte-for-byte comparison."""
    from qserve.artifact import DIGEST_KEY, FORMAT, hash_files, manifest_digest

    data = {"format": FORMAT, **manifest}
    data["files"] = hash_files(root)
    data = json.loads(json.dumps(data, default=str))
    data[DIGEST_KEY] = manifest_digest(data)
    return (json.dumps(data, indent=2, sort_keys=False, default=str) + "\n").encode()


def _sample_dir(tmp_path):
    root = tmp_path / "v"
    root.mkdir()
    (root / "model.onnx").write_bytes(b"\0" * 32)
    (root / "config.json").write_text(json.dumps({"id2label": {"0": "neg", "1": "pos"}}))
    return root


def _sample_fields() -> dict:
    return {
        "spec": {
            "name": "onnx-int8",
            "backend": "onnx",
            "bits": 8,
            "dtype": "int8",
            "cpu": True,
            "cuda": False,
            "options": {"smooth": True, "keep_fp32": ""},
        },
        "model_name": "m",
        "labels": ["neg", "pos"],
        "problem_type": "single_label_classification",
        "max_length": 64,
        "long_text": "head",
        "inputs": ["text"],
        "source": {"path": "/x", "sha256": "ab"},
        "export_device": "cpu",
        "versions": {"qserve": "0.1.0"},
        "onnx": {"opset": 18, "ops": ["MatMul"]},
        "parity": {"probes": 8, "max_abs_logit_diff": 0.01},
        "created": "2026-12-01T00:00:00+00:00",
    }


def test_typed_write_keeps_the_bytes_of_the_dict_write(tmp_path):
    from qserve.artifact import MANIFEST, Manifest, write_manifest

    root = _sample_dir(tmp_path)
    fields = _sample_fields()
    want = _old_write_manifest(root, fields)
    m = Manifest.from_json({"format": "qserve-variant/1", "files": {}, **fields})
    written = write_manifest(root, m)
    assert (root / MANIFEST).read_bytes() == want
    assert written.record("onnx") == {"opset": 18, "ops": ["MatMul"]} and written.spec.options["smooth"] is True
    assert verify(root) == written  # read once, the same value


@pytest.mark.skipif(not (SHARED_RUN / "variants").is_dir(), reason="the shared demo run is not on this machine")
def test_every_exported_variant_of_the_shared_run_loads_and_round_trips():
    from qserve.artifact import MANIFEST, ModelMeta, read_model_meta

    dirs = sorted(d for d in (SHARED_RUN / "variants").iterdir() if (d / MANIFEST).is_file())
    assert dirs
    for d in dirs:  # read-only: nothing is written there
        m = verify(d, check_hashes=False)
        assert m.name == d.name and m.max_length >= 2 and m.parity is not None
        raw = (d / MANIFEST).read_bytes()
        assert (json.dumps(m.to_json(), indent=2) + "\n").encode() == raw, d
        meta = read_model_meta(d)
        assert meta is not None and meta.max_length == m.max_length
    ckpt = SHARED_RUN / "checkpoint" / "qserve_model.json"
    meta = ModelMeta.from_json(json.loads(ckpt.read_text()), ckpt)
    assert (json.dumps(meta.to_json(), indent=2) + "\n").encode() == ckpt.read_bytes()


@pytest.mark.parametrize(
    "change, message",
    [
        ({"labels": None}, r"lacks the 'labels' field"),
        ({"max_length": "64"}, r"max_length must be an integer >= 2, got '64'"),
        ({"labels": ["neg", 1]}, r"labels must be a non-empty list of strings"),
        (
            {"spec": {"name": "onnx-int8", "backend": "onnx", "bits": 8, "dtype": 8}},
            r"spec\.dtype must be a dtype name",
        ),
        (
            {"spec": {"name": "onnx-int8", "backend": "onnx", "bits": 8, "dtype": "int8", "colour": "red"}},
            r"spec has unknown field\(s\) colour; allowed: name, backend",
        ),
        ({"problem_type": "ranking"}, r"problem_type 'ranking' is not one of"),
        ({"inputs": ["text", "other"]}, r"inputs must be \['text'\] or \['text', 'text_pair'\]"),
        ({"files": {"model.onnx": {"sha256": "ab"}}}, r"files\['model.onnx'\] must be"),
        ({"onnx": "fast"}, r"onnx must be an object \(a backend's record\)"),
    ],
)
def test_a_manifest_with_a_wrong_or_missing_field_is_refused_naming_it(tmp_path, change, message):
    from qserve.artifact import read_manifest

    root = _sample_dir(tmp_path)
    data = {"format": "qserve-variant/1", "files": {}, **_sample_fields(), **change}
    data = {k: v for k, v in data.items() if v is not None}
    (root / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(VariantError, match=message) as e:
        read_manifest(root)
    assert str(root / "manifest.json") in str(e.value)


def test_a_manifest_of_a_newer_or_older_format_version_is_refused(tmp_path):
    from qserve.artifact import read_manifest

    root = _sample_dir(tmp_path)
    for fmt, why in (("qserve-variant/2", "newer qserve: upgrade qserve"), ("qserve-variant/0", "re-export")):
        (root / "manifest.json").write_text(json.dumps({"format": fmt, "files": {}, **_sample_fields()}))
        with pytest.raises(VariantError, match=rf"format '{fmt}'; this qserve reads 'qserve-variant/1' only.*{why}"):
            read_manifest(root)


def test_model_meta_is_validated_versioned_and_written_as_train_writes_it(tmp_path):
    from qserve.artifact import CheckpointError, ModelMeta, read_model_meta

    trained = {
        "model_name": "m",
        "base_model": "b",
        "dataset": "imdb",
        "seed": 1,
        "max_length": 64,
        "long_text": "head",
        "max_eval_samples": None,
        "labels": ["a", "b", "c"],
        "problem_type": "regression",
        "label_range": None,
    }
    path = tmp_path / "qserve_model.json"
    meta = ModelMeta.from_json(trained, path)
    assert meta.to_json() == trained and list(meta.to_json()) == list(trained)  # same keys, same order
    meta.write(path)
    assert path.read_text() == json.dumps(trained, indent=2) + "\n"
    assert read_model_meta(tmp_path) == meta and read_model_meta(tmp_path / "nowhere") is None
    for change, message in (
        ({"max_length": "64"}, "max_length must be an integer >= 2"),
        ({"seed": 1.5}, "seed must be an integer"),
        ({"inputs": "text"}, "inputs must be"),
        ({"format": "qserve-model/2"}, "format 'qserve-model/2'; this qserve reads 'qserve-model/1'"),
    ):
        path.write_text(json.dumps({**trained, **change}))
        with pytest.raises(CheckpointError, match=message) as e:
            read_model_meta(tmp_path)
        assert str(path) in str(e.value)


def test_a_resealed_manifest_keeps_its_key_order_and_creation_time(tmp_path):
    from dataclasses import replace

    from qserve.artifact import MANIFEST, Manifest, read_manifest, write_manifest

    root = _sample_dir(tmp_path)
    fields = {k: v for k, v in _sample_fields().items() if k != "created"}  # as an export writes it: stamped now
    write_manifest(root, Manifest.from_json({"format": "qserve-variant/1", "files": {}, **fields}))
    before = json.loads((root / MANIFEST).read_text())
    (root / "model.onnx").write_bytes(b"\1" * 40)
    after = write_manifest(root, replace(read_manifest(root), model_name="other")).to_json()
    assert list(after) == list(before) and after["created"] == before["created"]
    assert after["files"]["model.onnx"]["bytes"] == 40 and after["model_name"] == "other"
