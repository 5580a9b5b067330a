"""A request alone in the server runs on the event loop (--inline-lone); anything else hops to the inference thread.

    python -m pytest tests/integration/test_serve_inline.py -q

A real uvicorn serving the tiny variant, its runtime wrapped (through the app factory's loader) to record
which thread ran each batch: the event loop is the server's thread (qserve-uvicorn), the inference thread
qserve-infer. Nothing here depends on timing: "alone" is counted from uvicorn's own connections and tasks.
"""

from __future__ import annotations

import json
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

# (path, body[, the request's headers]): every inference route's bodies, good and bad
BODIES = [
    ("/v1/classify", b'{"inputs": "a quiet, lovely film"}'),
    ("/v1/classify", b'{"inputs": ["fine", "awful"], "top_k": 1}'),
    ("/v1/classify", b'{"inputs": "x \\ud83d\\ude00", "long_text": "tail"}'),
    ("/v1/classify", b'{"inputs": "dull", "top_k": "2"}'),
    ("/v1/classify", b'{"inputs": []}'),
    ("/v1/classify", b'{"inputs": "a", "extra": 1}'),
    ("/v1/classify", b'{"inputs": "a\\ud800"}'),
    ("/v1/classify", b'{"inputs": '),
    ("/v1/classify", b'{"inputs": "fine", "model": "nope"}'),
    ("/v1/classify", b'{"inputs": "fine", "threshold": 0.3}'),
    ("/v1/classify", b'\xef\xbb\xbf{"inputs": "x"}'),
    # TEI's /predict: a string, a batch, a batch of one-text lists with logits, a cut refused, Left truncation
    ("/predict", b'{"inputs": "fine"}'),
    ("/predict", b'{"inputs": ["fine", "awful"]}'),
    ("/predict", b'{"inputs": [["fine"], ["awful"]], "raw_scores": true}'),
    ("/predict", b'{"inputs": "' + b"long " * 400 + b'", "truncate": false}'),
    ("/predict", b'{"inputs": "fine", "truncation_direction": "Left"}'),
    ("/predict", b'{"inputs": "fine", "truncate": "yes"}'),
    ("/predict", b'{"inputs": []}'),
    ("/predict", b'{"inputs": "a", "extra": 1}'),
    ("/predict", b'{"inputs": '),
    # POST /: huggingface_hub's InferenceClient form (with parameters) and TEI's (without)
    ("/", b'{"inputs": "fine", "parameters": {"top_k": 1}}'),
    ("/", b'{"inputs": "fine", "parameters": {"function_to_apply": "sigmoid"}}'),
    ("/", b'{"inputs": "fine", "parameters": null}'),
    ("/", b'{"inputs": "fine"}'),
    ("/", b'{"inputs": "fine", "parameters": {"top_k": 0}}'),
    ("/", b'{"parameters": {}}'),
    # vLLM's /classify
    ("/classify", b'{"input": "fine"}'),
    ("/classify", b'{"input": ["fine", "awful"], "model": null}'),
    ("/classify", b'{"input": "fine", "truncate_prompt_tokens": -1}'),
    ("/classify", b'{"input": "fine", "model": "nope"}'),
    ("/classify", b'{"input": []}'),
    ("/classify", b'{"input": "fine", "user": 3}'),
    ("/classify", b'{"input": "fine", "long_text": "tail"}'),
    # KServe V2 infer ({m}: the served model, {v}: its version): JSON, binary tensor data both ways, a version
    # and an id; a wrong version, model or shape; an unparsable body
    ("/v2/models/{m}/infer", b'{"inputs": [' + V2_TEXT % b'[2], "data": ["fine", "awful"]' + b"]}"),
    (
        "/v2/models/{m}/infer",
        b'{"id": "q1", "inputs": [' + V2_TEXT % b'[1], "data": ["fine"]' + b'], "outputs": '
        b'[{"name": "probabilities", "parameters": {"binary_data": true}}, {"name": "label"}]}',
    ),
    (
        "/v2/models/{m}/infer",
        V2_BINARY,
        {"content-type": "application/octet-stream", "inference-header-content-length": str(len(V2_BINARY) - 8)},
    ),
    (
        "/v2/models/{m}/versions/{v}/infer",
        b'{"inputs": [' + V2_TEXT % b'[1], "data": ["fine"]' + b'], "parameters": {"long_text": "tail"}}',
    ),
    ("/v2/models/{m}/versions/nope/infer", b'{"inputs": [' + V2_TEXT % b'[1], "data": ["fine"]' + b"]}"),
    ("/v2/models/nope/infer", b'{"inputs": [' + V2_TEXT % b'[1], "data": ["fine"]' + b"]}"),
    ("/v2/models/{m}/infer", b'{"inputs": [' + V2_TEXT % b'[3], "data": ["fine"]' + b"]}"),
    ("/v2/models/{m}/infer", b'{"id": "a\\ud800", "inputs": [' + V2_TEXT % b'[1], "data": ["fine"]' + b"]}"),
    ("/v2/models/{m}/infer", b'{"inputs": '),
    ("/v2/models/{m}/infer", b'{"inputs": [{"name": "text"}]}'),
    (
        "/v2/models/{m}/infer",
        V2_BINARY,
        {"content-type": "application/octet-stream", "inference-header-content-length": "zz"},
    ),
]


def test_every_inference_route_is_answered_by_the_router_alone(tiny_variant, runtime):
    """/v1/classify, TEI's /predict and POST /, vLLM's /classify and V2 infer: every body, good or bad, answered by the
    router (its route's Body and answer). tests/unit/test_protocols.py pins the refusals' words to FastAPI's own
    reading of the same bodies."""
    srv = _serve(tiny_variant, Recorded(runtime))
    try:
        with _client(srv.url) as c:
            _ready(c)
            m = c.get("/ready").json()["model"]
            v = c.get(f"/v2/models/{m}").json()["versions"][0]
            answered = []
            for i, (path, body, *headers) in enumerate(BODIES):
                r = c.post(
                    path.format(m=m, v=v),
                    content=body,
                    headers={"content-type": "application/json", "x-request-id": f"r{i}", **dict(*headers)},
                )
                answered.append((r.status_code, r.headers, r.content))
    finally:
        srv.stop()
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
