"""OpenTelemetry traces (serve/infra/tracing.py) end to end: the OTEL_* environment turns them on, a live server
exports over OTLP (http/protobuf and grpc) to a collector running in this test, and the spans are checked.

    python -m pytest tests/integration/test_serve_tracing.py -q
"""

from __future__ import annotations

import gzip
import threading
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

pytest.importorskip("opentelemetry.sdk")
pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
grpcclient = pytest.importorskip("tritonclient.grpc")
httpx2 = pytest.importorskip("httpx2")

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc  # noqa: E402

from qserve import QserveError  # noqa: E402
from qserve.serve.infra.tracing import wanted  # noqa: E402

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
GRPC_TRACE = "0af7651916cd43dd8448eb211c80319c"
STEPS = {"receive", "queue wait", "tokenize", "inference", "respond"}


class Collector:
    """A minimal OTLP trace receiver: keeps every span it is sent, with its resource's service name."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, object]] = []
        self.lock = threading.Lock()

    def take(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        with self.lock:
            for rs in request.resource_spans:
                service = next((a.value.string_value for a in rs.resource.attributes if a.key == "service.name"), "")
                for ss in rs.scope_spans:
                    self.spans += [(service, s) for s in ss.spans]


def _http_collector(col: Collector):
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            assert self.path == "/v1/traces"
            col.take(trace_service_pb2.ExportTraceServiceRequest.FromString(body))
            out = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server.server_address[1], server.shutdown


def _grpc_collector(col: Collector):
    import grpc

    class Service(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request, context):  # noqa: N802 - the proto's name
            col.take(request)
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return port, lambda: server.stop(0)


def test_the_environment_decides_and_bad_values_name_the_allowed_ones():
    assert wanted({}) is None
    assert wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}) == "otlp"
    assert wanted({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}) == "otlp"
    assert wanted({"OTEL_TRACES_EXPORTER": "console"}) == "console"
    assert wanted({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}) is None
    assert wanted({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}) is None
    with pytest.raises(QserveError, match="OTEL_TRACES_EXPORTER='zipkin': qserve exports traces with one of otlp"):
        wanted({"OTEL_TRACES_EXPORTER": "zipkin"})
    from qserve.serve.infra.tracing import from_env

    with pytest.raises(QserveError, match="http/protobuf or grpc"):
        from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})


def test_no_otel_environment_no_tracing(tiny_variant, monkeypatch):
    from qserve.serve.app import create_app
    from qserve.serve.infra.config import ServeConfig

    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_TRACES_EXPORTER"):
        monkeypatch.delenv(name, raising=False)
    app = create_app(ServeConfig(variant_dir=str(tiny_variant)))
    assert app.state.qserve.tracing is None
    assert app.state.qserve.admission.tracing is None  # the admission layer begins no trace


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_requests_are_traced_to_an_otlp_collector_with_named_steps(tiny_variant, monkeypatch, protocol):
    import torch

    from qserve.serve.app import create_app
    from qserve.serve.infra.config import ServeConfig
    from qserve.serve.infra.uvicorn_server import ServerThread

    col = Collector()
    port, stop_collector = (_http_collector if protocol == "http/protobuf" else _grpc_collector)(col)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "qserve-test")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    threads = torch.get_num_threads()
    app = create_app(ServeConfig(variant_dir=str(tiny_variant), threads=1, grpc_port=0))
    srv = ServerThread(app).start()
    try:
        with httpx2.Client(base_url=srv.url, timeout=30, trust_env=False) as c:
            deadline = time.monotonic() + 30
            while c.get("/ready").status_code != 200 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert "x-trace-id" not in c.get("/health").headers  # probes are not traced
            r = c.post(
                "/v1/classify",
                json={"inputs": ["great film", "awful"]},
                headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"},
            )
            assert r.status_code == 200 and r.headers["x-trace-id"] == CLIENT_TRACE
            fresh = c.post("/v1/classify", json={"inputs": "fine"}).headers["x-trace-id"]
            assert len(fresh) == 32 and fresh != CLIENT_TRACE
            bad = c.post("/v1/classify", json={"inputs": []})
            assert bad.status_code == 422 and len(bad.headers["x-trace-id"]) == 32
            long = " ".join(f"scene{i % 30} was {'great' if i % 3 else 'dull'}" for i in range(60))
            win = c.post("/v1/classify", json={"inputs": [long, "short"], "long_text": "windows"})
            assert win.status_code == 200 and win.json()["windows"][0] > 1
        import grpc
        from tritonclient.grpc import service_pb2, service_pb2_grpc

        with grpc.insecure_channel(f"127.0.0.1:{app.state.grpc.port}") as ch:
            req = service_pb2.ModelInferRequest(model_name="torch-fp32")
            req.inputs.add(name="text", datatype="BYTES", shape=[1]).contents.bytes_contents.append(b"lovely")
            out, call = service_pb2_grpc.GRPCInferenceServiceStub(ch).ModelInfer.with_call(
                req, metadata=(("traceparent", f"00-{GRPC_TRACE}-{CLIENT_SPAN}-01"),)
            )
        assert dict(call.initial_metadata())["x-trace-id"] == GRPC_TRACE
        assert np.frombuffer(out.raw_output_contents[0], dtype="<f4").shape == (2,)
    finally:
        srv.stop()  # the app's shutdown flushes the spans still buffered
        torch.set_num_threads(threads)
        stop_collector()

    by_trace: dict[str, list] = {}
    for service, span in col.spans:
        assert service == "qserve-test"
        by_trace.setdefault(span.trace_id.hex(), []).append(span)
    assert {CLIENT_TRACE, fresh, GRPC_TRACE} <= set(by_trace)
    for trace_id, root_name in (
        (CLIENT_TRACE, "POST /v1/classify"),
        (GRPC_TRACE, "inference.GRPCInferenceService/ModelInfer"),
    ):
        spans = by_trace[trace_id]
        roots = [s for s in spans if s.parent_span_id.hex() == CLIENT_SPAN]
        assert [s.name for s in roots] == [root_name]  # a child of the client's span
        root = roots[0]
        assert root.kind == root.SPAN_KIND_SERVER
        steps = {s.name: s for s in spans if s.parent_span_id == root.span_id}
        assert set(steps) == STEPS
        # the steps follow each other inside the request
        order = [steps[n] for n in ("receive", "queue wait", "tokenize", "inference", "respond")]
        assert root.start_time_unix_nano == order[0].start_time_unix_nano
        for a, b in zip(order, order[1:]):
            assert a.end_time_unix_nano <= b.start_time_unix_nano + 1_000  # (tokenize -> inference: same instant)
        assert order[-1].end_time_unix_nano <= root.end_time_unix_nano
        attrs = {a.key: a.value for a in steps["inference"].attributes}
        assert attrs["qserve.texts"].int_value >= 1 and attrs["qserve.buckets"].string_value == "none"
    # a windowed text: a windows step (the cut) between tokenize and inference
    spans = by_trace[win.headers["x-trace-id"]]
    (root,) = [s for s in spans if s.name == "POST /v1/classify"]
    steps = {s.name: s for s in spans if s.parent_span_id == root.span_id}
    assert set(steps) == STEPS | {"windows"}
    for a, b in (("tokenize", "windows"), ("windows", "inference")):
        assert steps[a].end_time_unix_nano <= steps[b].start_time_unix_nano + 1_000
    attrs = {a.key: a.value for a in steps["windows"].attributes}
    assert (
        attrs["qserve.windowed_texts"].int_value == 1
        and attrs["qserve.pieces"].int_value == 1 + win.json()["windows"][0]
    )
    refused = {s.name for s in by_trace[bad.headers["x-trace-id"]]}
    assert refused == {"POST /v1/classify", "receive"}  # refused before its texts were queued
