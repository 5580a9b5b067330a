"""`qserve serve --engine ray` without --ray-address starts its own local Ray, even where `ray start` left a cluster.

    python -m pytest tests/integration/test_serve_ray_local.py -q

A plain ray.init() joins the cluster `ray start` recorded in Ray's temp dir (running, or
dead with its address file left behind) and then refuses num_cpus; the engine must start a
local instance as documented. The test runs a real `ray start` and the real CLI in child
processes under their own RAY_TMPDIR, so the recorded address, the sessions and every Ray
process they start are this test's alone: it never touches the default /tmp/ray or another
Ray instance on the machine. That is also why cleanup does not use `ray stop`, which stops
every Ray process of the user: it ends exactly the processes whose command line names this
temp dir, and their children.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

httpx2 = pytest.importorskip("httpx2")
psutil = pytest.importorskip("psutil")  # a dependency of Ray, which the ray extra installs
pytest.importorskip("ray")

WHY = "the fastest variant meeting its agreement bar (test report)"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_bin(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


def _end_processes_under(temp_dir: str, grace: float = 15) -> None:
    """Terminate every process whose command line names temp_dir, with all its children; kill what is left after
    `grace` seconds (0: kill at once, as a crash would) and wait until none runs."""
    procs: dict[int, psutil.Process] = {}
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(temp_dir in arg for arg in p.info["cmdline"] or []):
                procs[p.pid] = p
                procs.update({c.pid: c for c in p.children(recursive=True)})
        except psutil.Error:
            pass
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 30)):
        alive = [p for p in procs.values() if _running(p)]
        for p in alive:
            try:
                p.send_signal(sig)
            except psutil.Error:
                pass
        deadline = time.monotonic() + wait
        while (alive := [p for p in alive if _running(p)]) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not alive:
            return


def _running(p: psutil.Process) -> bool:
    try:  # a zombie has exited; only its parent (maybe init) has yet to reap it
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.fixture
def ray_tmpdir():
    """A private Ray temp dir (short: Ray's unix sockets live under it) and an env that points Ray at it."""
    temp_dir = tempfile.mkdtemp(prefix="qs-ray-", dir="/tmp")
    env = {**os.environ, "RAY_TMPDIR": temp_dir, "HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    try:
        yield temp_dir, env
    finally:
        _end_processes_under(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _model_dir(tmp_path: Path, variant: Path) -> Path:
    """A `qserve pipeline`-style model dir whose report recommends `variant`."""
    model_dir = tmp_path / "run"
    (model_dir / "report").mkdir(parents=True)
    rec = {"variant": variant.name, "why": WHY, "dir": str(variant), "cpu": "Test CPU"}
    (model_dir / "report" / "report.json").write_text(json.dumps({"format": "qserve-bench/test", "recommended": rec}))
    return model_dir


def _serve_and_ask(model_dir: Path, env: dict[str, str], log: Path, more: tuple[str, ...] = ()) -> dict:
    """Run `qserve serve MODEL_DIR [MORE...] --engine ray`, return its /v1/models, stop it with SIGINT (exit 0)."""
    port = _free_port()
    cmd = [
        sys.executable,
        "-m",
        "qserve",
        "serve",
        str(model_dir),
        *more,
        "--engine",
        "ray",
        "--replicas",
        "1",
        "--threads",
        "1",
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        with httpx2.Client(base_url=f"http://127.0.0.1:{port}", timeout=10, trust_env=False) as c:
            while True:
                assert proc.poll() is None, f"qserve serve exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
                assert time.monotonic() < deadline, f"no /v1/models within 240 s:\n{log.read_text()[-3000:]}"
                try:
                    r = c.get("/v1/models")
                    if r.status_code == 200:
                        info = r.json()
                        break
                except httpx2.TransportError:
                    pass
                time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        if "--drain-seconds" in more:  # the drain: every replica fails /ready, Ray's proxy answers on meanwhile
            with httpx2.Client(base_url=f"http://127.0.0.1:{port}", timeout=10, trust_env=False) as c:
                while c.get("/ready").status_code != 503:
                    assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                    time.sleep(0.1)
                info["drain_answer"] = c.post("/v1/classify", json={"inputs": ["A wonderful film."]}).status_code
            proc.send_signal(signal.SIGINT)  # a second signal: at once, not after the 30 s drain
        assert proc.wait(timeout=90) == 0, log.read_text()[-3000:]
        return info
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def test_local_instance_beside_a_running_and_a_crashed_ray_start_cluster(ray_tmpdir, tiny_variant, tmp_path):
    temp_dir, env = ray_tmpdir
    model_dir = _model_dir(tmp_path, tiny_variant)
    started = subprocess.run(
        [
            _ray_bin("ray"),
            "start",
            "--head",
            "--num-cpus=1",
            "--port=0",
            "--include-dashboard=false",
            f"--dashboard-port={_free_port()}",
            f"--dashboard-agent-listen-port={_free_port()}",
            f"--ray-client-server-port={_free_port()}",
            "--disable-usage-stats",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-2000:]
    address_file = Path(temp_dir) / "ray" / "ray_current_cluster"
    address = address_file.read_text().strip()
    assert address, "ray start recorded no address"

    # 1. the cluster is running: a plain ray.init(num_cpus=...) would join it and raise ValueError
    info = _serve_and_ask(model_dir, env, tmp_path / "running.log")
    log = (tmp_path / "running.log").read_text()
    assert "num_cpus and num_gpus must not be provided" not in log
    assert f"Ray records a cluster at {address}" in log and f"--ray-address {address}" in log
    assert info["engine"] == "ray" and info["replica_count"] == 1
    (model,) = info["models"]
    # the selection reaches the Ray replicas, as it does the uvicorn engine
    assert model["id"] == tiny_variant.name and model["selection"]["variant"] == tiny_variant.name
    assert model["selection"]["why"] == WHY and model["selection"]["measured_on"] == "Test CPU"
    assert address_file.read_text().strip() == address  # the local instance recorded nothing over it

    # 2. the cluster crashed: its address file stays behind, pointing at nothing. SIGKILL is that crash (and
    # quick: ray start's GCS server ignores SIGTERM, so a polite stop would only wait out the grace period)
    _end_processes_under(temp_dir, grace=0)
    assert address_file.read_text().strip() == address
    # ... and a second model by name: the replica holds both (the names travel from the command line)
    info = _serve_and_ask(model_dir, env, tmp_path / "stale.log", more=(f"b={tiny_variant}", "--drain-seconds", "30"))
    assert info["engine"] == "ray" and info["models"][0]["selection"]["variant"] == tiny_variant.name
    assert info["drain_answer"] == 200
    assert [m["id"] for m in info["models"]] == [tiny_variant.name, "b"] and info["default"] == tiny_variant.name
    assert info["models"][1]["version"] == info["models"][0]["version"]  # the same variant dir
    assert f"Ray records a cluster at {address}" in (tmp_path / "stale.log").read_text()
