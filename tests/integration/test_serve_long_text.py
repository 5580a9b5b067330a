"""Long texts served: the long_text request field (/v1) and parameter (V2), tokens/windows per input,
the server's default policy and --max-windows, on a real uvicorn with the tiny variant.

    python -m pytest tests/integration/test_serve_long_text.py -q
"""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from conftest import serving

from qserve.longtext import FORMS

httpx2 = pytest.importorskip("httpx2")

LONG = " ".join(f"scene{i % 40} was {'great' if i % 3 else 'dull'}" for i in range(120))  # ~400 tokens


@pytest.fixture(scope="module")
def reference(tiny_variant):
    from qserve.runtime import RuntimeOptions, load_runtime

    return load_runtime(tiny_variant, "cpu", RuntimeOptions(threads=1))


@pytest.fixture(scope="module")
def client(tiny_variant):
    from qserve.serve.infra.config import ServeConfig

    cfg = ServeConfig(
        variant_dir=str(tiny_variant), device="cpu", threads=1, max_batch_size=8, max_wait_ms=20, max_inputs=16
    )
    with serving(cfg) as srv, httpx2.Client(base_url=srv.url, timeout=60, trust_env=False) as c:
        yield c


def _probs(body: dict, labels: list[str]) -> np.ndarray:
    return np.array([[{p["label"]: p["score"] for p in preds}[lb] for lb in labels] for preds in body["predictions"]])


def test_v1_gives_tokens_and_windows_per_input_and_takes_a_per_request_policy(client, reference):
    texts = [LONG, "short and sweet"]
    body = client.post("/v1/classify", json={"inputs": texts}).json()
    assert body["long_text"] == "head" and body["windows"] == [1, 1] and body["truncated"] == [True, False]
    assert body["tokens"] == reference.classify(texts).tokens and body["tokens"][0] > 300
    body = client.post("/v1/classify", json={"inputs": texts, "long_text": "windows"}).json()
    assert body["long_text"] == "windows:64:48:mean" and body["windows"][0] > 1 and body["windows"][1] == 1
    assert body["truncated"] == [False, False]  # every token of the long text is in some window
    # the tiny random model answers long texts alike, so tight: served windows = windows, and != head
    np.testing.assert_allclose(_probs(body, reference.labels), reference.predict(texts, "windows"), atol=1e-6)
    assert np.abs(reference.predict([LONG], "windows") - reference.predict([LONG], "head")).max() > 1e-5


def test_a_1000_token_text_gets_8_windows_and_is_flagged_truncated(client, reference):
    ids = reference.tokenizer(" ".join(f"w{i}" for i in range(2000)), add_special_tokens=False)["input_ids"][:998]
    text = reference.tokenizer.decode(ids)
    body = client.post("/v1/classify", json={"inputs": text, "long_text": "windows"}).json()
    assert body["tokens"] == [1000] and body["windows"] == [8] and body["truncated"] == [True]


def test_v2_takes_the_policy_as_a_request_parameter(client, reference):
    req = {
        "inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": [LONG, "fine"]}],
        "parameters": {"long_text": "windows:32:16:max"},
    }
    r = client.post("/v2/models/torch-fp32/infer", json=req)
    assert r.status_code == 200, r.text
    assert r.json()["parameters"]["long_text"] == "windows:32:16:max"
    probs = np.array(next(o for o in r.json()["outputs"] if o["name"] == "probabilities")["data"]).reshape(2, 2)
    np.testing.assert_allclose(probs, reference.predict([LONG, "fine"], "windows:32:16:max"), atol=1e-5)
    assert client.get("/v2/models/torch-fp32").json()["parameters"]["long_text"] == "head"


@pytest.mark.parametrize("bad", ["middle", "windows:64:32:median", "windows:65", "head-tail:64"])
def test_a_bad_policy_is_refused_naming_the_allowed_forms(client, bad):
    r = client.post("/v1/classify", json={"inputs": "x", "long_text": bad})
    assert r.status_code == 422 and FORMS in r.json()["error"] and "long_text" in r.json()["error"]
    req = {
        "inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["x"]}],
        "parameters": {"long_text": bad},
    }
    r = client.post("/v2/models/torch-fp32/infer", json=req)
    assert r.status_code == 422 and FORMS in r.json()["error"] and "parameters.long_text" in r.json()["error"]


def test_windowed_answers_do_not_move_under_concurrent_mixed_requests(client, reference):
    """32 concurrent requests, mixed policies and lengths, batched together: each answer is its text's alone."""
    rng = random.Random(0)
    words = LONG.split()
    jobs = [
        (
            [" ".join(words[: rng.randint(2, len(words))]) for _ in range(rng.randint(1, 3))],
            rng.choice([None, "windows", "windows:32:16:max", "head-tail", "tail"]),
        )
        for _ in range(32)
    ]
    want = [np.concatenate([reference.predict([t], p) for t in texts]) for texts, p in jobs]

    def send(job):
        texts, policy = job
        return client.post("/v1/classify", json={"inputs": texts, "long_text": policy}).json()

    with ThreadPoolExecutor(16) as pool:
        bodies = list(pool.map(send, jobs))
    for body, w in zip(bodies, want):
        assert np.abs(_probs(body, reference.labels) - w).max() < 1e-5


def test_the_servers_default_policy_and_max_windows(tiny_variant, reference):
    from qserve.serve.infra.config import ServeConfig

    cfg = ServeConfig(variant_dir=str(tiny_variant), device="cpu", threads=1, long_text="windows", max_windows=3)
    with serving(cfg) as srv, httpx2.Client(base_url=srv.url, timeout=60, trust_env=False) as c:
        body = c.post("/v1/classify", json={"inputs": [LONG]}).json()
        assert body["long_text"] == "windows:64:48:mean" and body["windows"] == [3] and body["truncated"] == [True]
        assert c.get("/v1/models").json()["models"][0]["long_text"] == "windows:64:48:mean"
        body = c.post("/v1/classify", json={"inputs": [LONG], "long_text": "head"}).json()
        assert body["windows"] == [1]
        np.testing.assert_allclose(_probs(body, reference.labels), reference.predict([LONG], "head"), atol=1e-5)


def test_a_bad_server_policy_names_the_flag():
    from qserve import QserveError
    from qserve.serve.infra.config import ServeConfig

    with pytest.raises(QserveError, match="--long-text") as e:
        ServeConfig(variant_dir="x", long_text="sideways").validate()
    assert FORMS in str(e.value)
    with pytest.raises(QserveError, match="--max-windows"):
        ServeConfig(variant_dir="x", max_windows=0).validate()


def test_the_schema_publishes_the_policies_this_server_accepts(client):
    from qserve.longtext import pattern

    comps = client.get("/openapi.json").json()["components"]["schemas"]
    for name in ("ClassifyRequest", "V2RequestParameters"):
        (text, _null) = comps[name]["properties"]["long_text"]["anyOf"]
        assert text["pattern"] == pattern(64)  # H 1..63, W 3..64 for the tiny variant's max_length 64
        assert "maxLength" not in text  # --max-chars bounds the texts, not the policy string
    body = comps["ClassifyResponse"]["properties"]
    assert {"tokens", "windows", "truncated", "long_text"} <= set(body)


def test_ray_replicas_get_the_policy_and_the_window_cap():
    from qserve.serve.infra.deploy import app_args

    args = app_args("/models/v", {"long_text": "windows", "max_windows": 3, "port": 1})
    assert args == {"variant_dir": "/models/v", "long_text": "windows", "max_windows": 3}
