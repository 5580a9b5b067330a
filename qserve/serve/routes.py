"""HTTP routes: health/ready/metrics, the /v1 pipeline-style API and the KServe V2 protocol.

    curl -s -H 'Content-Type: application/json' \\
      -d '{"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["great"]}]}' \\
      127.0.0.1:8000/v2/models/onnx-int8/infer
"""

from __future__ import annotations

from math import prod
from typing import Any

import numpy as np
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from qserve import __version__
from qserve.serve.errors import ApiError
from qserve.serve.schemas import (ClassifyRequest, ClassifyResponse, ErrorResponse, V2InferRequest,
                                  V2InferResponse, V2ModelMetadata, flatten)

ERRORS = {code: {"model": ErrorResponse} for code in (400, 401, 404, 413, 415, 422, 429, 500, 503, 504)}
V2_OUTPUTS = ("probabilities", "label", "truncated")


def model_summary(st: Any) -> dict[str, Any]:
    m = st.runtime.manifest
    files = m.get("files") or {}
    return {"id": st.name, "model_name": m.get("model_name"), "spec": m.get("spec"), "labels": list(st.runtime.labels),
            "max_length": st.runtime.max_length, "parity": m.get("parity"), "created": m.get("created"),
            "device": getattr(st.runtime, "device", None), "files": len(files),
            "bytes": sum(int(f.get("bytes", 0)) for f in files.values() if isinstance(f, dict)),
            "versions": m.get("versions"), "selection": getattr(st.runtime, "selection", None)}


def top_labels(row: np.ndarray, labels: list[str], top_k: int | None) -> list[dict[str, Any]]:
    order = np.argsort(-row, kind="stable")[: (top_k or len(labels))]
    return [{"label": labels[j], "score": float(row[j])} for j in order]


def add_routes(app: FastAPI, st: Any) -> None:  # noqa: C901 - a flat list of small routes
    # -- liveness, readiness, metrics -------------------------------------------------------
    @app.get("/health", tags=["health"], summary="Liveness: 200 while the process serves HTTP")
    async def health() -> dict:
        return {"status": "alive"}

    @app.get("/ready", tags=["health"], summary="Readiness: 503 until the model is loaded and warmed up",
             responses={503: {"model": ErrorResponse}})
    async def ready() -> JSONResponse:
        if st.ready:
            return JSONResponse({"ready": True, "model": st.name})
        return JSONResponse({"ready": False, "reason": st.not_ready_reason()}, status_code=503)

    @app.get("/metrics", tags=["health"], summary="Prometheus metrics", response_class=Response)
    async def metrics() -> Response:
        return Response(st.metrics.render(), media_type=st.metrics.content_type)

    # -- /v1: HF text-classification pipeline format -----------------------------------------
    @app.get("/v1/models", tags=["v1"], summary="The served variant's manifest summary")
    async def v1_models() -> dict:
        st.require_ready()
        return {"models": [model_summary(st)]}

    @app.post("/v1/classify", tags=["v1"], response_model=ClassifyResponse, responses=ERRORS,
              summary="Classify one text or a list; [{label, score}] per input, best first")
    async def classify(body: ClassifyRequest, request: Request) -> JSONResponse:
        st.require_ready()
        if body.model is not None:
            st.require_model(body.model)
        texts = [body.inputs] if isinstance(body.inputs, str) else list(body.inputs)
        st.check_texts(texts, "inputs")
        result = await st.classify(texts, request)
        labels = st.runtime.labels
        return JSONResponse({
            "model": st.name, "model_name": st.runtime.manifest.get("model_name"),
            "predictions": [top_labels(row, labels, body.top_k) for row in result.probs],
            "truncated": result.truncated, "max_length": st.runtime.max_length})

    # -- /v2: KServe V2 / Open Inference Protocol ------------------------------------------
    @app.get("/v2", tags=["v2"], summary="Server metadata")
    async def v2_server() -> dict:
        return {"name": "qserve", "version": __version__, "extensions": []}

    @app.get("/v2/health/live", tags=["v2"], summary="Server live")
    async def v2_live() -> dict:
        return {"live": True}

    @app.get("/v2/health/ready", tags=["v2"], summary="Server ready (503 until the model is loaded)")
    async def v2_ready() -> JSONResponse:
        return JSONResponse({"ready": st.ready}, status_code=200 if st.ready else 503)

    @app.get("/v2/models/{name}", tags=["v2"], response_model=V2ModelMetadata, responses=ERRORS,
             summary="Model metadata: a BYTES text input, FP32 probabilities out")
    async def v2_metadata(name: str) -> dict:
        st.require_model(name)
        k = len(st.runtime.labels)
        spec = st.runtime.manifest.get("spec", {})
        return {"name": st.name, "versions": ["1"], "platform": f"qserve_{spec.get('backend', 'unknown')}",
                "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}],
                "outputs": [{"name": "probabilities", "datatype": "FP32", "shape": [-1, k]},
                            {"name": "label", "datatype": "BYTES", "shape": [-1]},
                            {"name": "truncated", "datatype": "BOOL", "shape": [-1]}],
                "parameters": {"labels": ",".join(st.runtime.labels), "max_length": st.runtime.max_length,
                               "model_name": st.runtime.manifest.get("model_name")}}

    @app.get("/v2/models/{name}/ready", tags=["v2"], summary="Model ready")
    async def v2_model_ready(name: str) -> dict:
        st.require_model(name)
        return {"name": st.name, "ready": True}

    @app.post("/v2/models/{name}/infer", tags=["v2"], response_model=V2InferResponse, responses=ERRORS,
              summary="Infer: one BYTES input of n texts -> probabilities FP32 [n, k], label, truncated")
    async def v2_infer(name: str, body: V2InferRequest, request: Request) -> JSONResponse:
        st.require_model(name)
        texts = _v2_texts(st, body)
        wanted = [o.name for o in body.outputs] if body.outputs else list(V2_OUTPUTS)
        unknown = [w for w in wanted if w not in V2_OUTPUTS]
        if unknown:
            raise ApiError(400, f"unknown output(s) {unknown}; this model has outputs {list(V2_OUTPUTS)}")
        result = await st.classify(texts, request)
        n, k = result.probs.shape
        labels = st.runtime.labels
        tensors = {
            "probabilities": {"name": "probabilities", "datatype": "FP32", "shape": [n, k],
                              "data": [float(x) for x in result.probs.reshape(-1)]},
            "label": {"name": "label", "datatype": "BYTES", "shape": [n],
                      "data": [labels[j] for j in result.probs.argmax(axis=1)]},
            "truncated": {"name": "truncated", "datatype": "BOOL", "shape": [n], "data": result.truncated},
        }
        return JSONResponse({"model_name": st.name, "model_version": "1",
                             "id": body.id or request.state.request_id,
                             "parameters": {"labels": ",".join(labels), "max_length": st.runtime.max_length},
                             "outputs": [tensors[w] for w in wanted]})


def _v2_texts(st: Any, body: V2InferRequest) -> list[str]:
    if len(body.inputs) != 1:
        raise ApiError(400, f"got {len(body.inputs)} input tensors; send exactly one BYTES tensor of texts "
                            '(e.g. {"name": "text", "datatype": "BYTES", "shape": [n], "data": [...]})')
    tensor = body.inputs[0]
    if tensor.datatype.upper() != "BYTES":
        raise ApiError(400, f"inputs[0].datatype is {tensor.datatype!r}; only 'BYTES' (UTF-8 texts) is accepted")
    data = flatten(tensor.data)
    if len(tensor.shape) not in (1, 2) or (len(tensor.shape) == 2 and tensor.shape[1] != 1) \
            or any(d < 0 for d in tensor.shape) or prod(tensor.shape) != len(data):
        raise ApiError(400, f"inputs[0].shape {tensor.shape} does not describe its {len(data)} data elements; "
                            "use [n] or [n, 1] with n = number of texts")
    st.check_texts(data, "inputs[0].data")
    return data
