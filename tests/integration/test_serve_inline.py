"""A request alone in the server runs on the event loop (--inline-lone); anything else hops to the inference thread.

    python -m pytest tests/integration/test_serve_inline.py -q

A real uvicorn serving the tiny variant, its runtime wrapped (through the app factory's loader) to record
which thread ran each batch: the event loop is the server's thread (qserve-uvicorn), the inference thread
qserve-infer. Nothing here depends on timing: "alone" is counted from uvicorn's own connections and tasks.
"""

from __future__ import annotations

import json
import re
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


V2_TEXT = b'{"name": "text", "datatype": "BYTES", "shape": %s}'
V2_BINARY = (
    b'{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 8}}],'
    b' "parameters": {"binary_data_output": true}}' + b"\x04\x00\x00\x00fine"
)

# (path, body, whether the fast path answers it: pydantic takes the body; an unknown model is answered 404 by the
# same handler[, the request's headers]), the bodies every fast-pathed route's FastAPI twin is compared on
BODIES = [
    ("/v1/classify", b'{"inputs": "a quiet, lovely film"}', True),
    ("/v1/classify", b'{"inputs": ["fine", "awful"], "top_k": 1}', True),
    ("/v1/classify", b'{"inputs": "x \\ud83d\\ude00", "long_text": "tail"}', True),
    ("/v1/classify", b'{"inputs": "dull", "top_k": "2"}', False),
    ("/v1/classify", b'{"inputs": []}', False),
    ("/v1/classify", b'{"inputs": "a", "extra": 1}', False),
    ("/v1/classify", b'{"inputs": "a\\ud800"}', False),
    ("/v1/classify", b'{"inputs": ', False),
    ("/v1/classify", b'{"inputs": "fine", "model": "nope"}', True),
    ("/v1/classify", b'{"inputs": "fine", "threshold": 0.3}', True),
    ("/v1/classify", b'\xef\xbb\xbf{"inputs": "x"}', False),
    # TEI's /predict: a string, a batch, a batch of one-text lists with logits, a cut refused, Left truncation
    ("/predict", b'{"inputs": "fine"}', True),
    ("/predict", b'{"inputs": ["fine", "awful"]}', True),
    ("/predict", b'{"inputs": [["fine"], ["awful"]], "raw_scores": true}', True),
    ("/predict", b'{"inputs": "' + b"long " * 400 + b'", "truncate": false}', True),
    ("/predict", b'{"inputs": "fine", "truncation_direction": "Left"}', True),
    ("/predict", b'{"inputs": "fine", "truncate": "yes"}', False),
    ("/predict", b'{"inputs": []}', False),
    ("/predict", b'{"inputs": "a", "extra": 1}', False),
    ("/predict", b'{"inputs": ', False),
    # POST /: huggingface_hub's InferenceClient form (with parameters) and TEI's (without)
    ("/", b'{"inputs": "fine", "parameters": {"top_k": 1}}', True),
    ("/", b'{"inputs": "fine", "parameters": {"function_to_apply": "sigmoid"}}', True),
    ("/", b'{"inputs": "fine", "parameters": null}', True),
    ("/", b'{"inputs": "fine"}', True),
    ("/", b'{"inputs": "fine", "parameters": {"top_k": 0}}', False),
    ("/", b'{"parameters": {}}', False),
    # vLLM's /classify
    ("/classify", b'{"input": "fine"}', True),
    ("/classify", b'{"input": ["fine", "awful"], "model": null}', True),
    ("/classify", b'{"input": "fine", "truncate_prompt_tokens": -1}', True),
    ("/classify", b'{"input": "fine", "model": "nope"}', True),
    ("/classify", b'{"input": []}', False),
    ("/classify", b'{"input": "fine", "user": 3}', False),
    ("/classify", b'{"input": "fine", "long_text": "tail"}', True),
    # KServe V2 infer ({m}: the served model, {v}: its version): JSON, binary tensor data both ways, a version
    # and an id; a wrong version, model or shape answered by the same checks; an unparsable body left to FastAPI
    ("/v2/models/{m}/infer", b'{"inputs": [' + V2_TEXT % b'[2], "data": ["fine", "awful"]' + b"]}", True),
    (
        "/v2/models/{m}/infer",
        b'{"id": "q1", "inputs": [' + V2_TEXT % b'[1], "data": ["fine"]' + b'], "outputs": '
        b'[{"name": "probabilities", "parameters": {"binary_data": true}}, {"name": "label"}]}',
        True,
    ),
    (
        "/v2/models/{m}/infer",
        V2_BINARY,
        True,
        {"content-type": "application/octet-stream", "inference-header-content-length": str(len(V2_BINARY) - 8)},
    ),
    (
        "/v2/models/{m}/versions/{v}/infer",
        b'{"inputs": [' + V2_TEXT % b'[1], "data": ["fine"]' + b'], "parameters": {"long_text": "tail"}}',
        True,
    ),
    ("/v2/models/{m}/versions/nope/infer", b'{"inputs": [' + V2_TEXT % b'[1], "data": ["fine"]' + b"]}", True),
    ("/v2/models/nope/infer", b'{"inputs": [' + V2_TEXT % b'[1], "data": ["fine"]' + b"]}", True),
    ("/v2/models/{m}/infer", b'{"inputs": [' + V2_TEXT % b'[3], "data": ["fine"]' + b"]}", True),
    ("/v2/models/{m}/infer", b'{"id": "a\\ud800", "inputs": [' + V2_TEXT % b'[1], "data": ["fine"]' + b"]}", True),
    ("/v2/models/{m}/infer", b'{"inputs": ', False),
    ("/v2/models/{m}/infer", b'{"inputs": [{"name": "text"}]}', False),
    (
        "/v2/models/{m}/infer",
        V2_BINARY,
        False,
        {"content-type": "application/octet-stream", "inference-header-content-length": "zz"},
    ),
]


def test_the_fast_routes_answer_byte_for_byte_as_their_fastapi_routes(tiny_variant, runtime, monkeypatch):
    """The guard's fast path (spec.fast_routes: /v1/classify, TEI's /predict and POST /, vLLM's /classify, V2 infer)
    against the FastAPI routes it shortcuts: every body, good or bad, gets the same status, headers and bytes
    (request ids fixed); a refused body reaches the route."""
    from qserve.serve.protocols import spec

    def post_all(srv) -> list[tuple[int, list[tuple[str, str]], bytes]]:
        with _client(srv.url) as c:
            _ready(c)
            m = c.get("/ready").json()["model"]
            v = c.get(f"/v2/models/{m}").json()["versions"][0]
            out = []
            for i, (path, body, _, *headers) in enumerate(BODIES):
                r = c.post(
                    path.format(m=m, v=v),
                    content=body,
                    headers={"content-type": "application/json", "x-request-id": f"r{i}", **dict(*headers)},
                )
                # vLLM's answer carries a fresh id and the time it was made: those two differ by design
                content = re.sub(
                    rb'^\{"id":"classify-[0-9a-f]{32}","object":"list","created":[0-9]+,',
                    b'{"id":"classify-ID","object":"list","created":T,',
                    r.content,
                )
                out.append((r.status_code, [(k, v) for k, v in r.headers.items() if k != "date"], content))
            return out

    real = spec.fast_routes

    def through(handled: list[bool], fast: bool):
        """spec.fast_routes recording, per request, whether it answered; fast=False: it always declines."""

        def make(st, protocols, error):
            handle = real(st, protocols, error)

            async def recorded(found, scope, body, send):
                handled.append(fast and await handle(found, scope, body, send))
                return handled[-1]

            return recorded

        return make

    taken: list[bool] = []
    monkeypatch.setattr(spec, "fast_routes", through(taken, fast=True))
    fast = _serve(tiny_variant, Recorded(runtime))
    try:
        answered = post_all(fast)
    finally:
        fast.stop()
    assert taken == [want for _, _, want, *_ in BODIES]
    declined: list[bool] = []
    monkeypatch.setattr(spec, "fast_routes", through(declined, fast=False))
    route = _serve(tiny_variant, Recorded(runtime))
    try:
        routed = post_all(route)
    finally:
        route.stop()
    assert declined == [False] * len(BODIES)  # the second server's every request went through FastAPI's routes
    for (path, body, *_), a, r in zip(BODIES, answered, routed):
        assert a == r, (path, body[:80])
    # every route answered its good bodies and refused its bad ones, in its own protocol's form (TEI: a length
    # refusal is 413, an unreadable body 422, always {"error", "error_type"})
    assert [a[0] for a in answered] == [
        200,
        200,
        200,
        422,
        422,
        422,
        422,
        400,
        404,
        422,
        200,
        200,
        200,
        200,
        413,
        200,
        422,
        422,
        422,
        422,
        200,
        200,
        200,
        200,
        422,
        422,
        200,
        200,
        200,
        404,
        422,
        422,
        200,
        200,
        200,
        200,
        200,
        404,
        404,
        400,
        422,
        400,
        422,
        400,
    ]
    assert all(
        set(json.loads(a[2])) == {"error", "error_type"}
        for (path, *_), a in zip(BODIES, answered)
        if path in ("/predict", "/") and a[0] != 200
    )
