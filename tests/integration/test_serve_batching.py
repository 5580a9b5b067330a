"""Batching under pressure on a real uvicorn: 429 on a full queue, failure isolation, readiness, drain.

    python -m pytest tests/integration/test_serve_batching.py -q

The runtime is the real tiny variant, wrapped (through the app factory's loader)
so a test can hold the inference thread on a marker text or make a batch raise
on one; nothing here depends on timing. A test that holds the first request of a lone
client serves with --no-inline-lone: inline, that request would hold the event loop
itself (test_serve_inline.py covers that path and what it gives up: the 504).
"""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

httpx2 = pytest.importorskip("httpx2")

HOLD, BOOM = "HOLD the worker", "BOOM this batch"


class Wrapped:
    """The real runtime, plus a gate (blocks on HOLD) and a fault (raises on BOOM)."""

    def __init__(self, inner):
        self.inner = inner
        self.entered = threading.Event()
        self.release = threading.Event()
        self.batches: list[list[str]] = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def close(self):
        """The module fixture owns the real runtime; the app's shutdown must not close it."""

    def classify(self, texts, policy=None):
        self.batches.append(list(texts))
        if HOLD in texts:
            self.entered.set()
            assert self.release.wait(30), "test never released the worker"
        if BOOM in texts:
            raise RuntimeError("injected fault")
        return self.inner.classify(texts, policy)


@pytest.fixture(scope="module")
def runtime(tiny_runtime):
    return tiny_runtime


def _start(tiny_variant, loader, **cfg):
    from qserve.serve.app import create_app
    from qserve.serve.infra.config import ServeConfig
    from qserve.serve.infra.uvicorn_server import ServerThread

    return ServerThread(create_app(ServeConfig(variant_dir=str(tiny_variant), **cfg), loader=loader)).start()


async def _until(predicate, what: str, tries: int = 600) -> None:
    for _ in range(tries):
        if await predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def _gauge(metrics_text: str, name: str) -> float:
    """A series' value summed over its labels (one model here: its `model` label)."""
    values = [
        float(line.rsplit(" ", 1)[1]) for line in metrics_text.splitlines() if line.startswith((name + " ", name + "{"))
    ]
    if not values:
        raise KeyError(name)
    return sum(values)


async def _queued(c, n: int) -> bool:
    return _gauge((await c.get("/metrics")).text, "qserve_queue_depth") == n


def _client(url, n=32):
    return httpx2.AsyncClient(base_url=url, timeout=30, trust_env=False, limits=httpx2.Limits(max_connections=n))


def test_full_queue_answers_429_at_once_and_accepted_work_completes(tiny_variant, runtime):
    w = Wrapped(runtime)
    srv = _start(
        tiny_variant, lambda cfg: w, max_batch_size=1, max_queue=4, max_inputs=4, max_wait_ms=0, inline_lone=False
    )

    async def go():
        async with _client(srv.url) as c:
            await _until(lambda: _ready(c), "ready")
            held = asyncio.create_task(c.post("/v1/classify", json={"inputs": HOLD}))
            await asyncio.to_thread(w.entered.wait, 30)
            queued = [asyncio.create_task(c.post("/v1/classify", json={"inputs": f"queued {i}"})) for i in range(4)]
            await _until(lambda: _queued(c, 4), "4 queued texts")
            flood = await asyncio.gather(*(c.post("/v1/classify", json={"inputs": f"flood {i}"}) for i in range(10)))
            # Refused before the body is read: even a malformed body gets 429, not 400 (nothing was parsed).
            unparsed = await c.post(
                "/v1/classify", content=b'{"inputs": ', headers={"content-type": "application/json"}
            )
            metrics = (await c.get("/metrics")).text
            w.release.set()
            return await held, await asyncio.gather(*queued), flood + [unparsed], metrics

    try:
        held, queued, flood, metrics = asyncio.run(go())
    finally:
        w.release.set()
        srv.stop()
    assert held.status_code == 200 and [r.status_code for r in queued] == [200] * 4
    assert [r.status_code for r in flood] == [429] * 11  # answered while the worker was still held
    assert _gauge(metrics, "qserve_rejection_seconds_count") == 11  # each refusal timed by the server
    assert all(int(r.headers["retry-after"]) >= 1 for r in flood)
    assert "queue is full" in flood[0].json()["error"]


async def _ready(c) -> bool:
    return (await c.get("/ready")).status_code == 200


def test_failing_batch_fails_only_its_own_request(tiny_variant, runtime):
    w = Wrapped(runtime)
    srv = _start(tiny_variant, lambda cfg: w, max_batch_size=8, max_wait_ms=0, inline_lone=False)
    good = ["lovely film", "bad film", "meh film"]

    async def go():
        async with _client(srv.url) as c:
            await _until(lambda: _ready(c), "ready")
            held = asyncio.create_task(c.post("/v1/classify", json={"inputs": HOLD}))
            await asyncio.to_thread(w.entered.wait, 30)
            # Queue the fault and three good requests behind the held batch so they share one batch.
            tasks = [asyncio.create_task(c.post("/v1/classify", json={"inputs": t})) for t in [BOOM, *good]]
            await _until(lambda: _queued(c, 4), "4 queued texts")
            w.release.set()
            rs = await asyncio.gather(held, *tasks)
            after = await c.post("/v1/classify", json={"inputs": "still serving?"})
            return rs, after

    try:
        (held, boom, *oks), after = asyncio.run(go())
    finally:
        w.release.set()
        srv.stop()
    # [warm-up alone, warm-up batch (the batched path, before /ready), HOLD, the shared batch, re-runs...]
    hold = w.batches.index([HOLD])
    assert w.batches[0] == ["warm-up"] and len(w.batches[1]) > 1 and hold == 2
    assert sorted(w.batches[hold + 1]) == sorted([BOOM, *good])
    assert boom.status_code == 500
    err = boom.json()
    assert err["request_id"] == boom.headers["x-request-id"] and err["request_id"] in err["error"]
    assert [r.status_code for r in oks] == [200, 200, 200]
    for text, r in zip(good, oks):
        np.testing.assert_allclose(r.json()["predictions"][0][0]["score"], runtime.predict([text])[0].max(), atol=1e-5)
    assert held.status_code == 200 and after.status_code == 200


def test_ready_is_503_until_the_model_is_loaded(tiny_variant, runtime):
    gate = threading.Event()

    def slow_loader(cfg):
        assert gate.wait(30)
        return Wrapped(runtime)

    srv = _start(tiny_variant, slow_loader)
    try:
        with httpx2.Client(base_url=srv.url, timeout=30, trust_env=False) as c:
            assert c.get("/health").status_code == 200  # alive while loading
            r = c.get("/ready")
            assert r.status_code == 503 and r.json()["ready"] is False and "loading" in r.json()["reason"]
            assert c.get("/v2/health/ready").status_code == 503
            r = c.post("/v1/classify", json={"inputs": "too early"})
            assert r.status_code == 503 and r.headers["retry-after"] == "1"
            gate.set()
            asyncio.run(_poll_ready(srv.url))
            assert c.get("/ready").json() == {"ready": True, "model": "torch-fp32"}
            assert c.post("/v1/classify", json={"inputs": "now"}).status_code == 200
    finally:
        gate.set()
        srv.stop()


async def _poll_ready(url):
    async with _client(url) as c:
        await _until(lambda: _ready(c), "ready")


def test_load_failure_keeps_ready_503_with_the_reason(tiny_variant):
    from qserve import QserveError

    def broken(cfg):
        raise QserveError("variant is half-written")

    srv = _start(tiny_variant, broken)
    try:
        with httpx2.Client(base_url=srv.url, timeout=30, trust_env=False) as c:
            for _ in range(300):
                r = c.get("/ready")
                if "failed" in r.json().get("reason", ""):
                    break
                time.sleep(0.02)
            assert r.status_code == 503 and "variant is half-written" in r.json()["reason"]
    finally:
        srv.stop()


def test_graceful_shutdown_finishes_queued_work(tiny_variant, runtime):
    w = Wrapped(runtime)
    srv = _start(tiny_variant, lambda cfg: w, max_batch_size=2, max_wait_ms=0, inline_lone=False)
    stopper = threading.Thread(target=srv.stop)

    async def go():
        async with _client(srv.url) as c:
            await _until(lambda: _ready(c), "ready")
            held = asyncio.create_task(c.post("/v1/classify", json={"inputs": HOLD}))
            await asyncio.to_thread(w.entered.wait, 30)
            queued = [asyncio.create_task(c.post("/v1/classify", json={"inputs": f"late {i}"})) for i in range(5)]
            await _until(lambda: _queued(c, 5), "5 queued texts")
            stopper.start()  # SIGTERM-equivalent while 1 request runs and 5 wait
            await _until(lambda: _refuses(srv.port), "listener closed")
            w.release.set()
            return await asyncio.gather(held, *queued)

    try:
        rs = asyncio.run(go())
    finally:
        w.release.set()
        stopper.join(30)
    assert [r.status_code for r in rs] == [200] * 6
    assert not srv.thread.is_alive()


async def _refuses(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return True
    writer.close()
    return False


def test_a_stuck_model_answers_504_and_the_server_recovers(tiny_variant, runtime):
    w = Wrapped(runtime)
    srv = _start(tiny_variant, lambda cfg: w, request_timeout_s=0.3, inline_lone=False)
    try:
        with httpx2.Client(base_url=srv.url, timeout=30, trust_env=False) as c:
            asyncio.run(_poll_ready(srv.url))
            r = c.post("/v1/classify", json={"inputs": HOLD})  # the worker stays held past the timeout
            assert r.status_code == 504 and "--request-timeout-s" in r.json()["error"]
            w.release.set()
            assert c.post("/v1/classify", json={"inputs": "after"}).status_code == 200
    finally:
        w.release.set()
        srv.stop()
