"""HTTP routes: health/ready/metrics and the /v1 pipeline-style API; the KServe V2 protocol is v2.py.

    curl -s -H 'Content-Type: application/json' -d '{"inputs": ["great"], "top_k": 1}' 127.0.0.1:8000/v1/classify
"""

from __future__ import annotations


from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from qserve.serve.core.outputs import v1_predictions
from qserve.serve.core.pairs import v1_inputs
from qserve.serve.core.schemas import ROUTE_ERRORS, ClassifyRequest, ClassifyResponse, ErrorResponse
from qserve.serve.core.state import ServeState


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
        model = st.model(body.model, request)
        texts, pairs = v1_inputs(st, model, body.inputs)  # a pair model's {text, text_pair} (pairs.py)
        a = await st.classify(model, texts, request, body.long_text, "long_text", pairs, body.threshold)
        return JSONResponse({
            "model": a.name, "model_version": a.version, "model_name": a.runtime.manifest.model_name,
            "predictions": v1_predictions(a.probs, a.labels, a.problem_type, body.top_k, a.threshold),
            "problem_type": a.problem_type, **({"threshold": a.threshold} if a.threshold is not None else {}),
            "truncated": a.truncated, "tokens": a.tokens, "windows": a.windows,
            "long_text": a.policy, "max_length": a.max_length})

    # -- /v2: KServe V2 / Open Inference Protocol (v2.py) -----------------------------------
    from qserve.serve.protocols.v2 import add_v2_routes
    from qserve.serve.protocols.v2_repository import add_repository_routes

    add_v2_routes(app, st)
    add_repository_routes(app, st)
