"""The drain at SIGTERM, on real servers in child processes with the default --drain-seconds (docs/deploy.md).

    python -m pytest tests/integration/test_serve_drain.py -q

Under keep-alive and new-connection clients nothing is lost (a reset counts as lost, a refused connect does not),
/ready fails at once while answers go on, each answer in the drain closes its connection; a connection that has
not sent its request when the listener closes is answered, not closed; what the accept queue holds at the close is
answered; a second signal stops at once. benchmarks/drain_bench.py is the proof by repetition (20 SIGTERMs each).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import signal
import socket
import subprocess
import time

import numpy as np
import pytest
from conftest import serving

from benchmarks.harness import ROOT, Server, code_env, free_port
from benchmarks.harness.drain import sigterm_under_load
from qserve.serve.infra.config import ServeConfig

BODY = json.dumps({"inputs": ["A wonderful film."]}).encode()
TEXTS = ["A wonderful, moving film.", "bad", "The plot is thin but it looks great.", "fine " * 40]


def _server(variant, tmp_path, *more: str, tag: str = "server") -> Server:
    env = code_env(ROOT)
    env.pop("QSERVE_DRAIN_SECONDS")  # the default drain period
    args = [str(variant), "--threads", "1", "--log-level", "info", *more]
    return Server(args, ROOT, tmp_path / f"{tag}.log", tag=tag, env=env).wait_ready(120)


def _wait(srv: Server, timeout: float) -> int | None:
    try:
        return srv.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


REQUEST = b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
    len(BODY),
    BODY,
)


@pytest.mark.parametrize("workers", [1, 2], ids=["one process", "--workers 2"])
def test_sigterm_under_load_loses_nothing(tiny_onnx_int8, tmp_path, workers):
    srv = _server(tiny_onnx_int8, tmp_path, "--workers", str(workers))
    log = tmp_path / "server.log"
    while log.read_text().count("Application startup complete") < workers:  # /ready is one worker's answer
        assert srv.proc.poll() is None, log.read_text()[-3000:]
        time.sleep(0.1)
    try:
        drain = ServeConfig().drain_seconds
        got = sigterm_under_load(
            srv.url, TEXTS, lambda: srv.proc.send_signal(signal.SIGTERM), lambda t: _wait(srv, t), drain, 16, 4
        )
    finally:
        srv.stop()
    log = log.read_text()
    assert not got["lost"] and not got["error_statuses"], got
    assert got["after_signal"] > 0 and got["unready_ms"] is not None, got  # answered on, while /ready said 503
    assert got["kept_closed"] == 16, got  # every keep-alive client was told Connection: close in the drain
    assert got["exit_code"] in (0, -signal.SIGTERM), log[-3000:]  # one process ends by the re-raised signal
    assert log.count("draining for") == workers and log.count("drain over after") == workers, log[-3000:]


def test_a_connection_without_its_request_at_the_close_is_answered(tiny_onnx_int8, tmp_path):
    """Connected during the drain, its request sent only after the listener closed: answered, Connection: close."""
    srv = _server(tiny_onnx_int8, tmp_path, "--drain-seconds", "1")
    try:
        early = socket.create_connection(("127.0.0.1", srv.port))
        srv.proc.send_signal(signal.SIGTERM)
        log = tmp_path / "server.log"
        deadline = time.monotonic() + 30
        while "drain over" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "drain over" in log.read_text()
        with pytest.raises(ConnectionRefusedError):  # the listener is closed: a new connection is refused
            socket.create_connection(("127.0.0.1", srv.port), timeout=5)
        early.sendall(REQUEST)
        answer = early.makefile("rb").read()  # to EOF: the server closes after answering
        assert answer.startswith(b"HTTP/1.1 200") and b"connection: close" in answer.lower(), answer[:300]
        assert srv.proc.wait(30) in (0, -signal.SIGTERM)
    finally:
        srv.stop()


def test_through_the_drain_http_and_grpc_answer_unready_and_a_second_signal_stops_at_once(tiny_onnx_int8, tmp_path):
    grpcclient = pytest.importorskip("tritonclient.grpc")
    port = free_port()
    srv = _server(tiny_onnx_int8, tmp_path, "--drain-seconds", "600", "--grpc-port", str(port))
    try:
        c = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        assert c.is_server_ready()
        srv.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        while c.is_server_ready() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not c.is_server_ready()
        inp = grpcclient.InferInput("text", [1], "BYTES")
        inp.set_data_from_numpy(np.array([b"A wonderful film."], dtype=object))
        assert c.infer(tiny_onnx_int8.name, [inp]).as_numpy("probabilities").shape == (1, 2)
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
        conn.request("GET", "/ready")
        assert conn.getresponse().status == 503
        conn.close()
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
        conn.request("POST", "/v1/classify", BODY, {"Content-Type": "application/json"})
        r = conn.getresponse()
        assert r.status == 200 and r.getheader("connection") == "close"
        srv.proc.send_signal(signal.SIGTERM)
        assert _wait(srv, 60) is not None, "a second SIGTERM did not end a 600 s drain"
    finally:
        srv.stop()


def test_the_accept_queue_is_answered_at_the_close(tiny_variant):
    """Connections the kernel accepted but the loop had not (its accept paused here) are answered at the close."""
    with serving(ServeConfig(variant_dir=str(tiny_variant))) as srv:
        loop = srv.server.servers[0].get_loop()
        listener = srv.server.servers[0].sockets[0]
        asyncio.run_coroutine_threadsafe(_pause(loop, listener.fileno()), loop).result(10)
        clients = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(3)]
        for c in clients:
            c.sendall(REQUEST)
        srv.stop()
    for c in clients:
        c.settimeout(30)
        assert c.makefile("rb").read().startswith(b"HTTP/1.1 200")


async def _pause(loop: asyncio.AbstractEventLoop, fd: int) -> None:
    loop.remove_reader(fd)  # asyncio accepts no more: the kernel queues them, as on a busy loop
