"""The probes (health, ready, metrics) and the /v1 pipeline-style API, each declared as a Protocol (spec.py).

    curl -s -H 'Content-Type: application/json' -d '{"inputs": ["great"], "top_k": 1}' 127.0.0.1:8000/v1/classify

/v1 is the default protocol (registry.py): a body refused on a route of a protocol that says nothing of its own
is told /v1's form. /v1/models carries OpenAI's list shape (object, data) beside qserve's own keys.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import Request, Response
from fastapi.responses import JSONResponse

from qserve.serve.core.outputs import threshold_fields, v1_predictions
from qserve.serve.core.pairs import v1_inputs
from qserve.serve.core.schemas import ROUTE_ERRORS, ClassifyRequest, ClassifyResponse, ErrorResponse
from qserve.serve.core.state import ServedModel, ServeState
from qserve.serve.infra.config import ServeConfig
from qserve.serve.protocols.spec import Endpoint, OpenApi, Protocol, Route, answered


async def v1_answer(st: ServeState, body: ClassifyRequest, request: Request) -> dict[str, object]:
    """POST /v1/classify's answer to a validated body (the route and the guard's fast path both call this)."""
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


def expected(cfg: ServeConfig) -> str:
    """What a body /v1/classify refuses should have been (and any route of a protocol that says nothing itself)."""
    return ('expected {"inputs": str | list[str], "top_k": int >= 1 | null} (a text-pair model: '
            '{"text", "text_pair"} objects in place of strings) with '
            f"1..{cfg.max_inputs} non-empty texts of at most {cfg.max_chars} characters")


def created(model: ServedModel) -> int:
    """The manifest's creation time as Unix seconds (OpenAI's `created`); 0 when it has none."""
    try:
        return int(datetime.fromisoformat(str(model.runtime.manifest.created)).timestamp())
    except (TypeError, ValueError):
        return 0


def openai_models(st: ServeState) -> dict[str, Any]:
    """OpenAI's list shape, carried beside /v1/models' own keys."""
    return {"object": "list", "data": [{"id": m.name, "object": "model", "created": created(m), "owned_by": "qserve"}
                                      for m in st.models.values()]}


# -- liveness, readiness, metrics -------------------------------------------------------------------
def _health(st: ServeState) -> Endpoint:
    async def health() -> dict:
        return {"status": "alive"}

    return health


def _ready(st: ServeState) -> Endpoint:
    async def ready() -> JSONResponse:
        if st.ready:
            return JSONResponse({"ready": True, "model": st.default})
        return JSONResponse({"ready": False, "reason": st.not_ready_reason()}, status_code=503)

    return ready


def _metrics(st: ServeState) -> Endpoint:
    async def metrics() -> Response:
        return Response(st.metrics.render(), media_type=st.metrics.content_type)

    return metrics


PROBES = Protocol(name="probes", routes=(
    Route("GET", "/health", _health, dict(tags=["health"], summary="Liveness: 200 while the process serves HTTP"),
          open=True),
    Route("GET", "/ready", _ready, dict(
        tags=["health"], summary="Readiness: 503 until the model is loaded and warmed up",
        responses={503: {"description": 'Not ready yet: {"ready": false, "reason": "..."}'}}), open=True),
    Route("GET", "/metrics", _metrics, dict(
        tags=["health"], summary="Prometheus metrics (needs the API key unless --metrics-public)",
        response_class=Response, responses={401: {"model": ErrorResponse}})),
))


# -- /v1: HF text-classification pipeline format -----------------------------------------------------
def _models(st: ServeState) -> Endpoint:
    async def v1_models() -> dict:
        st.require_ready()
        # OpenAI's list shape (object, data) beside qserve's own keys, so OpenAI-style clients can list models
        return {"models": [m.summary() for m in st.models.values()], "default": st.default,
                **(await st.engine_info()), **openai_models(st)}

    return v1_models


V1 = Protocol(
    name="v1", metrics_label="v1", expected=expected, hint="POST /v1/classify",
    openapi=OpenApi(texts=("ClassifyRequest", "TextPair"), long_text=("ClassifyRequest",)),
    routes=(
        Route("GET", "/v1/models", _models, dict(
            tags=["v1"], summary="Every served model: manifest summary, version, shadow agreement",
            responses={code: {"model": ErrorResponse} for code in (401, 503)})),
        answered("POST", "/v1/classify", ClassifyRequest, v1_answer, "classify", tags=["v1"],
                 response_model=ClassifyResponse, responses=ROUTE_ERRORS,
                 summary="Classify one text or a list; [{label, score}] per input, best first"),
    ))
