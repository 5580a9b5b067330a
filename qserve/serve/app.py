"""The FastAPI app factory: the serving state (state.py) wired into the lifespan, error bodies, OpenAPI.

    qserve serve models/minilm-imdb-variants/onnx-int8 --port 8000
    curl -s -H 'Content-Type: application/json' -d '{"inputs": ["great", "awful"]}' 127.0.0.1:8000/v1/classify

The lifespan starts the load in the background, so the server answers at once:
/health is 200 from the first moment, /ready (and /v2/health/ready) is 503 until
every model is loaded and warmed up, and inference routes answer 503 meanwhile.
Routes live in routes.py, v2.py and v2_repository.py; the models and their lifecycle in state.py. With
--grpc-port the lifespan also serves the V2 gRPC API (grpc_v2.py) on the same state; OTEL_* variables turn
on traces (tracing.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from qserve import QserveError, __version__
from qserve.artifact import Manifest
from qserve.runtime import threadnames
from qserve.serve.core.errors import ApiError
from qserve.serve.core.guard import OPEN_PATHS, GuardMiddleware
from qserve.serve.core.repository import Repository
from qserve.serve.core.state import Loader, Selection, ServeState, load_model
from qserve.serve.core.texts import unicode_problem
from qserve.serve.infra.config import ServeConfig
from qserve.serve.infra.metrics import Metrics
from qserve.serve.infra.tracing import TraceMiddleware
from qserve.serve.infra.tracing import from_env as tracing_from_env

log = logging.getLogger("qserve.serve")

MAX_SHAPE_BRANCHES = 256  # above this --max-inputs, the shape/data pairing is stated in prose only
INFERENCE_PATHS = frozenset({"/v1/classify", "/v2/models/{name}/infer", "/v2/models/{name}/versions/{version}/infer",
                             "/predict", "/", "/classify"})  # POST / is TEI's predict (GET / is the page)


def create_app(config: ServeConfig, loader: Loader | None = None,
               on_load_failure: Callable[[BaseException], None] | None = None,
               selection: Selection | None = None, repository: Repository | None = None) -> FastAPI:
    """Build the app. `loader(config)` returns a model (default: state.load_model, load_runtime on
    config.variant_dir); tests inject wrappers through it. `on_load_failure` lets the CLI exit when loading
    fails. `selection` says why the default model's variant was chosen, shown in /v1/models (a model dir
    says so itself). `repository` names the models and their dirs (default: config's DIR or
    --model-repository); a name clash or a --shadow naming no model raises QserveError here."""
    config.validate()
    st = ServeState(config=config, metrics=Metrics(), loader=loader or load_model, selection=selection,
                    on_load_failure=on_load_failure, repository=repository, tracing=tracing_from_env())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        st.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="qserve-infer",
                                         initializer=threadnames.named("qserve-infer"))  # its OS name: profilers see it
        st.load_task = asyncio.create_task(st.start())
        grpc = None
        try:
            if config.grpc_port is not None:  # the V2 gRPC service, on this event loop and this state
                from qserve.serve.protocols.grpc_v2 import start_grpc

                grpc = app.state.grpc = await start_grpc(st, config.host, config.grpc_port)
            yield
        finally:
            if grpc is not None:
                await grpc.stop()
            # uvicorn has already let in-flight requests finish; now drain what is still queued.
            await st.stop()
            if st.tracing is not None:
                st.tracing.shutdown()  # exports the spans still buffered
            log.info("shutdown complete")

    # telemetry off: qserve traces requests itself (infra/tracing.py, --otel); FastAPI's native telemetry would
    # add spans of its own and look up the global providers on every request.
    app = FastAPI(title="qserve", version=__version__, lifespan=lifespan,
                  telemetry={"tracing": False, "metrics": False, "logs": False},
                  description="Text classification with dynamic batching: an HF pipeline-style API "
                              "(/v1) and the KServe V2 Open Inference Protocol (/v2).")
    app.state.qserve = st
    _install_error_handlers(app, st)
    from qserve.serve.protocols.page import add_page
    from qserve.serve.protocols.routes import add_routes, fast_routes

    from qserve.serve.protocols.tei import add_tei_routes
    from qserve.serve.protocols.vllm_api import add_vllm_routes

    add_routes(app, st)
    add_page(app, st)  # GET / (the served models' page) and GET /v1/report
    add_tei_routes(app, st)  # TEI's /predict, POST / (huggingface_hub's InferenceClient), /info, /tokenize, /decode
    add_vllm_routes(app, st)  # vLLM's /classify
    app.add_middleware(GuardMiddleware, api_key=config.api_key, max_body_bytes=config.max_body_bytes,
                       metrics=st.metrics, routes=app.router.routes, arrivals=st.arrivals,
                       queue_full=st.queue_full_retry_after, inference_paths=INFERENCE_PATHS,
                       metrics_public=config.metrics_public, tei=_tei_refusal,
                       fast=fast_routes(st, _error_response))
    if st.tracing is not None:  # outermost: a request's trace covers auth, body and checks too
        app.add_middleware(TraceMiddleware, tracing=st.tracing, skip=OPEN_PATHS | {"/metrics"})
    _install_openapi(app, config)
    return app


def _tei_request(path: str, method: str) -> bool:
    from qserve.serve.protocols.tei import is_tei

    return is_tei(path, method)


def _tei_refusal(path: str, method: str, status: int, message: str) -> bytes | None:
    """The guard's refusal (401, 413, 415, 429) on a TEI route, in TEI's error shape."""
    if not _tei_request(path, method):
        return None
    import json

    from qserve.serve.protocols.tei import error_body

    return json.dumps(error_body(status if status in (401, 413, 429) else 422, message)).encode()


def _error(request: Request, status: int, message: str, headers: dict[str, str] | None = None,
           validation: bool = False) -> JSONResponse:
    rid = getattr(request.state, "request_id", None)
    # A message may quote client input (a field name, say) holding a lone surrogate: escape it, so
    # rendering the error can never fail.
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    if _tei_request(request.url.path, request.method):  # TEI's routes answer TEI's {"error", "error_type"}
        from qserve.serve.protocols.tei import error_response

        return error_response(status, message, headers, validation)
    return JSONResponse({"error": message, "request_id": rid}, status_code=status, headers=headers)


async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
    return _error(request, exc.status, exc.message, exc.headers, getattr(exc, "body_error", False))


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    rid = getattr(request.state, "request_id", None)
    log.exception("request %s: unhandled error", rid)
    return _error(request, 500, f"internal error; quote request id {rid}")


async def _error_response(request: Request, exc: Exception) -> JSONResponse:
    """An exception answered as the handlers below answer it (for routes served past FastAPI)."""
    return await (_api_error(request, exc) if isinstance(exc, ApiError) else _unexpected(request, exc))


def _install_error_handlers(app: FastAPI, st: ServeState) -> None:
    app.add_exception_handler(ApiError, _api_error)  # type: ignore[arg-type]  # Starlette types it as Exception

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        cfg = st.config
        tei = _tei_request(request.url.path, request.method)
        if request.url.path.startswith("/v2/"):
            allowed = ('expected {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [n], '
                       f'"data": [n strings]}}]}} with 1..{cfg.max_inputs} non-empty texts of at most '
                       f"{cfg.max_chars} characters")
        elif tei:
            allowed = ('expected TEI\'s {"inputs": str | [text] | [text, text_pair] | [[text, text_pair], ...], '
                       '"truncate": bool, "truncation_direction": "Right" | "Left", "raw_scores": bool} with '
                       f"1..{cfg.max_inputs} non-empty texts of at most {cfg.max_chars} characters")
        elif request.url.path == "/classify":
            allowed = ('expected vLLM\'s {"model": str | null, "input": str | list[str], "truncate_prompt_tokens": '
                       f"int | null}} with 1..{cfg.max_inputs} non-empty texts of at most {cfg.max_chars} characters")
        else:
            allowed = ('expected {"inputs": str | list[str], "top_k": int >= 1 | null} (a text-pair model: '
                       '{"text", "text_pair"} objects in place of strings) with '
                       f"1..{cfg.max_inputs} non-empty texts of at most {cfg.max_chars} characters")
        errors = exc.errors()
        bad_json = [e for e in errors if e.get("type") == "json_invalid"]
        if bad_json:
            detail = bad_json[0].get("ctx", {}).get("error", "JSON decode error")
            return _error(request, 400, f"malformed JSON body ({detail}); {allowed}", validation=tei)
        for e in errors:  # pydantic says only "not a valid string" for a lone surrogate: say why
            value = e.get("input")
            if isinstance(value, str) and unicode_problem(value):
                return _error(request, 422, f"{_loc(e)} {unicode_problem(value)}", validation=tei)
        parts = []
        for e in errors[:4]:
            loc = ".".join(str(p) for p in e.get("loc", ())[1:]) or "body"
            parts.append(f"{loc}: {e.get('msg')}")
        return _error(request, 422, f"invalid request: {'; '.join(parts)}; {allowed}", validation=tei)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = str(exc.detail)
        if exc.status_code == 404:
            message = (f"no route {request.url.path}; see /docs. Inference: POST /v1/classify or "
                       "POST /v2/models/{name}/infer")
        elif exc.status_code == 405:
            message = f"method {request.method} not allowed on {request.url.path}; see /docs"
            # Starlette's Allow names the first route of the path only: / is GET (the page) and POST (TEI)
            methods = sorted({m for r in app.routes if getattr(r, "path", None) == request.url.path
                              for m in (getattr(r, "methods", None) or ())})
            if methods:
                return _error(request, 405, message, {**(getattr(exc, "headers", None) or {}),
                                                      "Allow": ", ".join(methods)})
        return _error(request, exc.status_code, message, getattr(exc, "headers", None))

    app.add_exception_handler(Exception, _unexpected)


def _loc(error: dict) -> str:
    """pydantic's loc as the client wrote it: ("body", "inputs", "list[str]", 1) -> inputs[1]."""
    out = ""
    for p in error.get("loc", ())[1:]:
        if isinstance(p, int):
            out += f"[{p}]"
        elif "[" not in p and "-" not in p:  # skip union-member tags such as constrained-str
            out += f".{p}" if out else p
    return out or "body"


def _install_openapi(app: FastAPI, config: ServeConfig) -> None:
    def openapi() -> dict:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        from qserve.serve.protocols.v2 import register_schemas

        register_schemas(schema)
        _publish_limits(schema, config)
        if config.api_key:  # the guard enforces it; this makes /docs offer an Authorize button
            schema.setdefault("components", {})["securitySchemes"] = {
                "bearer": {"type": "http", "scheme": "bearer"}}
            schema["security"] = [{"bearer": []}]
            for path in OPEN_PATHS | ({"/metrics"} if config.metrics_public else set()):
                for method, op in schema["paths"].get(path, {}).items():
                    if path != "/" or method == "get":  # POST / is TEI's predict: it needs the key
                        op["security"] = []
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to customise the document


def _served_manifest(variant_dir: str | None) -> Manifest | None:
    """The served variant's manifest, read once for the OpenAPI document (so the document is right before the
    model has loaded); None: no readable manifest (several models, a model dir, a repository)."""
    from pathlib import Path

    from qserve.artifact import read_manifest

    if not variant_dir:
        return None
    try:
        return read_manifest(Path(variant_dir))
    except (OSError, QserveError):
        return None


def _publish_long_text(comps: dict, manifest: Manifest | None) -> None:
    """The long_text pattern bounded by the served variant's max_length, so a client knows which H and W this
    server takes. No readable manifest: the unbounded form stays."""
    from qserve.longtext import pattern

    if manifest is None:
        return
    max_length = manifest.max_length
    from qserve.serve.protocols.vllm_api import publish as publish_vllm

    publish_vllm(comps, max_length)
    shape, bounded = pattern(), pattern(max_length)
    for name in ("ClassifyRequest", "V2RequestParameters", "TeiPredictRequest", "TeiRootRequest", "VllmClassifyRequest"):
        for alt in ((comps.get(name) or {}).get("properties", {}).get("long_text") or {}).get("anyOf", []):
            if alt.get("pattern") == shape:
                alt["pattern"] = bounded


def _publish_limits(schema: dict, config: ServeConfig) -> None:
    """Write the server's own limits (--max-inputs, --max-chars) into the request schemas, so the
    document says exactly what this server accepts."""
    comps = schema.get("components", {}).get("schemas", {})

    def walk(node: Any) -> None:  # Any: any node of the OpenAPI JSON document
        if isinstance(node, dict):
            if node.get("type") == "string" and "pattern" in node:  # a text (schemas.Text)
                node["maxLength"] = config.max_chars
            items = node.get("items")
            if node.get("type") == "array" and isinstance(items, dict) and (
                    "pattern" in items or items.get("type") == "array"  # a list of texts (maybe nested)
                    or any("pattern" in a for a in items.get("anyOf", []))):  # texts or text pairs
                node.setdefault("maxItems", config.max_inputs)
            for k, v in node.items():
                if k != "long_text":  # a policy string, not a text: _publish_long_text bounds it
                    walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    for name in ("ClassifyRequest", "TextPair", "V2InputTensor", "TeiPredictRequest", "TeiRootRequest",
                 "TeiTokenizeRequest", "VllmClassifyRequest"):
        walk(comps.get(name))
    manifest = _served_manifest(config.variant_dir)
    _publish_long_text(comps, manifest)
    from qserve.serve.core.outputs import publish_outputs
    from qserve.serve.core.pairs import PAIR, publish_inputs

    # `name=dir` (one named model): the document's outputs are that model's, as they always were
    named = manifest if "=" not in (config.variant_dir or "") else _served_manifest(config.variant_dir.split("=", 1)[-1])
    publish_outputs(comps, named)
    publish_inputs(comps, manifest)  # a text-pair model's forms only where the model takes them
    from qserve.serve.protocols.tei import publish as publish_tei

    pair = None if manifest is None else manifest.takes == PAIR
    if pair is not None:
        publish_tei(comps, pair)  # TEI's sequences: [text] or [text, text_pair], as the model takes them
    tensor = comps.get("V2InputTensor")
    if tensor is not None and config.max_inputs <= MAX_SHAPE_BRANCHES:
        # JSON Schema cannot say "shape matches len(data)", but it can list every valid pairing.
        tensor["anyOf"] = [{"properties": {"shape": {"enum": [[n], [n, 1]]}, "data": {"minItems": n, "maxItems": n}}}
                           for n in range(1, config.max_inputs + 1)]
