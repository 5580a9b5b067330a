"""`qserve export` / `qserve variants` through the real CLI entry point."""

import json

import pytest

from qserve.cli import main


def test_export_bits_16_default_and_variants_listing(tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "bf16"
    assert main(["export", str(tiny_checkpoint), "--bits", "16", "--out", str(out), "--device", "cpu"]) == 0
    m = json.loads((out / "manifest.json").read_text())
    assert m["spec"]["name"] == "torch-bf16"
    assert "parity max|Δlogit|" in capsys.readouterr().out
    assert main(["variants", str(tmp_path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["variant"] for r in rows] == ["torch-bf16"] and rows[0]["status"] == "ok"


def test_export_refuses_existing_without_force(tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "v"
    out.mkdir()
    (out / "precious.txt").write_text("x")
    assert main(["export", str(tiny_checkpoint), "--bits", "32", "--backend", "torch", "--out", str(out)]) == 2
    assert "already exists; pass --force" in capsys.readouterr().err
    assert (out / "precious.txt").read_text() == "x"


@pytest.mark.parametrize("argv, message", [
    (["--bits", "8", "--backend", "torch"], "valid combinations"),
    ([], "say what to export"),
    (["--all", "--bits", "8"], "do not combine"),
    (["--bits", "8", "--block-size", "64"], "--block-size applies to onnx-int4, not onnx-int8"),
])
def test_export_bad_flags(tiny_checkpoint, tmp_path, capsys, argv, message):
    assert main(["export", str(tiny_checkpoint), "--out", str(tmp_path / "v"), "--device", "cpu", *argv]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "v").exists()


def test_export_not_a_checkpoint(tmp_path, capsys):
    assert main(["export", str(tmp_path), "--bits", "8"]) == 2
    assert "is not a checkpoint directory" in capsys.readouterr().err


def test_variants_flags_invalid_dir(tiny_variant, tmp_path, capsys):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(tiny_variant, bad)
    (bad / "vocab.txt").unlink()
    assert main(["variants", str(tmp_path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["status"].startswith("invalid:") and "vocab.txt" in rows[0]["status"]
