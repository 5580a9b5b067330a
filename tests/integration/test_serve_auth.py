"""Bearer auth, settings from env, the CLI process end to end, and the load tool's safety bounds.

python -m pytest tests/integration/test_serve_auth.py -q
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qserve import QserveError

httpx2 = pytest.importorskip("httpx2")

KEY = "s3cret-token-9f8e7d"


@pytest.fixture(scope="module")
def auth_server(tiny_variant):
    import torch

    from qserve.serve.app import create_app
    from qserve.serve.infra.config import ServeConfig
    from qserve.serve.infra.uvicorn_server import ServerThread

    threads = torch.get_num_threads()
    cfg = ServeConfig(variant_dir=str(tiny_variant), threads=1, api_key=KEY)
    srv = ServerThread(create_app(cfg), log_level="info").start()  # info: access logs reach caplog
    yield srv
    srv.stop()
    torch.set_num_threads(threads)


def test_auth_rejects_missing_and_wrong_tokens_and_never_logs_them(auth_server, caplog):
    caplog.set_level(logging.DEBUG)
    wrong = "wrong-token-0a1b2c3d"
    with httpx2.Client(base_url=auth_server.url, timeout=30, trust_env=False) as c:
        for _ in range(300):  # probes need no token
            if c.get("/ready").status_code == 200:
                break
            time.sleep(0.02)
        assert c.get("/health").status_code == 200 and c.get("/v2/health/ready").status_code == 200
        body = {"inputs": "hello"}
        r = c.post("/v1/classify", json=body)
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
        assert "Authorization: Bearer" in r.json()["error"]
        r = c.post("/v1/classify", json=body, headers={"Authorization": f"Bearer {wrong}"})
        assert r.status_code == 401 and wrong not in r.text
        assert c.post("/v1/classify", json=body, headers={"Authorization": KEY}).status_code == 401  # no scheme
        assert c.get("/metrics").status_code == 401 and c.get("/v1/models").status_code == 401
        # auth is decided before the body is looked at: a bad body without a token is still 401
        assert c.post("/v1/classify", content=b"{", headers={"content-type": "text/plain"}).status_code == 401
        ok = c.post("/v1/classify", json=body, headers={"Authorization": f"Bearer {KEY}"})
        assert ok.status_code == 200 and ok.json()["predictions"]
        spec = c.get("/openapi.json").json()
        assert spec["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "/v1/classify" in logged  # the access log did reach us ...
    assert KEY not in logged and wrong not in logged  # ... and holds neither token


def test_under_a_root_path_the_router_decides_on_the_route_it_routes_by(tiny_variant):
    """Behind a proxy that strips a prefix (uvicorn --root-path): the open paths, the refusals' error shape and the
    errors follow the route the router reaches, not the prefixed path."""
    from qserve.serve.app import create_app
    from qserve.serve.infra.config import ServeConfig
    from qserve.serve.infra.uvicorn_server import ServerThread

    srv = ServerThread(create_app(ServeConfig(variant_dir=str(tiny_variant), threads=1, api_key=KEY)))
    srv.server.config.root_path = "/api"  # each request's scope: root_path /api, path /api/...
    srv.start()
    auth = {"Authorization": f"Bearer {KEY}"}
    try:
        with httpx2.Client(base_url=srv.url, timeout=30, trust_env=False) as c:
            for _ in range(300):
                if c.get("/ready").status_code == 200:  # open, as without a root_path
                    break
                time.sleep(0.02)
            assert c.get("/health").status_code == 200 and c.get("/v2/health/live").status_code == 200
            assert c.get("/v1/models").status_code == 401  # not an open route
            refused = c.post("/predict", json={"inputs": "fine"})  # the router's 401 in TEI's own error shape
            assert refused.status_code == 401 and set(refused.json()) == {"error", "error_type"}
            bad = c.post("/predict", json={"inputs": 3}, headers=auth)  # the app's 422, in TEI's shape too
            assert bad.status_code == 422 and set(bad.json()) == {"error", "error_type"}
            ok = c.post("/v1/classify", json={"inputs": "fine"}, headers=auth)
            assert ok.status_code == 200 and ok.json()["predictions"]
            r = c.delete("/v2/models/m/infer", headers=auth)  # a 405's Allow: the route's own methods
            assert r.status_code == 405 and r.headers["allow"] == "POST"
    finally:
        srv.stop()


def test_config_precedence_flags_over_env_over_defaults():
    from qserve.serve.infra.config import ServeConfig, config_from_sources

    env = {"QSERVE_MAX_BATCH_SIZE": "8", "QSERVE_PORT": "9000", "QSERVE_API_KEY": "from-env-key"}
    cfg = config_from_sources({"port": 9100, "max_wait_ms": None}, env)
    assert (cfg.max_batch_size, cfg.port, cfg.api_key, cfg.max_wait_ms) == (
        8,
        9100,
        "from-env-key",
        ServeConfig.max_wait_ms,
    )
    with pytest.raises(QserveError, match="QSERVE_MAX_QUEUE='lots'"):
        config_from_sources({}, {"QSERVE_MAX_QUEUE": "lots"})
    with pytest.raises(QserveError, match=r"--max-queue .* must be >= --max-inputs"):
        config_from_sources({"max_queue": 4, "max_inputs": 8}, {})
    with pytest.raises(QserveError, match="--max-batch-size"):
        config_from_sources({"max_batch_size": 0}, {})


def test_cli_registers_serve_and_loadtest(tmp_path):
    from qserve.serve.cli import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["serve", "v", "--max-batch-size", "4", "--api-key", "k" * 8])
    assert args.command == "serve" and args.max_batch_size == 4 and args.host is None  # None: env/default decide
    args = parser.parse_args(["loadtest", "http://127.0.0.1:1", "--concurrency", "1,8", "--duration", "2"])
    assert args.command == "loadtest" and args.concurrency == "1,8"
    args = parser.parse_args(["serve", str(tmp_path)])
    with pytest.raises(QserveError, match="no manifest.json"):
        args.func(args)


def test_loadtest_refuses_non_loopback_targets_and_unbounded_runs():
    from qserve.loadtest import classify_url, run_loadtest

    assert classify_url("http://127.0.0.1:8000") == "http://127.0.0.1:8000/v1/classify"
    assert classify_url("http://localhost:8000/") == "http://localhost:8000/v1/classify"
    for url in ("http://10.1.2.3:8000", "http://8.8.8.8", "ftp://127.0.0.1"):
        with pytest.raises(QserveError, match="loopback"):
            classify_url(url)
    with pytest.raises(QserveError, match="--duration"):
        run_loadtest("http://127.0.0.1:9", [1], duration_s=10_000)
    with pytest.raises(QserveError, match="--concurrency"):
        run_loadtest("http://127.0.0.1:9", [0], duration_s=1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_cli_process_from_env_serves_and_exits_cleanly_on_sigterm(tiny_onnx_int8, tmp_path):
    port = _free_port()
    env = {
        **os.environ,
        "QSERVE_VARIANT_DIR": str(tiny_onnx_int8),
        "QSERVE_PORT": str(port),
        "QSERVE_THREADS": "1",
        "QSERVE_API_KEY": KEY,
        "HF_HUB_OFFLINE": "1",
    }
    root = Path(__file__).resolve().parents[2]
    log = open(tmp_path / "serve.log", "w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "qserve.serve", "serve"], cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        with httpx2.Client(base_url=f"http://127.0.0.1:{port}", timeout=30, trust_env=False) as c:
            for _ in range(600):
                try:
                    if c.get("/ready").status_code == 200:
                        break
                except httpx2.TransportError:
                    pass
                assert proc.poll() is None, (tmp_path / "serve.log").read_text()
                time.sleep(0.05)
            r = c.post("/v1/classify", json={"inputs": ["good", "bad"]}, headers={"Authorization": f"Bearer {KEY}"})
            assert r.status_code == 200 and len(r.json()["predictions"]) == 2
        proc.send_signal(signal.SIGTERM)
        # uvicorn shuts down gracefully, then re-raises the signal it captured: -SIGTERM is its clean exit.
        assert proc.wait(30) in (0, -signal.SIGTERM)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    text = (tmp_path / "serve.log").read_text()
    assert "shutdown complete" in text and KEY not in text


def test_metrics_public_opens_only_metrics(tiny_variant):
    from qserve.serve.app import create_app
    from qserve.serve.infra.config import ServeConfig
    from qserve.serve.infra.uvicorn_server import ServerThread

    cfg = ServeConfig(variant_dir=str(tiny_variant), threads=1, api_key=KEY, metrics_public=True)
    with ServerThread(create_app(cfg)) as srv, httpx2.Client(base_url=srv.url, trust_env=False) as c:
        r = c.get("/metrics")
        assert r.status_code == 200 and "qserve_open_connections" in r.text
        assert c.get("/v1/models").status_code == 401
        spec = c.get("/openapi.json").json()
        assert spec["paths"]["/metrics"]["get"]["security"] == [] and spec["security"] == [{"bearer": []}]
