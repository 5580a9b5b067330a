"""Real clients and hostile input against a real uvicorn: Triton's own HTTP client (JSON and binary
tensor data), lone surrogates, invisible texts, strict types, wrong methods.

    python -m pytest tests/integration/test_serve_interop.py -q
"""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from conftest import serving

httpx2 = pytest.importorskip("httpx2")
httpclient = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402

TEXTS = ["A wonderful, moving film.", "Dreadful, I walked out.", "ok"]


@pytest.fixture(scope="module")
def server(tiny_variant):
    from qserve.serve.infra.config import ServeConfig

    cfg = ServeConfig(variant_dir=str(tiny_variant), threads=1, max_inputs=8, max_chars=500)
    with serving(cfg) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    with httpx2.Client(base_url=server.url, timeout=30, trust_env=False) as c:
        yield c


@pytest.fixture(scope="module")
def triton(server):
    c = httpclient.InferenceServerClient(url=f"{server.host}:{server.port}")
    yield c
    c.close()


@pytest.fixture(scope="module")
def reference(tiny_variant):
    from qserve.runtime import load_runtime

    return load_runtime(tiny_variant, device="cpu")


def _text_input(texts, binary):
    inp = httpclient.InferInput("text", [len(texts)], "BYTES")
    inp.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=object), binary_data=binary)
    return inp


def test_triton_client_discovers_the_model(triton):
    assert triton.is_server_live() and triton.is_server_ready() and triton.is_model_ready("torch-fp32")
    meta = triton.get_model_metadata("torch-fp32")
    assert meta["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    assert [o["name"] for o in meta["outputs"]] == ["probabilities", "label", "truncated"]
    config = triton.get_model_config("torch-fp32")
    assert config["name"] == "torch-fp32" and config["input"][0]["data_type"] == "TYPE_STRING"
    assert config["output"][0]["dims"] == [-1, 2]
    assert "binary_tensor_data" in triton.get_server_metadata()["extensions"]
    with pytest.raises(InferenceServerException, match="unknown model 'nope'"):
        triton.get_model_config("nope")
    assert not triton.is_model_ready("nope")


@pytest.mark.parametrize("binary_in", [True, False], ids=["binary-in", "json-in"])
@pytest.mark.parametrize("binary_out", [True, False, None], ids=["binary-out", "json-out", "default-out"])
def test_triton_client_infer_matches_the_runtime(triton, reference, binary_in, binary_out):
    if binary_out is None:  # the client's defaults: no outputs named -> binary_data_output for all
        res = triton.infer("torch-fp32", [_text_input(TEXTS, binary_in)])
    else:
        outs = [
            httpclient.InferRequestedOutput(n, binary_data=binary_out) for n in ("probabilities", "label", "truncated")
        ]
        res = triton.infer("torch-fp32", [_text_input(TEXTS, binary_in)], outputs=outs)
    probs = res.as_numpy("probabilities")
    assert probs.dtype == np.float32 and probs.shape == (3, 2)
    np.testing.assert_allclose(probs, reference.predict(TEXTS), atol=1e-5)
    labels = [x.decode() if isinstance(x, bytes) else x for x in res.as_numpy("label")]
    assert labels == [reference.labels[j] for j in probs.argmax(1)]
    assert res.as_numpy("truncated").tolist() == [False, False, False]
    raw = res.get_response()
    is_binary = binary_out is not False
    assert all(("binary_data_size" in (o.get("parameters") or {})) == is_binary for o in raw["outputs"])


def test_triton_client_mixed_outputs_and_versioned_path(triton, reference):
    outs = [
        httpclient.InferRequestedOutput("label", binary_data=False),
        httpclient.InferRequestedOutput("probabilities", binary_data=True),
    ]
    (version,) = triton.get_model_metadata("torch-fp32")["versions"]  # the manifest's short hash
    assert version == reference.manifest.digest[:12]
    res = triton.infer(
        "torch-fp32", [_text_input(TEXTS[:2], True)], outputs=outs, model_version=version, request_id="req-7"
    )
    raw = res.get_response()
    assert [o["name"] for o in raw["outputs"]] == ["label", "probabilities"] and raw["id"] == "req-7"
    assert raw["model_version"] == version
    np.testing.assert_allclose(res.as_numpy("probabilities"), reference.predict(TEXTS[:2]), atol=1e-5)
    with pytest.raises(InferenceServerException, match="unknown model version '2'"):
        triton.infer("torch-fp32", [_text_input(TEXTS[:1], True)], model_version="2")


def test_triton_client_errors_carry_the_message(triton):
    with pytest.raises(InferenceServerException, match="no visible character") as e:
        triton.infer("torch-fp32", [_text_input(["ok", "\u200b\u200b \u2060"], True)])
    assert e.value.status() == "422" and "inputs[0].data[1]" in e.value.message()
    with pytest.raises(InferenceServerException, match="unknown model 'other'"):
        triton.infer("other", [_text_input(["ok"], True)])
    inp = httpclient.InferInput("TEXT", [1], "BYTES")
    inp.set_data_from_numpy(np.array([b"ok"], dtype=object))
    with pytest.raises(InferenceServerException, match="'text'"):
        triton.infer("torch-fp32", [inp])


def test_compressed_request_is_a_clear_415(triton):
    with pytest.raises(InferenceServerException, match="Content-Encoding 'gzip' is not accepted") as e:
        triton.infer("torch-fp32", [_text_input(["ok"], True)], request_compression_algorithm="gzip")
    assert e.value.status() == "415"


def _binary_body(head: dict, raw: bytes) -> tuple[bytes, dict]:
    header = json.dumps(head).encode()
    return header + raw, {"Inference-Header-Content-Length": str(len(header))}


def test_binary_input_that_is_not_utf8_names_the_element(client):
    elems = [b"fine", b"\xff\xfebad", b"also fine"]
    raw = b"".join(struct.pack("<I", len(e)) + e for e in elems)
    body, headers = _binary_body(
        {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [3], "parameters": {"binary_data_size": len(raw)}}]},
        raw,
    )
    r = client.post("/v2/models/torch-fp32/infer", content=body, headers=headers)
    assert r.status_code == 422 and "inputs[0][1] is not valid UTF-8" in r.json()["error"]
    # A truncated element and a header length past the body are refused too, never a 500.
    body, headers = _binary_body(
        {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 6}}]},
        struct.pack("<I", 9) + b"ab",
    )
    r = client.post("/v2/models/torch-fp32/infer", content=body, headers=headers)
    assert r.status_code == 400 and "declares 9 bytes" in r.json()["error"]
    r = client.post("/v2/models/torch-fp32/infer", content=b"{}", headers={"Inference-Header-Content-Length": "99"})
    assert r.status_code == 400 and "Inference-Header-Content-Length" in r.json()["error"]


LONE = '{"inputs": ["fine", "x\\ud800y"]}'


def test_lone_surrogate_is_a_422_naming_the_input_and_costs_nobody_else(client, reference):
    r = client.post("/v1/classify", content=LONE.encode(), headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert "inputs[1] is not valid Unicode: lone surrogate U+D800 at character 1" in r.json()["error"]
    v2 = '{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": ["fine", "\\udfff"]}]}'
    r = client.post("/v2/models/torch-fp32/infer", content=v2.encode())  # no Content-Type, as tritonclient
    assert r.status_code == 422 and "inputs[0].data[1] is not valid Unicode" in r.json()["error"]
    r = client.post(
        "/v2/models/torch-fp32/infer",
        content=b'{"id": "\\ud800", "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["ok"]}]}',
    )
    assert r.status_code == 422 and "id is not valid Unicode" in r.json()["error"]
    # A surrogate in a field name ends in the error text: escaped, still a clean 422.
    r = client.post(
        "/v1/classify", content=b'{"inputs": "ok", "\\ud800": 1}', headers={"content-type": "application/json"}
    )
    assert r.status_code == 422
    # The next request, and the valid text alone, are served as usual.
    r = client.post("/v1/classify", json={"inputs": ["fine"]})
    assert r.status_code == 200
    assert r.json()["predictions"][0][0]["score"] == pytest.approx(float(reference.predict(["fine"]).max()), abs=1e-5)


@pytest.mark.parametrize(
    "body,fragment",
    [
        ({"inputs": "ok", "top_k": "2"}, "top_k"),
        ({"inputs": "ok", "top_k": True}, "top_k"),
        ({"inputs": "ok", "top_k": 1.5}, "top_k"),
        ({"inputs": b"\xef\xbb\xbf".decode() + "\u200d\u00a0\t"}, "no visible character"),
        ({"inputs": ["ok", "\u2028\u200b"]}, "inputs[1] has no visible character"),
        ({"inputs": ["ok"], "model": 3}, "model"),
    ],
)
def test_v1_is_strict(client, body, fragment):
    r = client.post("/v1/classify", json=body)
    assert r.status_code == 422 and fragment in r.json()["error"], r.text


def test_json_integer_2_0_is_an_integer(client):
    r = client.post("/v1/classify", json={"inputs": ["ok"], "top_k": 1.0})
    assert r.status_code == 200 and len(r.json()["predictions"][0]) == 1


def test_wrong_method_is_405_with_allow_and_missing_content_type_only_ok_on_v2(client):
    for method, path in (
        ("PUT", "/v1/classify"),
        ("PUT", "/health"),
        ("DELETE", "/v2/models/torch-fp32/infer"),
        ("POST", "/v1/models"),
    ):
        r = client.request(method, path, json={"inputs": "x"})
        assert r.status_code == 405 and "allow" in r.headers and "error" in r.json(), (method, path, r.text)
    r = client.post("/v1/classify", content=b'{"inputs": "ok"}')
    assert r.status_code == 415 and "application/json" in r.json()["error"]
    r = client.post("/v2/models/torch-fp32/infer", content=b'{"inputs": "ok"}', headers={"content-type": "text/csv"})
    assert r.status_code == 415 and "octet-stream" in r.json()["error"]
