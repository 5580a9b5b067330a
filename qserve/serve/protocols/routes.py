"""HTTP routes: health/ready/metrics and the /v1 pipeline-style API; the KServe V2 protocol is v2.py.

    curl -s -H 'Content-Type: application/json' -d '{"inputs": ["great"], "top_k": 1}' 127.0.0.1:8000/v1/classify
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.types import Message, Scope, Send

from qserve.serve.core.outputs import threshold_fields, v1_predictions
from qserve.serve.core.pairs import v1_inputs
from qserve.serve.core.schemas import ROUTE_ERRORS, ClassifyRequest, ClassifyResponse, ErrorResponse
from qserve.serve.core.state import ServeState


async def v1_answer(st: ServeState, body: ClassifyRequest, request: Request) -> dict[str, object]:
    """POST /v1/classify's answer to a validated body (the route and fast_routes both call this)."""
    model = st.model(body.model, request)
    texts, pairs = v1_inputs(st, model, body.inputs)  # a pair model's {text, text_pair} (pairs.py)
    a = await st.submit(model, texts, request.scope, request.state.request_id, body.long_text, "long_text", pairs,
                        body.threshold)
    return {
        "model": a.name, "model_version": a.version, "model_name": a.runtime.manifest.model_name,
        "predictions": v1_predictions(a.probs, a.labels, a.problem_type, body.top_k, a.threshold),
        "problem_type": a.problem_type, **threshold_fields(a.labels, a.threshold),
        **({"temperature": t} if (t := a.runtime.manifest.temperature) is not None else {}),
        "truncated": a.truncated, "tokens": a.tokens, "windows": a.windows,
        "long_text": a.policy, "max_length": a.max_length}


FastRoute = Callable[[Scope, bytes, Send], Awaitable[bool]]
"""The guard's hook once it holds a request's whole body: (scope, body, send) -> True when it answered."""

B = TypeVar("B", bound=BaseModel)
Bound = Callable[[Request], Awaitable[object]]
"""A parsed body's answer, still to compute: (the request) -> what the route's JSONResponse holds (V2: the route's
Response itself)."""


@dataclass(frozen=True)
class Fast(Generic[B]):
    """One POST route the guard answers itself: the body model the FastAPI route declares and the answer the
    route returns as a JSONResponse, computed by the very function the route calls."""

    schema: type[B]
    answer: Callable[[B, Request], Awaitable[object]]

    def bind(self, body: bytes) -> Bound | None:
        """The answer to `body`, or None when pydantic refuses it (the route then answers it, as before)."""
        try:
            parsed = self.schema.model_validate_json(body)
        except ValidationError:
            return None
        return lambda request: self.answer(parsed, request)


def fast_routes(st: ServeState, error: Callable[[Request, Exception], Awaitable[Response]]) -> FastRoute:
    """POST /v1/classify, TEI's /predict and POST / (huggingface_hub's InferenceClient), vLLM's /classify and
    KServe V2's /v2/models/{name}[/versions/{version}]/infer answered straight from the guard, past FastAPI's
    request machinery.

    Profiled at one client (py-spy, onnx-int8), FastAPI's per-request work around the endpoint (body and
    content-type handling, dependency solving, the exception-handling layers, the response's send chain) was
    about a third of the event loop's time outside the model. The body is validated by the very model the
    route declares (from the JSON bytes in one pydantic call) and answered by the function the route calls;
    `error` renders an exception as the app's handlers do (TEI's routes in TEI's form). A body pydantic refuses
    goes on to the FastAPI route untouched, so every 400/422 reads exactly as before; the routes stay what
    OpenAPI shows."""
    from qserve.serve.protocols import tei, v2, vllm_api

    # path -> Fast(...).bind: each route's body model and answer, one pair per route
    table: dict[str, Callable[[bytes], Bound | None]] = {
        "/v1/classify": Fast(ClassifyRequest, lambda body, request: v1_answer(st, body, request)).bind,
        "/predict": Fast(tei.TeiPredictRequest, lambda body, request: tei.predict(st, body, request)).bind,
        "/": Fast(tei.TeiRootRequest, lambda body, request: tei.root_answer(st, body, request)).bind,
        "/classify": Fast(vllm_api.VllmClassifyRequest,
                          lambda body, request: vllm_api.classify(st, body, request)).bind,
    }

    async def handle(scope: Scope, body: bytes, send: Send) -> bool:
        if scope["method"] != "POST":
            return False
        bind = table.get(scope["path"])
        # V2's infer paths carry the model (and version) in them, so they are matched apart from the table
        bound = bind(body) if bind is not None else v2.bind_infer(st, scope, body)
        if bound is None:
            return False
        request = Request(scope)
        try:
            answer = await bound(request)
        except Exception as e:  # ApiError and the unexpected, as the app's exception handlers answer them
            await (await error(request, e))(scope, _no_receive, send)
            return True
        if isinstance(answer, Response):  # V2: JSON or binary tensor data, built by the route's own encoder
            await answer(scope, _no_receive, send)
            return True
        # What JSONResponse(answer) sends, byte for byte (same dumps, same headers), without building one
        out = json.dumps(answer, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(out)).encode()), (b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": out})
        return True

    return handle


async def _no_receive() -> Message:
    return {"type": "http.disconnect"}  # a plain Response never reads; the body was consumed already


def add_routes(app: FastAPI, st: ServeState) -> None:  # noqa: C901 - a flat list of small routes
    # -- liveness, readiness, metrics -------------------------------------------------------
    @app.get("/health", tags=["health"], summary="Liveness: 200 while the process serves HTTP")
    async def health() -> dict:
        return {"status": "alive"}

    @app.get("/ready", tags=["health"], summary="Readiness: 503 until the model is loaded and warmed up",
             responses={503: {"description": 'Not ready yet: {"ready": false, "reason": "..."}'}})
    async def ready() -> JSONResponse:
        if st.ready:
            return JSONResponse({"ready": True, "model": st.default})
        return JSONResponse({"ready": False, "reason": st.not_ready_reason()}, status_code=503)

    @app.get("/metrics", tags=["health"], summary="Prometheus metrics (needs the API key unless --metrics-public)",
             response_class=Response, responses={401: {"model": ErrorResponse}})
    async def metrics() -> Response:
        return Response(st.metrics.render(), media_type=st.metrics.content_type)

    # -- /v1: HF text-classification pipeline format -----------------------------------------
    @app.get("/v1/models", tags=["v1"], summary="Every served model: manifest summary, version, shadow agreement",
             responses={code: {"model": ErrorResponse} for code in (401, 503)})
    async def v1_models() -> dict:
        st.require_ready()
        from qserve.serve.protocols.vllm_api import openai_models

        # OpenAI's list shape (object, data) beside qserve's own keys, so OpenAI-style clients can list models
        return {"models": [m.summary() for m in st.models.values()], "default": st.default,
                **(await st.engine_info()), **openai_models(st)}

    @app.post("/v1/classify", tags=["v1"], response_model=ClassifyResponse, responses=ROUTE_ERRORS,
              summary="Classify one text or a list; [{label, score}] per input, best first")
    async def classify(body: ClassifyRequest, request: Request) -> JSONResponse:
        return JSONResponse(await v1_answer(st, body, request))

    # -- /v2: KServe V2 / Open Inference Protocol (v2.py) -----------------------------------
    from qserve.serve.protocols.v2 import add_v2_routes
    from qserve.serve.protocols.v2_repository import add_repository_routes

    add_v2_routes(app, st)
    add_repository_routes(app, st)
