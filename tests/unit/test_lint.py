"""The house style is kept by a tool: `ruff check` and `ruff format --check` pass on the whole repository.

    python -m pytest tests/unit/test_lint.py -q
    # what makes them pass after a change (the first line only where an import sits inside a function), then
    # read the diff:
    python tests/unit/hoist_imports.py $(git ls-files 'qserve/*.py' 'exporters/*.py' 'benchmarks/*.py')
    ruff format . && ruff check --fix .

The rules live in pyproject.toml ([tool.ruff]): lines of at most 120 characters, pycodestyle and pyflakes, import
order, and imports at the top of a module except the lazy libraries (PLC0415 with TID253's banned list, which
tests/unit/test_imports.py explains and keeps equal to its LAZY + LAZY_OWN). ruff is pinned in the dev extra.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _ruff() -> list[str]:
    here = Path(sys.executable).with_name("ruff")
    found = str(here) if here.is_file() else shutil.which("ruff")
    if found is None:
        pytest.fail("ruff is not installed: pip install -e '.[dev]' (ruff is pinned there)")
    return [found]


def test_ruff_check_is_clean():
    r = subprocess.run(
        [*_ruff(), "check", "--no-cache", "--output-format", "concise", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]


def test_ruff_format_is_clean():
    r = subprocess.run(
        [*_ruff(), "format", "--check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, "run `ruff format .`:\n" + r.stdout[-6000:] + r.stderr[-2000:]
