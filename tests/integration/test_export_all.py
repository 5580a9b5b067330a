"""`qserve export --all` on a checkpoint qserve did not train: failures are one line each, the rest go on.

    python -m pytest tests/integration/test_export_all.py -q

Real exporters on a tiny BERT (tests/tiny_archs.py) through the real CLI entry point.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_archs import build

from exporters.cli import OPTION_FLAGS
from qserve.cli import main
from qserve.placement import plan

LIMIT = ("onnx-int4", "bert")
REASON = "MatMulNBits has no kernel for it"


@pytest.fixture(scope="module")
def bert(tmp_path_factory) -> Path:
    return build("bert", tmp_path_factory.mktemp("byo") / "checkpoint")


def test_unsupported_is_refused_up_front(bert, tmp_path, capsys, monkeypatch):
    from qserve.variants import VARIANTS

    monkeypatch.setitem(VARIANTS[LIMIT[0]].unsupported, LIMIT[1], REASON)
    assert main(["export", str(bert), "--variant", "onnx-int4", "--out", str(tmp_path / "v")]) == 2
    assert f"qserve export: error: onnx-int4 unsupported for BERT: {REASON}" in capsys.readouterr().err
    assert not (tmp_path / "v").exists()


def test_all_goes_on_past_a_failed_and_an_unsupported_variant(bert, tmp_path, capsys, monkeypatch):
    """The quantizing variants fail for real (their exporters find no layer named by --keep-fp32): one stderr line
    each with the variant, the exception type and the message, no traceback. onnx-int4 is declared unsupported for BERT:
    skipped with its reason. Every other variant is written; the exit status is 1."""
    from qserve.variants import VARIANTS

    monkeypatch.setitem(VARIANTS[LIMIT[0]].unsupported, LIMIT[1], REASON)
    out = tmp_path / "variants"
    rc = main(
        [
            "export",
            str(bert),
            "--all",
            "--out",
            str(out),
            "--device",
            "cpu",
            "--keep-fp32",
            "nonesuch",
            "--calibration-samples",
            "2",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 1
    assert "Traceback" not in err
    assert f"skipped: onnx-int4 unsupported for BERT: {REASON}" in err
    runs = plan("cpu").runs
    skipped_ov = {n for n in runs if f"skipped: {n} unavailable on this CPU" in err}
    # every quantizing variant takes keep_fp32, and each refuses a name that matches nothing
    keepers = [n for n in runs if n in OPTION_FLAGS["keep_fp32"][1] and n != "onnx-int4" and n not in skipped_ov]
    failed = [ln.strip() for ln in err.splitlines() if "failed: " in ln]
    assert len(failed) == len(keepers) + 1 and "onnx-int8" in keepers, err
    for name, line in zip(keepers, failed):
        assert line.startswith(f"failed: {name}: QserveError: option keep_fp32: 'nonesuch' matches no "), line
    assert failed[-1] == "failed: " + ", ".join(keepers)  # the summary line
    written = {p.parent.name for p in out.glob("*/manifest.json")}
    assert written == set(runs) - set(keepers) - {"onnx-int4"} - skipped_ov
