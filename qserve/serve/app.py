"""The FastAPI app factory: the serving state (core/state.py) in the lifespan, every protocol's routes, error bodies
and OpenAPI document, and the guard in front.

    qserve serve models/minilm-imdb-variants/onnx-int8 --port 8000
    curl -s 127.0.0.1:8000/openapi.json

/health is 200 from the first moment; /ready and the inference routes answer 503 until every model is loaded and
warmed up (the lifespan loads in the background). What a protocol serves beside HTTP (V2's gRPC) starts here too.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from qserve import QserveError, __version__
from qserve.artifact import Manifest, read_manifest
from qserve.longtext import pattern
from qserve.runtime import threadnames
from qserve.serve.core.repository import Repository
from qserve.serve.core.state import Loader, Selection, ServeState, load_model
from qserve.serve.core.texts import unicode_problem
from qserve.serve.guard import GuardMiddleware
from qserve.serve.infra.config import ServeConfig
from qserve.serve.infra.errors import ApiError
from qserve.serve.infra.metrics import Metrics
from qserve.serve.infra.tracing import from_env as tracing_from_env
from qserve.serve.protocols import spec
from qserve.serve.protocols.registry import SERVED
from qserve.serve.protocols.spec import Protocols, Published, RouteMatch, Running

log = logging.getLogger("qserve.serve")


def create_app(
    config: ServeConfig,
    loader: Loader | None = None,
    on_load_failure: Callable[[BaseException], None] | None = None,
    selection: Selection | None = None,
    repository: Repository | None = None,
) -> FastAPI:
    """Build the app. `loader(config)` returns a model (default: state.load_model, load_runtime on
    config.variant_dir); tests inject wrappers through it. `on_load_failure` lets the CLI exit when loading
    fails. `selection` says why the default model's variant was chosen, shown in /v1/models (a model dir
    says so itself). `repository` names the models and their dirs (default: config's DIR or
    --model-repository); a name clash or a --shadow naming no model raises QserveError here."""
    config = config.validate().for_device()  # the batcher sized for the device, where the flags leave it
    protocols = SERVED  # every protocol this server speaks (protocols/registry.py): its routes, errors, labels
    st = ServeState(
        config=config,
        metrics=Metrics(protocols.label, protocols.labels),
        loader=loader or load_model,
        selection=selection,
        on_load_failure=on_load_failure,
        repository=repository,
        tracing=tracing_from_env(),
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        st.executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="qserve-infer", initializer=threadnames.named("qserve-infer")
        )  # its OS name: profilers see it
        st.load_task = asyncio.create_task(st.start())
        running: list[Running] = []
        try:
            for protocol in protocols.all:  # what a protocol serves beside HTTP (V2's gRPC), on this loop and state
                for key, start in protocol.servers.items():
                    server = await start(st)
                    if server is not None:
                        setattr(app.state, key, server)
                        running.append(server)
            yield
        finally:
            for server in reversed(running):
                await server.stop()
            # uvicorn has already let in-flight requests finish; now drain what is still queued.
            await st.stop()
            if st.tracing is not None:
                st.tracing.shutdown()  # exports the spans still buffered
            log.info("shutdown complete")

    # telemetry off: qserve traces requests itself (infra/tracing.py, --otel); FastAPI's native telemetry would
    # add spans of its own and look up the global providers on every request.
    app = FastAPI(
        title="qserve",
        version=__version__,
        lifespan=lifespan,
        telemetry={"tracing": False, "metrics": False, "logs": False},
        description="Text classification with dynamic batching: an HF pipeline-style API "
        "(/v1) and the KServe V2 Open Inference Protocol (/v2).",
    )
    app.state.qserve = st
    errors = Errors(protocols, config)
    _install_error_handlers(app, errors)
    for protocol in protocols.all:
        for route in protocol.routes:
            app.add_api_route(route.path, route.endpoint(st), methods=[route.method], **route.options)
    # every request's one way in (the admission layer, as gRPC's), and the one that answers the inference routes
    app.add_middleware(GuardMiddleware, state=st, protocols=protocols, render=errors.response)
    _install_openapi(app, config, protocols)
    return app


class Errors:
    """Every error answer, in the error shape of the protocol the request is on (qserve's {"error",
    "request_id"} unless the protocol declares its own)."""

    def __init__(self, protocols: Protocols, config: ServeConfig):
        self.protocols, self.config = protocols, config

    def match(self, request: Request) -> RouteMatch:
        """The route the request reached, as the guard matched it (under the app's root_path too)."""
        return self.protocols.match(spec.route_path(request.scope), request.method)

    def error(
        self,
        request: Request,
        status: int,
        message: str,
        headers: dict[str, str] | None = None,
        validation: bool = False,
    ) -> JSONResponse:
        rid = getattr(request.state, "request_id", None)
        # A message may quote client input (a field name, say) holding a lone surrogate: escape it, so
        # rendering the error can never fail.
        message = message.encode("utf-8", "backslashreplace").decode("utf-8")
        shape = spec.errors(self.match(request))
        if shape is not None:
            code = shape.status(status, validation)
            return JSONResponse(shape.body(code, message), status_code=code, headers=headers)
        return JSONResponse({"error": message, "request_id": rid}, status_code=status, headers=headers)

    async def api_error(self, request: Request, exc: ApiError) -> JSONResponse:
        return self.error(request, exc.status, exc.message, exc.headers, getattr(exc, "body_error", False))

    async def unexpected(self, request: Request, exc: Exception) -> JSONResponse:
        rid = getattr(request.state, "request_id", None)
        log.exception("request %s: unhandled error", rid)
        return self.error(request, 500, f"internal error; quote request id {rid}")

    async def validation(self, request: Request, exc: RequestValidationError) -> JSONResponse:
        """A body that did not parse, in the protocol's own words for what it reads (`validation`: its error shape
        may answer that apart from a refused value)."""
        allowed = self.protocols.expected(self.match(request), self.config)
        errs = exc.errors()
        bad_json = [e for e in errs if e.get("type") == "json_invalid"]
        if bad_json:
            detail = bad_json[0].get("ctx", {}).get("error", "JSON decode error")
            return self.error(request, 400, f"malformed JSON body ({detail}); {allowed}", validation=True)
        for e in errs:  # pydantic says only "not a valid string" for a lone surrogate: say why
            value = e.get("input")
            if isinstance(value, str) and unicode_problem(value):
                return self.error(request, 422, f"{_loc(e)} {unicode_problem(value)}", validation=True)
        parts = []
        for e in errs[:4]:
            loc = ".".join(str(p) for p in e.get("loc", ())[1:]) or "body"
            parts.append(f"{loc}: {e.get('msg')}")
        return self.error(request, 422, f"invalid request: {'; '.join(parts)}; {allowed}", validation=True)

    async def response(self, request: Request, exc: Exception) -> JSONResponse:
        """An exception answered as the handlers answer it (for the inference routes, answered by the guard)."""
        if isinstance(exc, ApiError):
            return await self.api_error(request, exc)
        if isinstance(exc, RequestValidationError):
            return await self.validation(request, exc)
        return await self.unexpected(request, exc)


def _install_error_handlers(app: FastAPI, errors: Errors) -> None:
    _error = errors.error
    app.add_exception_handler(ApiError, errors.api_error)  # type: ignore[arg-type]  # Starlette types it as Exception
    app.add_exception_handler(RequestValidationError, errors.validation)  # type: ignore[arg-type]  # the same

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = str(exc.detail)
        if exc.status_code == 404:
            message = f"no route {request.url.path}; see /docs. Inference: {errors.protocols.hint}"
        elif exc.status_code == 405:
            message = f"method {request.method} not allowed on {request.url.path}; see /docs"
            # Starlette's Allow names the first route of the path only: / is GET (the page) and POST
            methods = errors.protocols.allowed(errors.match(request).template)
            if methods:
                return _error(
                    request, 405, message, {**(getattr(exc, "headers", None) or {}), "Allow": ", ".join(methods)}
                )
        return _error(request, exc.status_code, message, getattr(exc, "headers", None))

    app.add_exception_handler(Exception, errors.unexpected)


def _loc(error: dict) -> str:
    """pydantic's loc as the client wrote it: ("body", "inputs", "list[str]", 1) -> inputs[1]."""
    out = ""
    for p in error.get("loc", ())[1:]:
        if isinstance(p, int):
            out += f"[{p}]"
        elif "[" not in p and "-" not in p:  # skip union-member tags such as constrained-str
            out += f".{p}" if out else p
    return out or "body"


def _install_openapi(app: FastAPI, config: ServeConfig, protocols: Protocols) -> None:
    def openapi() -> dict:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        spec.document_bodies(schema, protocols.bodies)
        _publish_limits(schema, config, protocols)
        if config.api_key:  # the guard enforces it; this makes /docs offer an Authorize button
            schema.setdefault("components", {})["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
            schema["security"] = [{"bearer": []}]
            for path in protocols.docs | protocols.open_paths | ({"/metrics"} if config.metrics_public else set()):
                for method, op in schema["paths"].get(path, {}).items():
                    if path not in protocols.inference_paths or method == "get":  # POST / (inference) needs it
                        op["security"] = []
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to customise the document


def _served_manifest(variant_dir: str | None) -> Manifest | None:
    """The served variant's manifest, read once for the OpenAPI document (so the document is right before the
    model has loaded); None: no readable manifest (several models, a model dir, a repository)."""
    if not variant_dir:
        return None
    try:
        return read_manifest(Path(variant_dir))
    except (OSError, QserveError):
        return None


def _publish_long_text(comps: dict, manifest: Manifest | None, names: list[str]) -> None:
    """The long_text pattern bounded by the served variant's max_length, so a client knows which H and W this
    server takes. No readable manifest: the unbounded form stays."""
    if manifest is None:
        return
    shape, bounded = pattern(), pattern(manifest.max_length)
    for name in names:
        for alt in ((comps.get(name) or {}).get("properties", {}).get("long_text") or {}).get("anyOf", []):
            if alt.get("pattern") == shape:
                alt["pattern"] = bounded


def _publish_limits(schema: dict, config: ServeConfig, protocols: Protocols) -> None:
    """Write the server's own limits (--max-inputs, --max-chars) into the request schemas, so the
    document says exactly what this server accepts."""
    comps = schema.get("components", {}).get("schemas", {})

    def walk(node: Any) -> None:  # Any: any node of the OpenAPI JSON document
        if isinstance(node, dict):
            if node.get("type") == "string" and "pattern" in node:  # a text (schemas.Text)
                node["maxLength"] = config.max_chars
            items = node.get("items")
            if (
                node.get("type") == "array"
                and isinstance(items, dict)
                and (
                    "pattern" in items
                    or items.get("type") == "array"  # a list of texts (maybe nested)
                    or any("pattern" in a for a in items.get("anyOf", []))
                )
            ):  # texts or text pairs
                node.setdefault("maxItems", config.max_inputs)
            for k, v in node.items():
                if k != "long_text":  # a policy string, not a text: _publish_long_text bounds it
                    walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    for name in dict.fromkeys(n for p in protocols.all for n in p.openapi.texts):
        walk(comps.get(name))
    manifest = _served_manifest(config.variant_dir)
    _publish_long_text(comps, manifest, [n for p in protocols.all for n in p.openapi.long_text])
    # `name=dir` (one named model): the document's answers (outputs, threshold) are that model's, as they always were
    answers = (
        manifest if "=" not in (config.variant_dir or "") else _served_manifest(config.variant_dir.split("=", 1)[-1])
    )
    published = Published(config, manifest, answers)
    for p in protocols.all:  # each protocol's schemas narrowed to this server and its default model
        if p.openapi.publish is not None:
            p.openapi.publish(comps, published)
