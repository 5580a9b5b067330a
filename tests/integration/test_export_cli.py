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


def test_default_out_follows_the_run_dir_layout(tiny_checkpoint, tmp_path):
    """RUN/checkpoint (what `qserve train` and `qserve pipeline` write) exports into RUN/variants/<name>; any other
    checkpoint dir X into X-variants/<name>, beside it, never inside (that would change its hash)."""
    import shutil

    run_ckpt = tmp_path / "models" / "m-imdb" / "checkpoint"
    shutil.copytree(tiny_checkpoint, run_ckpt)
    assert main(["export", str(run_ckpt), "--variant", "torch-fp32", "--device", "cpu"]) == 0
    assert (tmp_path / "models" / "m-imdb" / "variants" / "torch-fp32" / "manifest.json").is_file()
    bare = tmp_path / "my-classifier"
    shutil.copytree(tiny_checkpoint, bare)
    assert main(["export", str(bare), "--variant", "torch-fp32", "--device", "cpu"]) == 0
    assert (tmp_path / "my-classifier-variants" / "torch-fp32" / "manifest.json").is_file()
    assert sorted(p.name for p in bare.iterdir()) == sorted(p.name for p in tiny_checkpoint.iterdir())


def test_the_same_export_again_is_kept_anything_else_needs_force(tiny_checkpoint, tmp_path, capsys):
    """Re-running an export that already produced this variant (same checkpoint hash, options, policy) keeps it,
    so the README's tour runs after `make demo`; other options, or a tampered variant, still need --force."""
    out = tmp_path / "int8"
    args = [
        "export",
        str(tiny_checkpoint),
        "--bits",
        "8",
        "--out",
        str(out),
        "--device",
        "cpu",
        "--calibration-samples",
        "4",
    ]
    assert main(args) == 0
    before = (out / "manifest.json").read_bytes()
    capsys.readouterr()
    assert main(args) == 0
    assert "already holds this export" in capsys.readouterr().out
    assert (out / "manifest.json").read_bytes() == before
    assert main([*args[:-1], "5"]) == 2  # another option: not the same export
    assert "already exists; pass --force" in capsys.readouterr().err
    assert main([*args, "--long-text", "tail"]) == 2  # another policy
    assert "already exists; pass --force" in capsys.readouterr().err
    (out / "tokenizer.json").write_text("{}")  # tampered: never kept as "the same"
    assert main(args) == 2
    assert "already exists; pass --force" in capsys.readouterr().err
    assert main([*args, "--force"]) == 0
    from qserve.verify import verify

    assert verify(out).spec.options == {"calibration_samples": 4}  # rebuilt whole: the tampered file is gone


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--bits", "8", "--backend", "torch"], "valid combinations"),
        ([], "say what to export"),
        (["--all", "--bits", "8"], "do not combine"),
        (["--bits", "8", "--block-size", "64"], "--block-size applies to onnx-int4, not onnx-int8"),
        (["--bits", "4", "--backend", "bnb", "--no-smooth"], "--smooth applies to onnx-int8, not bnb-nf4"),
        (["--bits", "8", "--keep-fp32", "nonesuch"], "'nonesuch' matches no MatMul"),
        (["--bits", "8", "--calibration-samples", "0"], "calibration_samples for onnx-int8 must be an integer from 1"),
        (["--bits", "8", "--no-clip"], "--clip applies to bnb-fp4, bnb-nf4, not onnx-int8"),
        (["--bits", "4", "--no-correct-bias"], "--correct-bias applies to onnx-int8, not onnx-int4"),
        (
            ["--bits", "4", "--backend", "bnb", "--dtype", "fp4", "--calibration-samples", "2000"],
            "calibration_samples for bnb-fp4 must be an integer from 1 to 1024 (training texts that calibrate "
            "the weight clipping; got 2000)",
        ),
    ],
)
def test_export_bad_flags(tiny_checkpoint, tmp_path, capsys, argv, message):
    assert main(["export", str(tiny_checkpoint), "--out", str(tmp_path / "v"), "--device", "cpu", *argv]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "v").exists()


def test_export_int8_flags_reach_the_exporter(tiny_checkpoint, tmp_path):
    out = tmp_path / "int8"
    assert (
        main(
            [
                "export",
                str(tiny_checkpoint),
                "--bits",
                "8",
                "--out",
                str(out),
                "--device",
                "cpu",
                "--no-smooth",
                "--no-correct-bias",
                "--keep-fp32",
                "layer.1/ffn/lin2",
            ]
        )
        == 0
    )
    m = json.loads((out / "manifest.json").read_text())
    assert m["spec"]["options"] == {"smooth": False, "correct_bias": False, "keep_fp32": "layer.1/ffn/lin2"}
    assert "bias_correction" not in m["onnx"]
    assert "smoothing" not in m["onnx"] and m["onnx"]["kept_fp32"] == [
        "/distilbert/transformer/layer.1/ffn/lin2/MatMul"
    ]


def test_export_fp4_flags_reach_the_exporter(tiny_checkpoint, tmp_path):
    out = tmp_path / "fp4"
    assert (
        main(
            [
                "export",
                str(tiny_checkpoint),
                "--bits",
                "4",
                "--backend",
                "bnb",
                "--dtype",
                "fp4",
                "--out",
                str(out),
                "--device",
                "cpu",
                "--calibration-samples",
                "3",
            ]
        )
        == 0
    )
    m = json.loads((out / "manifest.json").read_text())
    assert m["spec"]["options"] == {"calibration_samples": 3}
    assert m["bnb"]["clipping"]["calibration"] == "the 3 parity probe texts (no dataset recorded with the checkpoint)"
    out2 = tmp_path / "fp4-plain"
    assert (
        main(
            [
                "export",
                str(tiny_checkpoint),
                "--bits",
                "4",
                "--backend",
                "bnb",
                "--dtype",
                "fp4",
                "--out",
                str(out2),
                "--device",
                "cpu",
                "--no-clip",
            ]
        )
        == 0
    )
    assert "clipping" not in json.loads((out2 / "manifest.json").read_text())["bnb"]


def test_export_not_a_checkpoint(tmp_path, capsys):
    assert main(["export", str(tmp_path), "--bits", "8"]) == 2
    assert "is not a checkpoint directory" in capsys.readouterr().err


def test_variants_flags_invalid_dir(tiny_variant, tmp_path, capsys):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(tiny_variant, bad)
    # tokenizer.json: the file transformers 5's save_pretrained always writes (it writes no vocab.txt)
    (bad / "tokenizer.json").unlink()
    assert main(["variants", str(tmp_path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["status"].startswith("invalid:") and "tokenizer.json" in rows[0]["status"]


def test_export_help_derives_option_flags_from_the_registry(capsys):
    with pytest.raises(SystemExit):
        main(["export", "--help"])
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "--clip, --no-clip bnb-nf4, bnb-fp4: clip each 64-weight block" in out
    assert "(default off for bnb-nf4, on for bnb-fp4)" in out
    assert (
        "--calibration-samples CALIBRATION_SAMPLES bnb-nf4, bnb-fp4: training texts that calibrate the "
        "clipping (default 64); onnx-int8:"
    ) in out
    assert "ov-int8: training texts that calibrate NNCF's quantization (default 300)" in out
    assert "--backend {torch,bnb,onnx,openvino}" in out
    assert "on CPU: 32 -> onnx-fp32, 16 -> torch-bf16, 8 -> onnx-int8, 4 -> onnx-int4" in out
