"""KServe V2 over gRPC (serve/protocols/v2/grpc_service.py) with Triton's own client (tritonclient.grpc), served live.

    python -m pytest tests/integration/test_serve_grpc.py -q

The server is the real app under uvicorn with --grpc-port 0; gRPC and HTTP answer from the same
serving state, so the tests compare the two protocols' answers, error messages and metrics.
"""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

grpcclient = pytest.importorskip("tritonclient.grpc")
httpx2 = pytest.importorskip("httpx2")
from tritonclient.utils import InferenceServerException  # noqa: E402

KEY = "grpc-s3cret-key-42"
TEXTS = ["A wonderful film, I loved it.", "Dull and far too long.", "ok"]


def _start(tiny_variant, **cfg):
    from qserve.serve.app import create_app
    from qserve.serve.infra.config import ServeConfig
    from qserve.serve.infra.uvicorn_server import ServerThread

    app = create_app(ServeConfig(variant_dir=str(tiny_variant), threads=1, grpc_port=0, **cfg))
    srv = ServerThread(app).start()
    with httpx2.Client(base_url=srv.url, timeout=30, trust_env=False) as c:
        deadline = time.monotonic() + 30
        while c.get("/ready").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
    return srv, app.state.grpc.port


@pytest.fixture(scope="module")
def servers(tiny_variant):
    import torch

    threads = torch.get_num_threads()
    open_srv, open_port = _start(tiny_variant)
    key_srv, key_port = _start(tiny_variant, api_key=KEY, max_inputs=4, max_chars=200)
    yield {"open": (open_srv, open_port), "key": (key_srv, key_port)}
    open_srv.stop()
    key_srv.stop()
    torch.set_num_threads(threads)


def _input(texts, shape=None):
    arr = np.array([t.encode() for t in texts], dtype=object)
    inp = grpcclient.InferInput("text", shape or [len(texts)], "BYTES")
    inp.set_data_from_numpy(arr.reshape(shape) if shape else arr)
    return inp


def _http_probs(url, texts, headers=None):
    body = {"inputs": [{"name": "text", "shape": [len(texts)], "datatype": "BYTES", "data": texts}]}
    r = httpx2.post(f"{url}/v2/models/torch-fp32/infer", json=body, headers=headers or {}, timeout=30, trust_env=False)
    assert r.status_code == 200, r.text
    out = {o["name"]: o for o in r.json()["outputs"]}
    return np.array(out["probabilities"]["data"], dtype=np.float32).reshape(out["probabilities"]["shape"])


def test_tritonclient_grpc_infers_health_and_metadata_without_a_key(servers):
    srv, port = servers["open"]
    c = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    assert c.is_server_live() and c.is_server_ready() and c.is_model_ready("torch-fp32")
    meta = c.get_server_metadata()
    assert meta.name == "qserve" and "binary_tensor_data" in meta.extensions
    md = c.get_model_metadata("torch-fp32")
    (version,) = md.versions  # the manifest's short hash, as HTTP lists it
    assert httpx2.get(f"{srv.url}/v2/models/torch-fp32", timeout=30, trust_env=False).json()["versions"] == [version]
    assert [i.name for i in md.inputs] == ["text"] and md.inputs[0].datatype == "BYTES"
    assert [(o.name, o.datatype) for o in md.outputs] == [
        ("probabilities", "FP32"),
        ("label", "BYTES"),
        ("truncated", "BOOL"),
    ]
    cfg = c.get_model_config("torch-fp32").config
    assert cfg.name == "torch-fp32" and cfg.input[0].data_type == 13  # TYPE_STRING
    assert cfg.parameters["labels"].string_value == "negative,positive"
    assert cfg.parameters["model_version"].string_value == version

    res = c.infer("torch-fp32", [_input(TEXTS)])
    probs = res.as_numpy("probabilities")
    assert probs.shape == (3, 2) and np.allclose(probs.sum(1), 1, atol=1e-5)
    assert np.abs(probs - _http_probs(srv.url, TEXTS)).max() <= 1e-6  # one state, one model: the same answers
    labels = ["negative", "positive"]
    assert [x.decode() for x in res.as_numpy("label")] == [labels[j] for j in probs.argmax(1)]
    assert res.as_numpy("truncated").tolist() == [False] * 3
    resp = res.get_response()
    assert resp.model_name == "torch-fp32" and resp.model_version == version
    assert resp.parameters["max_length"].int64_param == 64 and resp.parameters["long_text"].string_param == "head"

    # [n, 1], a chosen output, an explicit version, and contents.bytes_contents instead of raw bytes
    res = c.infer(
        "torch-fp32", [_input(TEXTS, [3, 1])], model_version=version, outputs=[grpcclient.InferRequestedOutput("label")]
    )
    assert res.as_numpy("probabilities") is None and len(res.as_numpy("label")) == 3
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        req = service_pb2.ModelInferRequest(model_name="torch-fp32")
        t = req.inputs.add(name="text", datatype="BYTES", shape=[2])
        t.contents.bytes_contents.extend([x.encode() for x in TEXTS[:2]])
        out, call = service_pb2_grpc.GRPCInferenceServiceStub(ch).ModelInfer.with_call(req)
    got = np.frombuffer(out.raw_output_contents[0], dtype="<f4").reshape(2, 2)
    assert np.abs(got - probs[:2]).max() <= 1e-6
    assert "x-trace-id" not in dict(call.initial_metadata())  # tracing is off here


def test_the_api_key_is_required_in_metadata(servers):
    srv, port = servers["key"]
    c = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    assert c.is_server_live() and c.is_server_ready()  # probes stay open, as /v2/health/* on HTTP
    for headers, why in (
        (None, "missing"),
        ({"authorization": "Bearer wrong-key-123"}, "invalid"),
        ({"authorization": KEY}, "invalid"),
    ):  # no scheme
        with pytest.raises(InferenceServerException) as e:
            c.infer("torch-fp32", [_input(TEXTS)], headers=headers)
        assert e.value.status() == "StatusCode.UNAUTHENTICATED"
        assert f"{why} credentials: send the metadata 'authorization: Bearer <api key>'" in e.value.message()
        with pytest.raises(InferenceServerException, match="credentials"):
            c.get_model_metadata("torch-fp32", headers=headers)
    auth = {"authorization": f"Bearer {KEY}"}
    probs = c.infer("torch-fp32", [_input(TEXTS)], headers=auth).as_numpy("probabilities")
    assert np.abs(probs - _http_probs(srv.url, TEXTS, {"Authorization": f"Bearer {KEY}"})).max() <= 1e-6
    assert c.is_model_ready("torch-fp32", headers=auth)


@pytest.mark.parametrize("case", ["too_many", "too_long", "blank", "unknown_model", "version", "shape", "bad_output"])
def test_errors_carry_the_http_message_and_the_mapped_code(servers, case):
    srv, port = servers["key"]
    auth = {"authorization": f"Bearer {KEY}"}
    model, texts, shape, version, outputs = "torch-fp32", TEXTS, None, "", None
    http_body = None
    if case == "too_many":
        texts = ["fine"] * 5
    elif case == "too_long":
        texts = ["x" * 201]
    elif case == "blank":
        texts = ["ok", " \u200b "]
    elif case == "unknown_model":
        model = "nope"
    elif case == "version":
        version = "2"
    elif case == "shape":
        shape = [1, 3]
    elif case == "bad_output":
        outputs = [grpcclient.InferRequestedOutput("logits")]
    c = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    with pytest.raises(InferenceServerException) as e:
        c.infer(model, [_input(texts, shape)], model_version=version, outputs=outputs, headers=auth)
    code, message = e.value.status(), e.value.message()
    expected = {
        "too_many": "INVALID_ARGUMENT",
        "too_long": "INVALID_ARGUMENT",
        "blank": "INVALID_ARGUMENT",
        "unknown_model": "NOT_FOUND",
        "version": "NOT_FOUND",
        "shape": "INVALID_ARGUMENT",
        "bad_output": "INVALID_ARGUMENT",
    }[case]
    assert code == f"StatusCode.{expected}"
    if case in ("too_many", "too_long", "blank", "unknown_model", "version", "shape"):
        # the same check answers the same words over HTTP
        path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
        http_body = {"inputs": [{"name": "text", "shape": shape or [len(texts)], "datatype": "BYTES", "data": texts}]}
        r = httpx2.post(
            srv.url + path, json=http_body, headers={"Authorization": f"Bearer {KEY}"}, timeout=30, trust_env=False
        )
        assert r.status_code in (400, 404, 422) and r.json()["error"] in message
    else:
        assert "'logits'" in message and "probabilities, label, truncated" in message


def test_grpc_requests_are_counted_in_the_same_metrics(servers):
    srv, port = servers["open"]
    c = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    c.infer("torch-fp32", [_input(TEXTS)])
    with pytest.raises(InferenceServerException):
        c.infer("nope", [_input(TEXTS)])
    text = httpx2.get(f"{srv.url}/metrics", timeout=30, trust_env=False).text
    route = 'route="/inference.GRPCInferenceService/ModelInfer"'
    assert any(
        route in line and 'method="GRPC"' in line and 'status="200"' in line and 'model="torch-fp32"' in line
        for line in text.splitlines()
        if line.startswith("qserve_requests_total")
    )
    assert any(
        route in line and 'status="404"' in line and 'model=""' in line
        for line in text.splitlines()
        if line.startswith("qserve_requests_total")
    )


def test_a_body_over_the_limit_is_refused_with_the_http_message(tiny_variant):
    import torch

    threads = torch.get_num_threads()
    srv, port = _start(tiny_variant, max_body_bytes=2048)
    try:
        c = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        with pytest.raises(InferenceServerException) as e:
            c.infer("torch-fp32", [_input(["word " * 100] * 8)])
        assert e.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        assert "request body is over the limit of 2048 bytes (--max-body-bytes)" in e.value.message()
    finally:
        srv.stop()
        torch.set_num_threads(threads)


def test_serving_without_grpc_or_tracing_imports_neither(tiny_variant):
    # (FastAPI itself imports the OpenTelemetry API when it is installed; the SDK and exporters are ours)
    code = (
        "import sys\nfrom qserve.serve.app import create_app\nfrom qserve.serve.infra.config import ServeConfig\n"
        "create_app(ServeConfig(variant_dir=sys.argv[1]))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('grpc', 'tritonclient')\n"
        "             or m.startswith(('opentelemetry.sdk', 'opentelemetry.exporter'))))"
    )
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("OTEL_")}
    # (the app names its models when it is built, so it needs a real variant dir, though nothing loads)
    out = subprocess.run(
        [sys.executable, "-c", code, str(tiny_variant)], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_grpc_is_refused_with_the_ray_engine(tiny_variant):
    from qserve import QserveError
    from qserve.cli import build_parser

    args = build_parser().parse_args(["serve", str(tiny_variant), "--engine", "ray", "--grpc-port", "8001"])
    with pytest.raises(QserveError, match="--grpc-port .* applies to --engine uvicorn only"):
        args.func(args)
