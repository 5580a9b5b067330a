"""`qserve predict --engine ray` on a real local Ray instance: Ray Data's actor pool writes the local engine's output.

python -m pytest tests/integration/test_predict_ray.py -q
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("ray.data")
pytest.importorskip("pyarrow")

from test_predict import LONG, _texts, _write_jsonl  # noqa: E402


def test_ray_engine_writes_exactly_the_local_engines_output(tiny_checkpoint, tmp_path):
    import exporters
    from qserve.cli import main

    variant = exporters.export(tiny_checkpoint, "onnx-int8", tmp_path / "onnx-int8") and tmp_path / "onnx-int8"
    texts = _texts(90) + [LONG]
    rows = [{"id": i, "text": t if i != 5 else "", "n": i * 0.5} for i, t in enumerate(texts)]  # row 5: an error
    src = _write_jsonl(tmp_path / "in.jsonl", rows)
    common = [
        "predict",
        str(variant),
        str(src),
        "--chunk-rows",
        "16",
        "--long-text",
        "windows:32:24:mean",
        "--all-scores",
        "--quiet",
    ]
    assert main([*common, "--out", str(tmp_path / "local.jsonl")]) == 0
    # Ray in its own process, as a user runs it: a Ray instance started inside pytest's process outlives
    # ray.shutdown() in native threads that crash the interpreter's exit (seen as a segfault after the suite)
    ray_run = subprocess.run(
        [
            sys.executable,
            "-m",
            "qserve",
            *common,
            "--out",
            str(tmp_path / "ray.jsonl"),
            "--engine",
            "ray",
            "--replicas",
            "2",
            "--threads",
            "1",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=600,
    )
    assert ray_run.returncode == 0, ray_run.stderr[-3000:]
    local, ray_out = (tmp_path / "local.jsonl").read_bytes(), (tmp_path / "ray.jsonl").read_bytes()
    assert ray_out == local  # same rows, same order, same answers, byte for byte
    got = [json.loads(line) for line in local.splitlines()]
    assert [g["id"] for g in got] == list(range(91)) and got[5]["error"] == "text is empty"
    assert got[90]["windows"] > 1
