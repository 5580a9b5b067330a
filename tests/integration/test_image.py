"""The serving image as a user runs it (docs/deploy.md): built by docker/build.sh (the Dockerfile's `serve` target,
no torch in it), started as non-root with a read-only root filesystem and a real onnx-int8 variant dir mounted
read-only, answering /v1/classify, KServe V2 infer and /v1/models as the same variant served from this venv does,
then draining on SIGTERM under load with no request lost.

    python -m pytest tests/integration/test_image.py -q

Needs a docker daemon this user can reach; without one it skips saying why, except under CI=true, where .ci/run
installs docker.io and starts dockerd first, so a missing docker fails. Builds reuse docker's layer cache and the
base image, so a run after the first rebuilds only the layer with qserve's own code.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from benchmarks.harness import Container, Server
from benchmarks.harness.drain import sigterm_under_load
from benchmarks.harness.server import ROOT
from qserve import QserveError
from qserve.extras import TOOLKIT_ONLY
from qserve.serve.infra.config import ServeConfig

httpx2 = pytest.importorskip("httpx2")

IMAGE = os.environ.get("QSERVE_TEST_IMAGE", "qserve")
TEXTS = ["A wonderful, moving film.", "bad", "The plot is thin but it looks great.", "fine " * 40]


def _docker_problem() -> str | None:
    if shutil.which("docker") is None:
        return "no docker command (Debian: apt-get install docker.io; .ci/run installs it under CI=true)"
    r = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=60, check=False)
    if r.returncode != 0:
        return f"docker cannot reach a daemon (start dockerd as root): {r.stderr.strip()[-300:]}"
    return None


@pytest.fixture(scope="module")
def docker():
    problem = _docker_problem()
    if problem is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true needs the image test to run: {problem}")
        pytest.skip(problem)


@pytest.fixture(scope="module")
def serve_image(docker) -> str:
    started = time.monotonic()
    r = subprocess.run(
        [str(ROOT / "docker" / "build.sh"), "serve"],
        cwd=ROOT,
        env={**os.environ, "IMAGE": IMAGE},
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert r.returncode == 0, f"docker/build.sh serve failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    print(f"image build: {time.monotonic() - started:.1f} s")
    return f"{IMAGE}:serve"


@pytest.fixture(scope="module")
def int8_variant(tiny_onnx_int8):
    # the container's user (uid 10001) reads the mount: pytest's temp dirs are the owner's only
    subprocess.run(["chmod", "-R", "a+rX", str(tiny_onnx_int8)], check=True)
    return tiny_onnx_int8


def _classify(url: str) -> list[list[dict]]:
    r = httpx2.post(f"{url}/v1/classify", json={"inputs": TEXTS, "top_k": None}, timeout=30, trust_env=False)
    assert r.status_code == 200, r.text
    return r.json()


def _v2(url: str, name: str) -> dict:
    body = {"inputs": [{"name": "text", "shape": [len(TEXTS)], "datatype": "BYTES", "data": TEXTS}]}
    r = httpx2.post(f"{url}/v2/models/{name}/infer", json=body, timeout=30, trust_env=False)
    assert r.status_code == 200, r.text
    return {o["name"]: o["data"] for o in r.json()["outputs"]}


def _models(url: str) -> list[dict]:
    """/v1/models' model entries, less the one that names the host's path (`dir`: /models in the container)."""
    got = httpx2.get(f"{url}/v1/models", timeout=30, trust_env=False).json()
    return [{k: v for k, v in m.items() if k != "dir"} for m in got["models"]]


def _same(a, b, path="") -> None:
    """Equal, floats to 1e-6."""
    if isinstance(a, float) or isinstance(b, float):
        assert a == pytest.approx(b, abs=1e-6), path
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{path}[{i}]")
    else:
        assert a == b, path


def test_the_image_serves_as_the_venv_does_and_drains_on_sigterm(serve_image, int8_variant, tmp_path):
    size = int(
        subprocess.run(
            ["docker", "image", "inspect", "-f", "{{.Size}}", serve_image], capture_output=True, text=True, check=True
        ).stdout
    )
    assert size <= 600e6, f"{serve_image} is {size / 1e6:.0f} MB (at most 600)"
    no_torch = subprocess.run(
        [
            "docker",
            "run",
            "--rm",
            "--entrypoint",
            "python",
            serve_image,
            "-c",
            f"import importlib.util as u; print([m for m in {TOOLKIT_ONLY!r} if u.find_spec(m)])",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    assert no_torch == "[]", no_torch

    venv = Server(
        [str(int8_variant), "--device", "cpu", "--threads", "1", "--log-level", "warning"],
        ROOT,
        tmp_path / "venv.log",
        tag="venv server",
    )
    box = Container(serve_image, int8_variant, "--threads", "1", "--log-level", "warning")
    try:
        try:
            ready_s = box.wait_ready(300)
        except QserveError as e:
            pytest.fail(str(e))
        print(f"container start to ready: {ready_s:.2f} s (beside the venv's server starting)")
        venv.wait_ready(300)
        assert box.inspect("{{.Config.User}}") == "10001:10001"
        assert box.inspect("{{.HostConfig.ReadonlyRootfs}}") == "true"
        labels = box.inspect("{{json .Config.Labels}}")
        assert "org.opencontainers.image.revision" in labels and "org.opencontainers.image.version" in labels

        models = _models(box.url)
        assert models == _models(venv.url) and len(models) == 1
        _same(_classify(box.url), _classify(venv.url))
        _same(_v2(box.url, models[0]["id"]), _v2(venv.url, models[0]["id"]))

        # SIGTERM under keep-alive and new-connection clients (qserve is PID 1): /ready fails at once, answers go
        # on through the drain (the image's default), nothing is lost (a reset counts as lost), the exit is 0.
        got = sigterm_under_load(box.url, TEXTS, box.signal, box.wait, ServeConfig().drain_seconds, 8, 4)
        print(f"SIGTERM under load: {got['answered']} answered ({got['after_signal']} after the signal)")
        assert not got["lost"] and not got["error_statuses"] and got["unready_ms"] is not None, got
        assert got["kept_closed"] == 8, got
        assert got["exit_code"] == 0, box.logs()
    finally:
        venv.stop()
        box.remove()
