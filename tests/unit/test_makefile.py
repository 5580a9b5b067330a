"""The Makefile's install stamp and its one ONNX Runtime flavour, read from what `make -n` would run (nothing is
installed; the real switch cpu -> gpu -> cpu was run once in a scratch clone: docs/gpu.md).

    python -m pytest tests/unit/test_makefile.py -q
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")


@pytest.fixture
def checkout(tmp_path):
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / ".venv").mkdir()
    return tmp_path


def make(where: Path, *args: str, dry: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", *(["-n"] if dry else []), "install", *args],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def stamp_of(out: str) -> str:
    return re.search(r"touch (\.venv/\.installed-\d+)", out).group(1)


def test_the_stamp_is_keyed_on_the_extras_and_the_other_flavour_goes_first(checkout):
    cpu = make(checkout, "EXTRAS=cpu,dev").stdout
    assert "uninstall --quiet -y onnxruntime-gpu" in cpu and ".[toolkit,cpu,dev]" in cpu
    (checkout / stamp_of(cpu)).touch()  # installed with the cpu extra
    assert "Nothing to be done" in make(checkout, "EXTRAS=cpu,dev").stdout
    gpu = make(checkout, "EXTRAS=gpu,dev").stdout  # another key: installs again, the CPU build removed first
    assert stamp_of(gpu) != stamp_of(cpu)
    lines = gpu.splitlines()
    removed = next(i for i, ln in enumerate(lines) if "uninstall --quiet -y onnxruntime" in ln and "-gpu" not in ln)
    installed = next(i for i, ln in enumerate(lines) if ".[toolkit,gpu,dev]" in ln)
    assert removed < installed
    assert stamp_of(
        make(checkout, "EXTRAS=gpu,dev", "TORCH_INDEX=https://download.pytorch.org/whl/cu128").stdout
    ) != stamp_of(gpu)
    (checkout / "pyproject.toml").write_text((checkout / "pyproject.toml").read_text() + "\n# changed\n")
    assert stamp_of(make(checkout, "EXTRAS=cpu,dev").stdout) != stamp_of(cpu)


def test_extras_naming_both_flavours_are_refused_before_anything_runs(checkout):
    r = make(checkout, "EXTRAS=cpu,gpu,dev", "PY=false", dry=False)
    assert r.returncode != 0 and "names both cpu and gpu" in r.stderr
    assert not any((checkout / ".venv").iterdir())
