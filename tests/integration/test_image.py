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
import threading
import time
import uuid

import pytest

from benchmarks.harness import Server
from benchmarks.harness.server import ROOT, free_port, wait_ready
from qserve import QserveError
from qserve.extras import TOOLKIT_ONLY

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
def int8_variant(tiny_checkpoint, tmp_path_factory):
    import exporters

    out = tmp_path_factory.mktemp("image") / "onnx-int8"
    exporters.export(tiny_checkpoint, "onnx-int8", out)
    # the container's user (uid 10001) reads the mount: pytest's temp dirs are the owner's only
    subprocess.run(["chmod", "-R", "a+rX", str(out)], check=True)
    return out


class Container:
    """`docker run` of the serving image: non-root, read-only root, /tmp a tmpfs, the variant at /models (ro)."""

    def __init__(self, image: str, variant, *args: str):
        self.name = f"qserve-test-{uuid.uuid4().hex[:8]}"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = ["docker", "run", "-d", "--name", self.name, "--read-only", "--tmpfs", "/tmp", "--user", "10001:10001"]
        # the host's network, so a client meets the server's own socket: behind docker's userland proxy (-p) a
        # connection made after the listener closed is accepted by the proxy and then reset, not refused
        cmd += ["--network", "host", "-e", "QSERVE_HOST=127.0.0.1", "-e", f"QSERVE_PORT={self.port}"]
        cmd += ["-v", f"{variant}:/models:ro", image, "serve", *args]
        self.started = time.monotonic()
        subprocess.run(cmd, check=True, capture_output=True, timeout=60)

    def wait_ready(self, timeout: float = 60.0) -> float:
        """Seconds from `docker run` to /ready answering 200; a container that exits first fails at once, its log
        in the message (not after the whole timeout)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                wait_ready(self.url, timeout=2.0, tag=f"container {self.name}")
                return time.monotonic() - self.started
            except QserveError:
                if self.inspect("{{.State.Running}}") != "true":
                    pytest.fail(f"container {self.name} exited before it was ready:\n{self.logs()[-3000:]}")
                if time.monotonic() > deadline:
                    pytest.fail(f"container {self.name} not ready after {timeout:.0f} s:\n{self.logs()[-3000:]}")

    def inspect(self, fmt: str) -> str:
        return subprocess.run(
            ["docker", "inspect", "-f", fmt, self.name], capture_output=True, text=True, check=True
        ).stdout.strip()

    def logs(self) -> str:
        return subprocess.run(["docker", "logs", self.name], capture_output=True, text=True, check=False).stderr

    def remove(self) -> None:
        subprocess.run(["docker", "rm", "-f", self.name], capture_output=True, check=False)


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
        ready_s = box.wait_ready(300)
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

        # SIGTERM while 8 clients post: every request the server accepted is answered 200; after the listener
        # closes a new connection is refused (never accepted, so not lost); the container exits 0. A connection
        # still in the kernel's accept queue when the listener closes is reset before the server ever read it:
        # counted apart (at most once per client, each stops there), never as an answer lost mid-request
        # (docs/deploy.md: an orchestrator stops routing before SIGTERM, so none arrive then).
        answered, lost, queued, stop, signalled = [], [], [], threading.Event(), threading.Event()

        def client(k: int) -> None:
            while not stop.is_set():
                try:
                    r = httpx2.post(
                        f"{box.url}/v1/classify",
                        json={"inputs": [f"{TEXTS[k % 4]} {k}"] * 4},
                        timeout=60,
                        trust_env=False,
                        headers={"connection": "close"},
                    )
                except httpx2.ConnectError:
                    return  # refused: the listener is closed
                except httpx2.ReadError as e:
                    # a fresh connection (Connection: close) reset with no byte of an answer: the accept queue's
                    (queued if "reset by peer" in str(e) and signalled.is_set() else lost).append(repr(e))
                    return
                except httpx2.HTTPError as e:
                    lost.append(repr(e))
                    return
                (answered if r.status_code == 200 else lost).append(r.status_code)

        threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30.0  # under load: as many answers as clients, not a fixed wait
        while len(answered) < len(threads) and not lost and time.monotonic() < deadline:
            time.sleep(0.05)
        before = len(answered)
        signalled.set()
        subprocess.run(["docker", "kill", "--signal", "TERM", box.name], check=True, capture_output=True)
        exit_code = subprocess.run(
            ["docker", "wait", box.name], capture_output=True, text=True, timeout=90, check=True
        ).stdout.strip()
        stop.set()
        for t in threads:
            t.join(60)
        print(
            f"SIGTERM under load: {len(answered)} answered ({before} before the signal), {len(lost)} lost, "
            f"{len(queued)} reset in the accept queue"
        )
        assert before > 0 and not lost and len(queued) <= len(threads), (lost, queued)
        assert exit_code == "0", box.logs()
    finally:
        venv.stop()
        box.remove()
