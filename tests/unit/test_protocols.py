"""A protocol is one module: its identity is spelled there and in registry.py only, and every route is served once.

    python -m pytest tests/unit/test_protocols.py -q

No server, no model: the declarations (qserve/serve/protocols/spec.py) and the app built from them.
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


def test_app_names_no_inference_path():
    from qserve.serve.protocols.registry import SERVED

    app = (SERVE / "app.py").read_text(encoding="utf-8")
    assert SERVED.inference_paths, "no inference route declared"
    for path in SERVED.inference_paths:
        assert f'"{path}"' not in app and f"'{path}'" not in app, path


def test_every_declared_route_is_served_once_in_declaration_order(tmp_path):
    from fastapi.routing import APIRoute

    from qserve.serve.app import create_app
    from qserve.serve.core.repository import Repository
    from qserve.serve.infra.config import ServeConfig
    from qserve.serve.protocols.registry import PROTOCOLS

    # no model: nothing loads before the lifespan starts, and the routes are there from the start
    app = create_app(ServeConfig(variant_dir=str(tmp_path)), repository=Repository([]))
    served = [(r.path, sorted(r.methods)) for r in app.routes if isinstance(r, APIRoute)]
    declared = [(r.path, [r.method]) for p in PROTOCOLS for r in p.routes]
    assert served == declared


def test_inference_routes_are_answered_by_one_path():
    from qserve.serve.protocols.registry import SERVED

    inference = [(p.name, r.method, r.path) for p in SERVED.all for r in p.routes if r.inference]
    assert {(m, path) for _, m, path in inference} == {
        ("POST", "/v1/classify"),
        ("POST", "/v2/models/{name}/infer"),
        ("POST", "/v2/models/{name}/versions/{version}/infer"),
        ("POST", "/predict"),
        ("POST", "/"),
        ("POST", "/classify"),
    }
    # FastAPI holds the route's OpenAPI entry only: its endpoint answers nothing (the guard answers every request)
    from qserve.serve.protocols.spec import documented

    assert all(
        r.answer is not None and r.endpoint(None) is documented for p in SERVED.all for r in p.routes if r.inference
    )
    assert not any("Signature" in p.read_text(encoding="utf-8") for p in SERVE.rglob("*.py"))


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
def test_a_request_belongs_to_the_protocol_of_its_route(path, method, label, own_errors):
    """The route for the path and method; for a method no route there takes, the path's POST route, else its first."""
    from qserve.serve.protocols.registry import SERVED
    from qserve.serve.protocols.spec import errors

    assert SERVED.label(path, method) == label
    assert (errors(SERVED.match(path, method)) is not None) is own_errors


def test_the_guard_refusal_has_the_protocols_error_shape():
    import json

    from qserve.serve.protocols.registry import SERVED

    body = SERVED.refusal(SERVED.match("/predict", "POST"), 415, "Content-Type must be application/json")
    assert body is not None and json.loads(body) == {
        "error": "Content-Type must be application/json",
        "error_type": "validation",
    }
    assert (
        SERVED.refusal(SERVED.match("/classify", "POST"), 415, "x") is None
    )  # vLLM keeps qserve's {"error", "request_id"}
    assert SERVED.labels == ("v1", "v2", "tei", "vllm", "other")
    assert SERVED.hint == "POST /v1/classify or POST /v2/models/{name}/infer"


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
    for front in ("guard.py", "protocols/v2/grpc_service.py"):
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
    """Paths are compiled and matched in spec.Protocols only (and spec.inference reads a path's parameters for the
    document): the guard and the app read the table."""
    assert _serve_files_matching(r"compile_path|\.matches\(") == {"protocols/spec.py"}
    guard = (SERVE / "guard.py").read_text(encoding="utf-8")
    assert "self.protocols.match(" in guard and "routes=" not in guard


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
    """spec.read_json, the guard's one reading of a JSON body, against a FastAPI route taking the same model: every
    body gets the same value, or the same refusal (a 400's words, a 422's errors), so no status or message moved
    when the FastAPI route stopped answering."""
    import asyncio

    from fastapi import FastAPI
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import PlainTextResponse

    from qserve.serve.infra.errors import ApiError
    from qserve.serve.protocols.registry import SERVED
    from qserve.serve.protocols.spec import read_json

    model = {m.__name__: m for m in SERVED.bodies}[model_name]

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
