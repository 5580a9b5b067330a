"""The typed contracts hold: mypy (configured in pyproject.toml) is clean over qserve/, exporters/ and
benchmarks/harness/, and a wrong call across a module boundary fails it.

    python -m pytest tests/unit/test_types.py -q

The contracts it checks are the ones other modules build on: the runtime contract
(qserve/runtime/contract.py: ModelRuntime, which every backend's Runtime implements), the Answer every
protocol encodes (qserve/serve/core/answer.py), ServeState.submit, the batcher's InferFn. As tests/unit/test_layers.py
proves the import contracts, the second test copies the packages, injects three wrong calls and requires mypy
to name each. Both runs share one cache directory (in tmp), so the second checks only what changed: about
10 s of CPU for the first run, 2-3 s for the second, on 2 cores.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mypy", reason="mypy is in the dev extra (pip install -e '.[dev]')")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mypy-cache")


def mypy(root: Path, cache: Path) -> subprocess.CompletedProcess:
    # the [tool.mypy] settings of root's pyproject.toml: files = qserve, exporters, benchmarks/harness
    env = {**os.environ, "PYTHONPATH": str(root), "MYPY_FORCE_COLOR": "0"}
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(cache), "--no-error-summary", "--no-pretty"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_mypy_is_clean(cache):
    r = mypy(ROOT, cache)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == "", r.stdout


def _append(path: Path, code: str) -> int:
    """Append `code` to a module; returns the line number its first line gets."""
    text = path.read_text(encoding="utf-8")
    path.write_text(text + "\n\n" + code, encoding="utf-8")
    return text.count("\n") + 3


def test_a_wrong_call_across_a_module_boundary_fails_the_check(tmp_path, cache):
    for name in ("qserve", "exporters", "benchmarks"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__", "reports"))
    shutil.copy2(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    serve = tmp_path / "qserve" / "serve"
    # 1. a protocol module queues one text as if it were a list (the InferenceRequest wants list[str])
    submit_line = (
        _append(
            serve / "protocols" / "v1.py",
            (
                "async def _wrong_submit(st: ServeState, request: Request) -> None:\n"
                "    model = st.model(None, request)\n"
                "    rid = request.state.request_id\n"
                "    await st.submit(InferenceRequest(model.name, 'one text', ORIGIN, request.scope, rid))\n"
            ),
        )
        + 3
    )
    # 2. it encodes a field the Answer does not have
    answer_line = (
        _append(
            serve / "protocols" / "v2" / "tensors.py",
            ("def _wrong_field(a: Answer) -> list[float]:\n    return list(a.probabilities)\n"),
        )
        + 1
    )
    # 3. serving hands the runtime contract a str where it takes the batch's texts
    runtime_line = (
        _append(
            serve / "core" / "served_model.py",
            ("def _wrong_texts(runtime: ModelRuntime) -> Classification:\n    return runtime.classify('one text')\n"),
        )
        + 1
    )
    r = mypy(tmp_path, cache)
    out = r.stdout
    assert r.returncode == 1, out + r.stderr
    assert (
        f'qserve/serve/protocols/v1.py:{submit_line}: error: Argument 2 to "InferenceRequest" has '
        'incompatible type "str"; expected "list[str]"'
    ) in out, out
    assert (
        f'qserve/serve/protocols/v2/tensors.py:{answer_line}: error: "Answer" has no attribute "probabilities"' in out
    ), out
    assert (
        f'qserve/serve/core/served_model.py:{runtime_line}: error: Argument 1 to "classify" of "ModelRuntime" has '
        'incompatible type "str"; expected "list[str]"'
    ) in out, out
    assert len([line for line in out.splitlines() if ": error:" in line]) == 3, out  # nothing else broke
