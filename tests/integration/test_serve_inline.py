"""A request alone in the server runs on the event loop (--inline-lone); anything else hops to the inference thread.

    python -m pytest tests/integration/test_serve_inline.py -q

A real uvicorn serving the tiny variant, its runtime wrapped (through the app factory's loader) to record
which thread ran each batch: the event loop is the server's thread (qserve-uvicorn), the inference thread
qserve-infer. Nothing here depends on timing: "alone" is counted from uvicorn's own connections and tasks.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

httpx2 = pytest.importorskip("httpx2")

LOOP, INFER = "qserve-uvicorn", "qserve-infer_0"  # the executor names its one thread prefix_0
TEXTS = ["a quiet, lovely film", "two hours I will not get back", "fine"]
BOOM = "BOOM this request"


class Recorded:
    """The real runtime; records (thread name, texts) per batch and raises on BOOM."""

    def __init__(self, inner):
        self.inner = inner
        self.calls: list[tuple[str, list[str]]] = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def close(self):
        """The module fixture owns the real runtime."""

    def classify(self, texts, policy=None):
        self.calls.append((threading.current_thread().name, list(texts)))
        if BOOM in texts:
            raise RuntimeError("injected fault")
        return self.inner.classify(texts, policy)


@pytest.fixture(scope="module")
def runtime(tiny_runtime):
    return tiny_runtime


def _serve(tiny_variant, rec: Recorded, **cfg):
    from qserve.serve.app import create_app
    from qserve.serve.infra.config import ServeConfig
    from qserve.serve.infra.uvicorn_server import ServerThread

    return ServerThread(create_app(ServeConfig(variant_dir=str(tiny_variant), **cfg), loader=lambda c: rec)).start()


def _client(url: str):
    return httpx2.Client(base_url=url, timeout=30, trust_env=False)


def _ready(c) -> None:
    for _ in range(1500):
        if c.get("/ready").status_code == 200:
            return
        threading.Event().wait(0.02)
    raise AssertionError("server never became ready")


def _inline_count(c) -> float:
    lines = [line for line in c.get("/metrics").text.splitlines() if line.startswith("qserve_inline_batches_total{")]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


def test_a_lone_client_is_answered_on_the_event_loop_with_its_in_process_answer(tiny_variant, runtime):
    rec = Recorded(runtime)
    srv = _serve(tiny_variant, rec)
    try:
        with _client(srv.url) as c:  # one kept-alive connection
            _ready(c)
            before = len(rec.calls)
            answers = [c.post("/v1/classify", json={"inputs": t}).json() for t in TEXTS]
            inline = _inline_count(c)
    finally:
        srv.stop()
    assert [name for name, _ in rec.calls[before:]] == [LOOP] * len(TEXTS)
    assert inline == len(TEXTS)
    for text, a in zip(TEXTS, answers):
        probs = np.asarray(runtime.classify([text]).probs[0])
        best = a["predictions"][0][0]
        assert best["label"] == runtime.labels[int(probs.argmax())]
        assert abs(best["score"] - float(probs.max())) <= 1e-6


def test_a_second_connection_windows_and_several_texts_go_to_the_inference_thread(tiny_variant, runtime):
    rec = Recorded(runtime)
    srv = _serve(tiny_variant, rec)
    try:
        with _client(srv.url) as a:
            _ready(a)
            before = len(rec.calls)
            assert a.post("/v1/classify", json={"inputs": TEXTS}).status_code == 200  # three texts
            assert a.post("/v1/classify", json={"inputs": TEXTS[0], "long_text": "windows"}).status_code == 200
            with _client(srv.url) as b:
                assert b.get("/health").status_code == 200  # b's connection stays open, idle
                assert a.post("/v1/classify", json={"inputs": TEXTS[1]}).status_code == 200
            inline = _inline_count(a)
    finally:
        srv.stop()
    assert [name for name, _ in rec.calls[before:]] == [INFER] * 3
    assert inline == 0


def test_no_inline_lone_always_hops(tiny_variant, runtime):
    rec = Recorded(runtime)
    srv = _serve(tiny_variant, rec, inline_lone=False)
    try:
        with _client(srv.url) as c:
            _ready(c)
            before = len(rec.calls)
            assert all(c.post("/v1/classify", json={"inputs": t}).status_code == 200 for t in TEXTS)
            inline = _inline_count(c)
    finally:
        srv.stop()
    assert [name for name, _ in rec.calls[before:]] == [INFER] * len(TEXTS)
    assert inline == 0


def test_an_inline_failure_is_that_requests_500_and_the_next_is_answered(tiny_variant, runtime):
    rec = Recorded(runtime)
    srv = _serve(tiny_variant, rec)
    try:
        with _client(srv.url) as c:
            _ready(c)
            before = len(rec.calls)
            bad = c.post("/v1/classify", json={"inputs": BOOM}, headers={"x-request-id": "boom-1"})
            good = c.post("/v1/classify", json={"inputs": TEXTS[0]})
    finally:
        srv.stop()
    assert [name for name, _ in rec.calls[before:]] == [LOOP, LOOP]
    assert bad.status_code == 500 and "boom-1" in bad.json()["error"] and bad.json()["request_id"] == "boom-1"
    assert good.status_code == 200 and good.json()["predictions"][0][0]["label"] in runtime.labels


BODIES = [b'{"inputs": "a quiet, lovely film"}', b'{"inputs": ["fine", "awful"], "top_k": 1}',
          b'{"inputs": "x \\ud83d\\ude00", "long_text": "tail"}', b'{"inputs": "dull", "top_k": "2"}',
          b'{"inputs": []}', b'{"inputs": "a", "extra": 1}', b'{"inputs": "a\\ud800"}', b'{"inputs": ',
          b'{"inputs": "fine", "model": "nope"}', b'{"inputs": "fine", "threshold": 0.3}', b'\xef\xbb\xbf{"inputs": "x"}']


def test_v1_classify_past_fastapi_answers_byte_for_byte_as_the_route(tiny_variant, runtime, monkeypatch):
    """The guard's fast path (routes.fast_classify) against the FastAPI route it shortcuts: every body, good or
    bad, gets the same status, headers and bytes (request ids fixed); a refused body reaches the route."""
    from qserve.serve.protocols import routes

    def post_all(srv) -> list[tuple[int, list[tuple[str, str]], bytes]]:
        with _client(srv.url) as c:
            _ready(c)
            out = []
            for i, body in enumerate(BODIES):
                r = c.post("/v1/classify", content=body,
                           headers={"content-type": "application/json", "x-request-id": f"r{i}"})
                out.append((r.status_code, [(k, v) for k, v in r.headers.items() if k != "date"], r.content))
            return out

    real = routes.fast_classify

    def through(handled: list[bool], fast: bool):
        """routes.fast_classify recording, per request, whether it answered; fast=False: it always declines."""
        def make(st, error):
            handle = real(st, error)

            async def recorded(scope, body, send):
                handled.append(fast and await handle(scope, body, send))
                return handled[-1]
            return recorded
        return make

    taken: list[bool] = []
    monkeypatch.setattr(routes, "fast_classify", through(taken, fast=True))
    fast = _serve(tiny_variant, Recorded(runtime))
    try:
        answered = post_all(fast)
    finally:
        fast.stop()
    # pydantic took the good bodies and the unknown model (answered 404 by the same handler); refused the rest
    assert taken == [True, True, True, False, False, False, False, False, True, True, False]
    declined: list[bool] = []
    monkeypatch.setattr(routes, "fast_classify", through(declined, fast=False))
    route = _serve(tiny_variant, Recorded(runtime))
    try:
        routed = post_all(route)
    finally:
        route.stop()
    assert declined == [False] * len(BODIES)  # the second server's every request went through FastAPI's route
    assert answered == routed
    assert [a[0] for a in answered][:3] == [200, 200, 200] and {a[0] for a in answered[3:9]} >= {400, 422}
