"""A protocol is one module: its identity is spelled there and in registry.py only, and every route is served once.

    python -m pytest tests/unit/test_protocols.py -q

No server, no model: the declarations (qserve/serve/protocols/spec.py), the route table and the app built from them.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVE = ROOT / "qserve" / "serve"
# A protocol's identity, as a grep finds it (TEI's paths too; words that merely contain the letters don't count)
IDENTITY = {
    "vllm_api.py": re.compile(r'vllm|"/classify"', re.I),
    "tei.py": re.compile(r"\btei\b|/embed|/predict", re.I),
}


@pytest.mark.parametrize("module", sorted(IDENTITY))
def test_a_protocol_is_spelled_in_its_module_and_the_registry_only(module):
    found = sorted(
        str(p.relative_to(SERVE)) for p in SERVE.rglob("*.py") if IDENTITY[module].search(p.read_text(encoding="utf-8"))
    )
    # package docstrings (__init__.py) list the protocols in words; nothing else may name one
    allowed = {f"protocols/{module}", "protocols/registry.py", "__init__.py", "protocols/__init__.py"}
    assert set(found) <= allowed, sorted(set(found) - allowed)
    assert f"protocols/{module}" in found and "protocols/registry.py" in found


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    from qserve.serve.app import create_app
    from qserve.serve.core.repository import Repository
    from qserve.serve.infra.config import ServeConfig

    # no model: nothing loads before the lifespan starts, and the routes are there from the start
    return create_app(ServeConfig(variant_dir=str(tmp_path_factory.mktemp("none"))), repository=Repository([]))


def test_app_names_no_inference_path(app):
    text = (SERVE / "app.py").read_text(encoding="utf-8")
    assert app.router.table.inference_paths, "no inference route declared"
    for path in app.router.table.inference_paths:
        assert f'"{path}"' not in text and f"'{path}'" not in text, path


def test_every_declared_route_is_served_once_in_declaration_order(app):
    """One table holds every route the server answers: the document's pages (GET and HEAD), then each protocol's
    routes as declared."""
    from qserve.serve.protocols.registry import PROTOCOLS

    pages = [(m, p) for p in ("/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc") for m in ("GET", "HEAD")]
    declared = [(r.method, r.path) for p in PROTOCOLS for r in p.routes]
    assert [(r.method, r.path) for _, r, _ in app.router.table.routes] == pages + declared


def test_inference_routes_are_answered_by_one_path(app):
    """The router answers every route by its declaration: no FastAPI or Starlette app or router behind it, no stub
    endpoint, no route read back from Starlette's scope."""
    from starlette.applications import Starlette

    inference = [(r.method, r.path) for _, r, _ in app.router.table.routes if r.inference]
    assert set(inference) == {
        ("POST", "/v1/classify"),
        ("POST", "/v2/models/{name}/infer"),
        ("POST", "/v2/models/{name}/versions/{version}/infer"),
        ("POST", "/predict"),
        ("POST", "/"),
        ("POST", "/classify"),
    }
    assert not isinstance(app, Starlette)
    assert not _serve_files_matching(r"scope\.get\(\"route\"\)|add_api_route|APIRoute|FastAPI\(|Signature")


@pytest.mark.parametrize(
    "path, method, label, own_errors",
    [
        ("/v1/classify", "POST", "v1", False),
        ("/v1/report", "GET", "v1", False),
        ("/v1/classify", "GET", "v1", False),
        ("/v2/models/{name}/infer", "POST", "v2", False),
        ("/v2/models/m/versions/3/infer", "DELETE", "v2", False),
        ("/v2/repository/index", "POST", "v2", False),
        ("/health", "GET", "other", False),
        ("/health", "POST", "other", False),
        ("/", "GET", "other", False),
        ("/", "HEAD", "other", False),
        ("/", "POST", "tei", True),
        ("/", "OPTIONS", "tei", True),
        ("/predict", "GET", "tei", True),
        ("/info", "HEAD", "tei", True),
        ("/classify", "POST", "vllm", False),
        ("/classify", "GET", "vllm", False),
        ("/docs", "GET", "other", False),
        ("unmatched", "POST", "other", False),
    ],
)
def test_a_request_belongs_to_the_protocol_of_its_route(app, path, method, label, own_errors):
    """The route for the path and method; for a method no route there takes, the path's POST route, else its first."""
    found = app.router.table.match(path, method)
    assert found.label == label
    assert (found.protocol is not None and found.protocol.errors is not None) is own_errors


def test_every_answer_costs_one_route_lookup_and_has_its_protocols_error_shape(app, monkeypatch):
    """Each request is looked up once, whatever it gets: a page, a 404, a 405, a refusal (in the error shape of the
    protocol it reached: TEI's {"error", "error_type"} keeps the refusal's status), a refused body, an unready
    model; and the table's labels and 404 hint."""
    from starlette.testclient import TestClient

    table = app.router.table
    calls: list[tuple[str, str]] = []
    match = table.match
    monkeypatch.setattr(table, "match", lambda path, method: calls.append((path, method)) or match(path, method))
    c = TestClient(app)
    tei_ct = c.post("/predict", content=b"{}", headers={"content-type": "text/plain"})
    assert tei_ct.status_code == 415
    assert tei_ct.json() == {
        "error": "Content-Type must be application/json, got 'text/plain'",
        "error_type": "validation",
    }
    vllm_ct = c.post("/classify", content=b"{}", headers={"content-type": "text/plain"})
    assert vllm_ct.status_code == 415 and set(vllm_ct.json()) == {"error", "request_id"}  # vLLM keeps qserve's
    assert c.get("/health").json() == {"status": "alive"} and c.get("/docs").status_code == 200
    nowhere = c.get("/nowhere")
    assert nowhere.status_code == 404 and "POST /v1/classify or POST /v2/models/{name}/infer" in nowhere.json()["error"]
    assert c.put("/").status_code == 405 and c.put("/").headers["allow"] == "GET, POST"
    assert c.post("/v1/classify", json={"inputs": 3}).status_code == 422
    assert c.post("/v1/classify", json={"inputs": "fine"}).status_code == 503  # no model loaded
    assert len(calls) == 9 and [m for _, m in calls].count("PUT") == 2
    assert table.labels == ("v1", "v2", "tei", "vllm", "other")
    assert table.hint == "POST /v1/classify or POST /v2/models/{name}/infer"


def _serve_files_matching(pattern: str) -> set[str]:
    regex = re.compile(pattern)
    return {str(p.relative_to(SERVE)) for p in SERVE.rglob("*.py") if regex.search(p.read_text(encoding="utf-8"))}


def test_kserve_v2_is_one_package():
    """KServe V2 (REST and gRPC): its schemas, tensors, OpenAPI and services live in protocols/v2/ only; the core
    holds nothing of it (the issue's grep, package docstrings aside)."""
    found = _serve_files_matching(r"V2[A-Z][A-Za-z]+|\bv2_[a-z]")
    assert found and all(f.startswith("protocols/v2/") for f in found), sorted(found)
    assert not _serve_files_matching(r"\bv1_predictions\b|\bv1_inputs\b")


def test_one_way_in_for_http_and_grpc():
    """Both transports take a request through the same admission calls; the request-id rule is written once."""
    for front in ("router.py", "protocols/v2/grpc_service.py"):
        text = (SERVE / front).read_text(encoding="utf-8")
        for step in ("admission.enter(", "admission.admit(", "admission.leave("):
            assert step in text, (front, step)
    # a fresh id is made in the admission layer (and vLLM's answer ids, which are not request ids); no transport
    # checks a client's id by hand
    assert _serve_files_matching(r"uuid4\(\)|isalnum\(\)|x-request-id.*match") == {
        "infra/admission.py",
        "protocols/vllm_api.py",
    }
    from qserve.serve.infra.admission import request_id

    assert request_id("abc-1.x_2") == "abc-1.x_2" and request_id("bad id") != "bad id" and request_id(None)


def test_one_route_table():
    """Paths are compiled and matched in router.Table only: the router reads it, once per request."""
    assert _serve_files_matching(r"compile_path|\.matches\(") == {"router.py"}
    router = (SERVE / "router.py").read_text(encoding="utf-8")
    assert router.count("self.table.match(") == 1 and "routes=" not in router


# Bodies an inference route may get: good ones, and every way FastAPI refuses one (400 or 422, and its words)
BODIES = [
    b'{"inputs": "fine"}',
    b'{"input": "fine"}',
    b'\xef\xbb\xbf{"inputs": "fine"}',
    b"",
    b"{",
    b'{"inputs": ',
    b"\xff\xfe{}",
    b'{"inputs": "\xff"}',
    b"null",
    b"[]",
    b'"fine"',
    b'{"inputs": "a\\ud800"}',
    b'{"inputs": "fine", "top_k": NaN}',
    b'{"inputs": "fine", "top_k": "2"}',
    b'{"inputs": "fine", "top_k": 1.0}',
    b'{"inputs": "fine", "inputs": 3}',
    b'{"inputs": [], "extra": 1}',
    b'{"inputs": "fine", "parameters": {"top_k": 0}}',
    b"[" * 5000 + b"]" * 5000,
]


@pytest.mark.parametrize(
    "model_name", ["ClassifyRequest", "TeiPredictRequest", "TeiRootRequest", "VllmClassifyRequest"]
)
def test_an_inference_body_is_read_as_fastapi_reads_it(model_name):
    """spec.read_json, the router's one reading of a JSON body, against a FastAPI route taking the same model: every
    body gets the same value, or the same refusal (a 400's words, a 422's errors), so no status or message moved
    when the FastAPI route stopped answering."""
    import asyncio

    from fastapi import FastAPI
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import PlainTextResponse

    from qserve.serve.infra.errors import ApiError
    from qserve.serve.protocols.registry import PROTOCOLS
    from qserve.serve.protocols.spec import read_json

    model = {r.body.schema.__name__: r.body.schema for p in PROTOCOLS for r in p.routes if r.body}[model_name]

    def errors(exc: RequestValidationError) -> str:
        return repr([(e["type"], tuple(e["loc"]), e["msg"], e.get("input"), e.get("ctx")) for e in exc.errors()])

    async def route(body) -> PlainTextResponse:
        return PlainTextResponse(repr(body))

    route.__annotations__["body"] = model  # what FastAPI reads: this module's annotations are strings
    app = FastAPI()
    app.add_api_route("/x", route, methods=["POST"])
    app.add_exception_handler(RequestValidationError, lambda r, e: PlainTextResponse(errors(e), 422))

    async def post(body: bytes) -> tuple[int, str]:
        scope = {"type": "http", "method": "POST", "path": "/x", "headers": [(b"content-type", b"application/json")]}
        scope |= {"query_string": b"", "root_path": "", "scheme": "http", "server": ("t", 80), "http_version": "1.1"}
        sent = iter([{"type": "http.request", "body": body, "more_body": False}])
        answer: list = []

        async def receive():
            return next(sent, {"type": "http.disconnect"})

        async def send(message):
            answer.append(message.get("status") or message.get("body", b"").decode())

        await app(scope, receive, send)
        return answer[0], answer[1]

    def ours(body: bytes) -> tuple[int, str]:
        try:
            return 200, repr(read_json(model, body))
        except RequestValidationError as e:
            return 422, errors(e)
        except ApiError as e:
            return e.status, '{"detail":"%s"}' % e.message  # FastAPI's own body for its 400

    for body in BODIES:
        assert ours(body) == asyncio.run(post(body)), body[:60]
