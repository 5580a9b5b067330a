"""`qserve serve --workers 2` as a user runs it (a real supervisor, two spawned uvicorn workers on one port, the tiny
model on CPU): every answer byte for byte the one-worker server's, both workers answering, each with its own
/metrics, a worker that cannot load stopping the server, and the flags it refuses.

    python -m pytest tests/integration/test_serve_workers.py -q
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmarks.harness import Server, per_worker, total
from benchmarks.harness.server import ROOT, code_env

httpx2 = pytest.importorskip("httpx2")
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="--workers shares a port by SO_REUSEPORT")

BODIES = [
    {"inputs": "A wonderful, moving film."},
    {"inputs": ["bad", "ok", "The plot is thin but it looks great."]},
    {"inputs": "The cinematography is gorgeous but the script is lazy. " * 12, "long_text": "windows:32:16"},
    {"inputs": "fine", "top_k": 1},
    {"inputs": []},
]


def _answers(url: str, repeat: int = 1) -> list[tuple[int, bytes]]:
    """Each body's status and bytes, every request on a fresh connection (so a multi-worker server spreads them)."""
    out = []
    for _ in range(repeat):
        for j, body in enumerate(BODIES):
            r = httpx2.post(
                f"{url}/v1/classify",
                content=json.dumps(body).encode(),
                timeout=30,
                trust_env=False,
                headers={"content-type": "application/json", "x-request-id": f"r{j}"},
            )
            out.append((r.status_code, r.content))
    return out


def _serve(tiny_onnx_int8, tmp_path, *extra: str) -> Server:
    args = [str(tiny_onnx_int8), "--device", "cpu", "--threads", "1", "--log-level", "warning", *extra]
    return Server(args, ROOT, tmp_path / f"serve{'-'.join(extra)}.log", tag=" ".join(extra) or "one worker")


def test_two_workers_answer_as_one_and_both_serve(tiny_onnx_int8, tmp_path):
    one = _serve(tiny_onnx_int8, tmp_path).wait_ready(120)
    try:
        expected = _answers(one.url)
    finally:
        one.stop()
    assert [s for s, _ in expected] == [200, 200, 200, 200, 422]
    two = _serve(tiny_onnx_int8, tmp_path, "--workers", "2").wait_ready(120)
    try:
        workers = per_worker(two.url, 2)  # both listen (each only once loaded)
        got = _answers(two.url, repeat=8)
        assert got == expected * 8  # byte for byte, whichever worker answered
        after = per_worker(two.url, 2)
        served = {w: total(s, "qserve_requests_total", route="/v1/classify") for w, s in after.items()}
        assert sorted(served) == ["0", "1"] and all(n > 0 for n in served.values()), served
        # per process: each worker counts its own requests, and together they counted every one
        assert sum(served.values()) == len(got)
        pids = {w: dict(lab)["pid"] for w, s in workers.items() for (n, lab) in s if n == "qserve_worker_info"}
        assert len(set(pids.values())) == 2
        models = httpx2.get(f"{two.url}/v1/models", timeout=30, trust_env=False).json()
        assert (models["engine"], models["workers"]) == ("uvicorn", 2) and models["worker"] in (0, 1)
    finally:
        two.stop()
    assert two.proc.returncode == 0  # a SIGTERM drains both workers and the supervisor exits cleanly


def test_a_worker_that_cannot_load_stops_the_server(tiny_onnx_int8, tmp_path):
    # --require-gate on a variant never gated: each worker's load fails, the supervisor exits 2 and says why
    cmd = [
        sys.executable,
        "-m",
        "qserve.serve",
        "serve",
        str(tiny_onnx_int8),
        "--device",
        "cpu",
        "--threads",
        "1",
        "--port",
        "0",
        "--workers",
        "2",
        "--require-gate",
        "--log-level",
        "warning",
    ]
    done = subprocess.run(cmd, cwd=ROOT, env=code_env(ROOT), capture_output=True, text=True, timeout=180)
    assert done.returncode == 2
    assert "could not load" in done.stderr and "has never been gated" in done.stderr


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--workers", "0"], "--workers must be 1..64"),
        (["--workers", "2", "--grpc-port", "0"], "--grpc-port (or QSERVE_GRPC_PORT) needs one worker"),
        (["--workers", "2", "--engine", "ray"], "--workers applies to --engine uvicorn"),
    ],
)
def test_refused_combinations_name_the_flags(tiny_onnx_int8, extra, words):
    cmd = [sys.executable, "-m", "qserve.serve", "serve", str(tiny_onnx_int8), "--device", "cpu", *extra]
    done = subprocess.run(cmd, cwd=ROOT, env=code_env(ROOT), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and words in done.stderr, done.stderr[-2000:]
