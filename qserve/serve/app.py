"""The FastAPI app factory: load the variant in the lifespan, batch requests, serve two APIs.

    qserve serve models/minilm-imdb-variants/onnx-int8 --port 8000
    curl -s -H 'Content-Type: application/json' -d '{"inputs": ["great", "awful"]}' 127.0.0.1:8000/v1/classify

The lifespan starts the load in the background, so the server answers at once:
/health is 200 from the first moment, /ready (and /v2/health/ready) is 503 until
the model is loaded and warmed up, and inference routes answer 503 meanwhile.
Routes live in routes.py; this file owns state, lifecycle and error mapping.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from qserve import __version__
from qserve.runtime.base import Classification
from qserve.serve.batcher import Batcher, BatchResult, NotAccepting, QueueFull
from qserve.serve.config import ServeConfig
from qserve.serve.errors import ApiError
from qserve.serve.guard import OPEN_PATHS, Arrivals, GuardMiddleware
from qserve.serve.metrics import Metrics
from qserve.serve.texts import text_problem, unicode_problem

log = logging.getLogger("qserve.serve")

MAX_SHAPE_BRANCHES = 256  # above this --max-inputs, the shape/data pairing is stated in prose only
INFERENCE_PATHS = frozenset({"/v1/classify", "/v2/models/{name}/infer", "/v2/models/{name}/versions/{version}/infer"})
Loader = Callable[[ServeConfig], Any]
"""config -> an object with the runtime contract (predict, truncated, labels, name, max_length, manifest)."""


@dataclass(eq=False)
class ServeState:
    config: ServeConfig
    metrics: Metrics
    loader: Loader
    on_load_failure: Callable[[BaseException], None] | None = None
    arrivals: Arrivals = field(default_factory=Arrivals)
    executor: ThreadPoolExecutor | None = None
    runtime: Any = None
    batcher: Batcher | None = None
    name: str | None = None
    load_error: str | None = None
    closing: bool = False
    load_task: asyncio.Task | None = field(default=None, repr=False)
    # /v1/models' engine block; the Ray engine swaps in one that asks the Serve controller.
    engine_info: Callable[[], Awaitable[dict[str, Any]]] = field(default=lambda: _single_process_info(), repr=False)

    @property
    def ready(self) -> bool:
        return self.batcher is not None and not self.closing

    def not_ready_reason(self) -> str:
        if self.closing:
            return "server is shutting down"
        if self.load_error:
            return f"model failed to load: {self.load_error}"
        return "model is loading; retry when /ready answers 200"

    def queue_full_retry_after(self) -> int | None:
        """Retry-After seconds while not one more text fits in the queue, else None (see guard.py)."""
        b = self.batcher
        if b is None or not b.full:
            return None
        return b.retry_after_s()

    def require_ready(self) -> None:
        if not self.ready:
            raise ApiError(503, self.not_ready_reason(), {"Retry-After": "1"})

    def require_model(self, name: str) -> None:
        self.require_ready()
        if name != self.name:
            raise ApiError(404, f"unknown model {name!r}; this server serves exactly one model: {self.name!r}")

    def check_texts(self, texts: list[Any], where: str) -> None:
        cfg = self.config
        if not texts:
            raise ApiError(422, f"{where} is empty; send 1..{cfg.max_inputs} texts")
        if len(texts) > cfg.max_inputs:
            raise ApiError(422, f"{where} has {len(texts)} texts; at most {cfg.max_inputs} per request "
                                "(--max-inputs); split the request")
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise ApiError(422, f"{where}[{i}] is {type(t).__name__}; every input must be a string")
            problem = text_problem(t)
            if problem:
                raise ApiError(422, f"{where}[{i}] {problem}")
            if len(t) > cfg.max_chars:
                raise ApiError(422, f"{where}[{i}] has {len(t)} characters; at most {cfg.max_chars} "
                                    "(--max-chars). Texts over the model's token limit are truncated, "
                                    "but the character limit bounds the work per request")

    def check_policy(self, policy: str | None, where: str) -> str | None:
        """A request's long-text policy written out in full for the served variant (422 naming the forms)."""
        if policy is None:
            return None
        from qserve.longtext import LongTextError

        try:
            return str(self.runtime.resolve_policy(policy, where))
        except LongTextError as e:
            raise ApiError(422, str(e)) from None

    async def classify(self, texts: list[str], request: Request, policy: str | None = None) -> BatchResult:
        """Queue texts for batched inference (read by `policy`, None = the server's default); map every
        failure to an HTTP answer."""
        self.require_ready()
        self.arrivals.end(request.scope)  # from here on this request is queued, not arriving
        try:
            return await self.batcher.submit(texts, self.config.request_timeout_s, policy)
        except QueueFull as e:
            self.metrics.rejected.labels("queue_full").inc()
            raise ApiError(429, str(e), {"Retry-After": str(e.retry_after_s)}) from None
        except NotAccepting:
            raise ApiError(503, "server is shutting down; retry on another replica", {"Retry-After": "1"}) from None
        except TimeoutError:
            raise ApiError(504, f"no answer within {self.config.request_timeout_s} s "
                                "(--request-timeout-s); the model may be overloaded") from None
        except Exception as e:
            rid = request.state.request_id
            log.error("request %s: inference failed: %s: %s", rid, type(e).__name__, e)
            raise ApiError(500, f"inference failed for this request ({type(e).__name__}); "
                                f"quote request id {rid}. Other requests are unaffected") from None


async def _single_process_info() -> dict[str, Any]:
    return {"engine": "uvicorn", "replica_count": 1}


def _default_loader(cfg: ServeConfig) -> Any:
    from qserve.runtime import RuntimeOptions, load_runtime

    # max_rows: windows of long texts make more rows than texts; a forward never runs more than a full batch
    options = RuntimeOptions(threads=cfg.threads, row_workers=cfg.row_workers, long_text=cfg.long_text,
                             max_windows=cfg.max_windows, max_rows=cfg.max_batch_size)
    return load_runtime(cfg.variant_dir, cfg.device, options,
                        allow_extra_files=cfg.allow_extra_files)


def _infer_fn(runtime: Any) -> Callable[[list[str], list[str | None] | None], Classification]:
    def infer(texts: list[str], policies: list[str | None] | None = None) -> Classification:
        # Tokenizing happens here, on the inference thread: the fast tokenizer is not thread-safe.
        r = runtime.classify(texts, policies)
        return Classification(np.asarray(r.probs, dtype=np.float32), [bool(t) for t in r.truncated],
                              [int(n) for n in r.tokens], [int(w) for w in r.windows])

    return infer


async def _load(app: FastAPI, st: ServeState) -> None:
    loop = asyncio.get_running_loop()
    cfg = st.config
    try:
        runtime = await loop.run_in_executor(st.executor, st.loader, cfg)
        infer = _infer_fn(runtime)
        # Warm-up: first-call costs (allocator, ORT graph init) should not land on a client. A batch of one
        # and a batch of several take different paths (onnx-int8's rows go to their own single-threaded
        # session and workers): in process, the first batch of 16 after a lone warm-up text took 43-45 ms,
        # the next ones 23-28 ms.
        await loop.run_in_executor(st.executor, infer, ["warm-up"])
        if cfg.max_batch_size > 1:
            # getattr: a test's loader may hand in a wrapper that exposes only predict/classify
            n = min(cfg.max_batch_size, 2 * max(1, getattr(runtime, "row_workers", 1)))
            await loop.run_in_executor(st.executor, infer, [f"warm-up {i}" for i in range(n)])
        # Everything loaded by now (torch, transformers, ORT, the app) lives as long as the server. Left in
        # the cyclic GC, each full collection under load walked those millions of objects and stopped every
        # thread for 330-415 ms, about every 5 s at c32 (gc.callbacks, this Xeon): the p99 tail. Freezing
        # them leaves collections only the objects requests create.
        gc.collect()
        gc.freeze()
    except Exception as e:
        st.load_error = f"{type(e).__name__}: {e}"
        log.error("could not load %s: %s", cfg.variant_dir, st.load_error)
        if st.on_load_failure is not None:
            st.on_load_failure(e)
        return
    st.runtime = runtime
    st.name = cfg.model_name or runtime.name
    batcher = Batcher(infer, st.executor, max_batch_size=cfg.max_batch_size, max_wait_ms=cfg.max_wait_ms,
                      max_queue=cfg.max_queue, metrics=st.metrics, arriving=lambda: st.arrivals.n)
    batcher.start()
    st.batcher = batcher
    st.metrics.ready.set(1)
    log.info("serving %s (%s, labels %s) with max batch %d, max wait %.1f ms", st.name,
             runtime.manifest.get("model_name"), runtime.labels, cfg.max_batch_size, cfg.max_wait_ms)


def create_app(config: ServeConfig, loader: Loader | None = None,
               on_load_failure: Callable[[BaseException], None] | None = None) -> FastAPI:
    """Build the app. `loader(config)` returns the runtime (default: load_runtime on config.variant_dir);
    tests inject wrappers through it. `on_load_failure` lets the CLI exit when loading fails."""
    config.validate()
    st = ServeState(config=config, metrics=Metrics(), loader=loader or _default_loader,
                    on_load_failure=on_load_failure)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        st.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="qserve-infer")
        st.load_task = asyncio.create_task(_load(app, st))
        try:
            yield
        finally:
            # uvicorn has already let in-flight requests finish; now drain what is still queued.
            st.closing = True
            st.metrics.ready.set(0)
            await st.load_task
            if st.batcher is not None:
                await st.batcher.close()
            if st.runtime is not None and hasattr(st.runtime, "close"):
                await asyncio.get_running_loop().run_in_executor(st.executor, st.runtime.close)
            st.executor.shutdown(wait=True)
            log.info("shutdown complete")

    app = FastAPI(title="qserve", version=__version__, lifespan=lifespan,
                  description="Text classification with dynamic batching: an HF pipeline-style API "
                              "(/v1) and the KServe V2 Open Inference Protocol (/v2).")
    app.state.qserve = st
    _install_error_handlers(app)
    from qserve.serve.routes import add_routes

    add_routes(app, st)
    app.add_middleware(GuardMiddleware, api_key=config.api_key, max_body_bytes=config.max_body_bytes,
                       metrics=st.metrics, routes=app.router.routes, arrivals=st.arrivals,
                       queue_full=st.queue_full_retry_after, inference_paths=INFERENCE_PATHS,
                       metrics_public=config.metrics_public)
    _install_openapi(app, config)
    return app


def _error(request: Request, status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    rid = getattr(request.state, "request_id", None)
    # A message may quote client input (a field name, say) holding a lone surrogate: escape it, so
    # rendering the error can never fail.
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    return JSONResponse({"error": message, "request_id": rid}, status_code=status, headers=headers)


def _install_error_handlers(app: FastAPI) -> None:
    st: ServeState = app.state.qserve

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return _error(request, exc.status, exc.message, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        cfg = st.config
        if request.url.path.startswith("/v2/"):
            allowed = ('expected {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [n], '
                       f'"data": [n strings]}}]}} with 1..{cfg.max_inputs} non-empty texts of at most '
                       f"{cfg.max_chars} characters")
        else:
            allowed = ('expected {"inputs": str | list[str], "top_k": int >= 1 | null} with '
                       f"1..{cfg.max_inputs} non-empty texts of at most {cfg.max_chars} characters")
        errors = exc.errors()
        bad_json = [e for e in errors if e.get("type") == "json_invalid"]
        if bad_json:
            detail = bad_json[0].get("ctx", {}).get("error", "JSON decode error")
            return _error(request, 400, f"malformed JSON body ({detail}); {allowed}")
        for e in errors:  # pydantic says only "not a valid string" for a lone surrogate: say why
            value = e.get("input")
            if isinstance(value, str) and unicode_problem(value):
                return _error(request, 422, f"{_loc(e)} {unicode_problem(value)}")
        parts = []
        for e in errors[:4]:
            loc = ".".join(str(p) for p in e.get("loc", ())[1:]) or "body"
            parts.append(f"{loc}: {e.get('msg')}")
        return _error(request, 422, f"invalid request: {'; '.join(parts)}; {allowed}")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = str(exc.detail)
        if exc.status_code == 404:
            message = (f"no route {request.url.path}; see /docs. Inference: POST /v1/classify or "
                       "POST /v2/models/{name}/infer")
        elif exc.status_code == 405:
            message = f"method {request.method} not allowed on {request.url.path}; see /docs"
        return _error(request, exc.status_code, message, getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        rid = getattr(request.state, "request_id", None)
        log.exception("request %s: unhandled error", rid)
        return _error(request, 500, f"internal error; quote request id {rid}")


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
        from qserve.serve.v2 import register_schemas

        register_schemas(schema)
        _publish_limits(schema, config)
        if config.api_key:  # the guard enforces it; this makes /docs offer an Authorize button
            schema.setdefault("components", {})["securitySchemes"] = {
                "bearer": {"type": "http", "scheme": "bearer"}}
            schema["security"] = [{"bearer": []}]
            for path in OPEN_PATHS | ({"/metrics"} if config.metrics_public else set()):
                for op in schema["paths"].get(path, {}).values():
                    op["security"] = []
        app.openapi_schema = schema
        return schema

    app.openapi = openapi


def _publish_long_text(comps: dict, config: ServeConfig) -> None:
    """The long_text pattern bounded by the served variant's max_length (read from its manifest, so the
    document is right before the model has loaded), so a client knows which H and W this server takes."""
    import json
    from pathlib import Path

    from qserve.longtext import pattern

    try:
        max_length = int(json.loads((Path(config.variant_dir) / "manifest.json").read_text("utf-8"))["max_length"])
    except (OSError, ValueError, KeyError, TypeError):
        return  # no readable manifest: the unbounded form stays
    shape, bounded = pattern(), pattern(max_length)
    for name in ("ClassifyRequest", "V2RequestParameters"):
        for alt in ((comps.get(name) or {}).get("properties", {}).get("long_text") or {}).get("anyOf", []):
            if alt.get("pattern") == shape:
                alt["pattern"] = bounded


def _publish_limits(schema: dict, config: ServeConfig) -> None:
    """Write the server's own limits (--max-inputs, --max-chars) into the request schemas, so the
    document says exactly what this server accepts."""
    comps = schema.get("components", {}).get("schemas", {})

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") == "string" and "pattern" in node:  # a text (schemas.Text)
                node["maxLength"] = config.max_chars
            items = node.get("items")
            if node.get("type") == "array" and isinstance(items, dict) and (
                    "pattern" in items or items.get("type") == "array"):  # a list of texts (maybe nested)
                node.setdefault("maxItems", config.max_inputs)
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    for name in ("ClassifyRequest", "V2InputTensor"):
        walk(comps.get(name))
    _publish_long_text(comps, config)
    tensor = comps.get("V2InputTensor")
    if tensor is not None and config.max_inputs <= MAX_SHAPE_BRANCHES:
        # JSON Schema cannot say "shape matches len(data)", but it can list every valid pairing.
        tensor["anyOf"] = [{"properties": {"shape": {"enum": [[n], [n, 1]]}, "data": {"minItems": n, "maxItems": n}}}
                           for n in range(1, config.max_inputs + 1)]
