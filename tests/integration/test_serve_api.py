"""The served API against a real uvicorn on 127.0.0.1 (random port) and a real tiny variant.

python -m pytest tests/integration/test_serve_api.py -q
"""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from qserve.rundir import Served

httpx2 = pytest.importorskip("httpx2")

MAX_CHARS, MAX_INPUTS, MAX_BODY = 2000, 16, 64 * 1024


@pytest.fixture(scope="module")
def server(tiny_variant):
    import torch

    from qserve.serve.app import create_app
    from qserve.serve.infra.config import ServeConfig
    from qserve.serve.infra.uvicorn_server import ServerThread

    threads = torch.get_num_threads()
    # threads=1: the test machine's cores are shared; one intra-op thread avoids OpenMP spin contention.
    cfg = ServeConfig(
        variant_dir=str(tiny_variant),
        threads=1,
        max_batch_size=32,
        max_wait_ms=30,
        max_inputs=MAX_INPUTS,
        max_chars=MAX_CHARS,
        max_body_bytes=MAX_BODY,
    )
    srv = ServerThread(create_app(cfg)).start()
    try:
        with httpx2.Client(base_url=srv.url, timeout=30, trust_env=False) as c:
            _wait_ready(c)
        yield srv
    finally:
        srv.stop()
        torch.set_num_threads(threads)  # the runtime set it process-wide; leave other tests as we found them


@pytest.fixture(scope="module")
def client(server):
    with httpx2.Client(base_url=server.url, timeout=30, trust_env=False) as c:
        yield c


@pytest.fixture(scope="module")
def reference(tiny_variant):
    """The same variant loaded directly: what every served answer must equal."""
    from qserve.runtime import load_runtime

    return load_runtime(tiny_variant)


def _wait_ready(c, tries: int = 300) -> None:
    import time

    for _ in range(tries):
        if c.get("/ready").status_code == 200:
            return
        time.sleep(0.05)
    raise AssertionError("server never became ready")


def _probs(preds: list[dict], labels: list[str]) -> list[float]:
    by = {p["label"]: p["score"] for p in preds}
    return [by[label] for label in labels]


def test_health_ready_docs(client):
    assert client.get("/health").json() == {"status": "alive"}
    assert client.get("/ready").json() == {"ready": True, "model": "torch-fp32"}
    assert client.get("/v2/health/live").json() == {"live": True}
    assert client.get("/v2/health/ready").json() == {"ready": True}
    spec = client.get("/openapi.json").json()
    assert {"/v1/classify", "/v2/models/{name}/infer", "/metrics", "/ready"} <= set(spec["paths"])
    assert client.get("/docs").status_code == 200


def test_a_classify_request_passes_each_module_once_down_the_layers(server, client, monkeypatch):
    """From the server to the serving state, a classify request passes the app, the router and its protocol, in
    that order and each once: no framework router or middleware between them, no module visited twice."""
    import sys

    st = server.server.config.app.state.qserve
    submit, seen = st.submit, []

    async def recorded(req):
        chain, f = [], sys._getframe(1)
        while f is not None:
            chain.append(f.f_globals.get("__name__", ""))
            f = f.f_back
        ours = [m for m in reversed(chain) if m.startswith(("qserve.", "fastapi", "starlette"))]
        seen.append([m for i, m in enumerate(ours) if i == 0 or m != ours[i - 1]])  # a module's frames: one visit
        return await submit(req)

    monkeypatch.setattr(st, "submit", recorded)
    assert client.post("/v1/classify", json={"inputs": "fine"}).status_code == 200
    assert seen == [["qserve.serve.app", "qserve.serve.router", "qserve.serve.protocols.v1"]]


def test_classify_single_and_batch_match_the_runtime(client, reference):
    texts = ["A wonderful, moving film.", "Dull and far too long.", "It was fine, I guess."]
    r = client.post("/v1/classify", json={"inputs": texts[0]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "torch-fp32" and body["model_name"] == "tiny-distilbert"
    assert len(body["predictions"]) == 1 and body["truncated"] == [False]
    preds = body["predictions"][0]
    assert [p["label"] for p in preds] == sorted(
        reference.labels, key=lambda lb: -_probs(preds, reference.labels)[reference.labels.index(lb)]
    )  # all labels, best first
    np.testing.assert_allclose(_probs(preds, reference.labels), reference.predict([texts[0]])[0], atol=1e-5)

    r = client.post("/v1/classify", json={"inputs": texts, "top_k": 1})
    body = r.json()
    want = reference.predict(texts)
    assert [len(p) for p in body["predictions"]] == [1, 1, 1]
    for preds, row in zip(body["predictions"], want):
        assert preds[0]["label"] == reference.labels[int(row.argmax())]
        assert preds[0]["score"] == pytest.approx(float(row.max()), abs=1e-5)


def test_long_text_is_truncated_and_says_so(client, reference):
    long = " ".join(["remarkable"] * 150)  # far over the variant's 64 tokens, under the char limit
    body = client.post("/v1/classify", json={"inputs": [long, "short"]}).json()
    assert body["truncated"] == [True, False] and body["max_length"] == 64
    np.testing.assert_allclose(
        _probs(body["predictions"][0], reference.labels), reference.predict([long])[0], atol=1e-5
    )


def test_v2_metadata_and_infer(client, reference):
    meta = client.get("/v2/models/torch-fp32").json()
    assert meta["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    assert meta["outputs"][0] == {"name": "probabilities", "datatype": "FP32", "shape": [-1, 2]}
    texts = ["great acting", "terrible plot", "so-so"]
    req = {"id": "abc", "inputs": [{"name": "text", "shape": [3], "datatype": "BYTES", "data": texts}]}
    r = client.post("/v2/models/torch-fp32/infer", json=req)
    assert r.status_code == 200, r.text
    out = {o["name"]: o for o in r.json()["outputs"]}
    assert r.json()["id"] == "abc" and r.json()["model_name"] == "torch-fp32"
    probs = out["probabilities"]
    assert probs["datatype"] == "FP32" and probs["shape"] == [3, 2]
    np.testing.assert_allclose(np.array(probs["data"]).reshape(3, 2), reference.predict(texts), atol=1e-5)
    assert out["label"]["data"] == [reference.labels[i] for i in reference.predict(texts).argmax(1)]
    # nested data with shape [n, 1] and an output selection
    req = {
        "inputs": [{"name": "text", "shape": [2, 1], "datatype": "BYTES", "data": [["a b"], ["c d"]]}],
        "outputs": [{"name": "probabilities"}],
    }
    r = client.post("/v2/models/torch-fp32/infer", json=req)
    assert [o["name"] for o in r.json()["outputs"]] == ["probabilities"]


def test_v1_models_summarizes_the_manifest(client):
    (m,) = client.get("/v1/models").json()["models"]
    assert m["id"] == "torch-fp32" and m["labels"] == ["negative", "positive"] and m["max_length"] == 64
    assert m["spec"]["backend"] == "torch" and m["parity"]["agreement"] == 1.0 and m["files"] > 0


def test_v1_models_says_why_a_model_dir_chose_the_variant(client, tiny_variant):
    """`qserve serve MODEL_DIR` hands create_app the report's selection (the Ray engine: test_serve_ray_local)."""
    import torch

    from qserve.serve.app import create_app
    from qserve.serve.infra.config import ServeConfig
    from qserve.serve.infra.uvicorn_server import ServerThread

    assert client.get("/v1/models").json()["models"][0]["selection"] is None  # a variant dir: nothing chosen
    selection = Served(
        variant="torch-fp32",
        dir=str(tiny_variant),
        why="fastest meeting its bar",
        report="/run/report/report.json",
        measured_on="Test CPU",
        same_cpu=False,
        long_text=None,
        long_text_why="the variant's own policy (never gated)",
        versus=None,
    )
    threads = torch.get_num_threads()
    srv = ServerThread(create_app(ServeConfig(variant_dir=str(tiny_variant), threads=1), selection=selection)).start()
    try:
        with httpx2.Client(base_url=srv.url, timeout=30, trust_env=False) as c:
            _wait_ready(c)
            (m,) = c.get("/v1/models").json()["models"]
            assert m["id"] == "torch-fp32" and m["selection"] == selection.record()
    finally:
        srv.stop()
        torch.set_num_threads(threads)


V1_BAD = [
    ({"inputs": []}, 422, "empty"),
    ({"inputs": ""}, 422, "at least 1 character"),
    ({"inputs": ["ok", "   "]}, 422, "inputs[1] has no visible character"),
    ({"inputs": 5}, 422, "valid string"),
    ({"inputs": ["ok", 3]}, 422, "valid string"),
    ({"inputs": ["x"] * (MAX_INPUTS + 1)}, 422, f"at most {MAX_INPUTS} per request"),
    ({"inputs": "x" * (MAX_CHARS + 1)}, 422, f"at most {MAX_CHARS}"),
    ({"inputs": "ok", "top_k": 0}, 422, "top_k"),
    ({"input": "typo"}, 422, "inputs"),
    ({"inputs": "ok", "model": "nope"}, 404, "unknown model 'nope'"),
]


@pytest.mark.parametrize("body,status,fragment", V1_BAD)
def test_v1_bad_input_is_a_4xx_that_says_what_is_allowed(client, body, status, fragment):
    r = client.post("/v1/classify", json=body)
    assert r.status_code == status, r.text
    err = r.json()
    assert fragment in err["error"] and err["request_id"] == r.headers["x-request-id"]


def test_transport_level_bad_input(client):
    r = client.post("/v1/classify", content=b'{"inputs": ', headers={"content-type": "application/json"})
    assert r.status_code == 400 and "malformed JSON" in r.json()["error"] and '"inputs"' in r.json()["error"]
    r = client.post("/v1/classify", content=b'{"inputs": "hi"}', headers={"content-type": "text/plain"})
    assert r.status_code == 415 and "application/json" in r.json()["error"]
    big = json.dumps({"inputs": ["y" * 1000] * 80}).encode()  # > 64 KiB
    r = client.post("/v1/classify", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and str(MAX_BODY) in r.json()["error"]

    def chunks():  # no Content-Length: the limit must hold while streaming too
        for _ in range(80):
            yield b" " * 1024

    r = client.post("/v1/classify", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413
    r = client.get("/v1/classify")
    assert r.status_code == 405 and "not allowed" in r.json()["error"]
    r = client.get("/v3/nothing")
    assert r.status_code == 404 and "/v1/classify" in r.json()["error"]


def _v2(data, datatype="BYTES", shape=None, **extra):
    return {"inputs": [{"name": "text", "datatype": datatype, "shape": shape or [len(data)], "data": data}], **extra}


V2_BAD = [
    ("nope", _v2(["hi"]), 404, "unknown model 'nope'"),
    ("torch-fp32", _v2([1.0], datatype="FP32"), 422, "'BYTES'"),
    ("torch-fp32", _v2(["a", "b"], shape=[3]), 400, "use [n] or [n, 1]"),
    ("torch-fp32", _v2([]), 422, "at least 1 item"),
    ("torch-fp32", _v2(["ok", 7]), 422, "valid string"),
    ("torch-fp32", _v2(["hi"], outputs=[{"name": "logits"}]), 422, "'probabilities'"),
    ("torch-fp32", {"inputs": [_v2(["a"])["inputs"][0]] * 2}, 422, "repeats inputs[0]"),
    ("torch-fp32", {"inputs": [_v2(["a"])["inputs"][0]] * 3}, 422, "at most 2 items"),
    (
        "torch-fp32",
        {"inputs": [_v2(["a"])["inputs"][0], {**_v2(["b"])["inputs"][0], "name": "text_pair"}]},
        422,
        "it is not a pair model",
    ),
    ("torch-fp32", {"inputs": "hi"}, 422, '"datatype": "BYTES"'),
]


@pytest.mark.parametrize("name,body,status,fragment", V2_BAD)
def test_v2_bad_input(client, name, body, status, fragment):
    r = client.post(f"/v2/models/{name}/infer", json=body)
    assert r.status_code == status, r.text
    assert fragment in r.json()["error"]


def test_64_concurrent_clients_each_get_exactly_their_own_answers(server, reference):
    from qserve.loadtest import default_texts, run_loadtest

    # Direct check: 64 clients at once, distinct texts (some multi-text requests), answers vs the runtime.
    texts = default_texts(96)
    bodies = [{"inputs": texts[i]} if i % 4 else {"inputs": [texts[i], texts[i + 32]]} for i in range(64)]

    async def go():
        limits = httpx2.Limits(max_connections=64)
        async with httpx2.AsyncClient(base_url=server.url, timeout=60, limits=limits, trust_env=False) as c:
            return await asyncio.gather(*(c.post("/v1/classify", json=b) for b in bodies))

    responses = asyncio.run(go())
    assert [r.status_code for r in responses] == [200] * 64
    # one batched reference call: a text's scores hold to 1e-5 in any batch (the server batches them with others)
    want = dict(zip(texts, reference.predict(texts)))
    for body, r in zip(bodies, responses):
        sent = [body["inputs"]] if isinstance(body["inputs"], str) else body["inputs"]
        got = [_probs(p, reference.labels) for p in r.json()["predictions"]]
        np.testing.assert_allclose(got, [want[t] for t in sent], atol=1e-5)

    # The load tool at 64 clients: bounded by requests, every answer checked against a sequential pass.
    report = run_loadtest(server.url, [64], duration_s=20, texts=texts, max_requests=384)
    (level,) = report["levels"]
    assert level["requests"] == 384 and level["ok"] == 384
    assert level["errors"] == 0 and level["lost"] == 0 and level["mismatched"] == 0
    assert level["max_score_diff"] < 1e-4


def test_concurrent_requests_are_batched(server, client):
    from prometheus_client.parser import text_string_to_metric_families

    def batch_hist():
        fams = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
        samples = {(s.name, s.labels.get("le")): s.value for s in fams["qserve_batch_size"].samples}
        return samples[("qserve_batch_size_count", None)], samples[("qserve_batch_size_bucket", "1.0")]

    count0, le1_0 = batch_hist()

    async def go():
        async with httpx2.AsyncClient(
            base_url=server.url, timeout=60, trust_env=False, limits=httpx2.Limits(max_connections=16)
        ) as c:
            return await asyncio.gather(
                *(c.post("/v1/classify", json={"inputs": f"review number {i}"}) for i in range(16))
            )

    assert all(r.status_code == 200 for r in asyncio.run(go()))
    count1, le1_1 = batch_hist()
    batches, single = count1 - count0, le1_1 - le1_0
    assert batches < 16, "16 concurrent single-text requests ran as 16 separate forwards"
    assert batches - single >= 1  # at least one forward held more than one request's text
    text = client.get("/metrics").text
    assert 'qserve_requests_total{method="POST",model="torch-fp32",route="/v1/classify",status="200"}' in text
    assert "qserve_inference_seconds_count" in text and "qserve_queue_depth" in text


def test_objects_loaded_before_ready_are_frozen_out_of_the_cyclic_gc(tiny_variant):
    """A full GC pass over everything torch/transformers/ORT loaded stopped the server for 330-415 ms
    every few seconds under load; the app freezes what exists once the model is warm."""
    import gc

    import torch

    from qserve.serve.app import create_app
    from qserve.serve.infra.config import ServeConfig
    from qserve.serve.infra.uvicorn_server import ServerThread

    threads = torch.get_num_threads()
    gc.unfreeze()  # other servers in this process may have frozen already
    assert gc.get_freeze_count() == 0
    srv = ServerThread(create_app(ServeConfig(variant_dir=str(tiny_variant), threads=1))).start()
    try:
        with httpx2.Client(base_url=srv.url, timeout=30, trust_env=False) as c:
            _wait_ready(c)
            assert gc.get_freeze_count() > 10_000  # the loaded libraries and model, not a handful
            assert c.post("/v1/classify", json={"inputs": "still answers"}).status_code == 200
    finally:
        srv.stop()
        torch.set_num_threads(threads)
