"""The probes: liveness, readiness and the Prometheus metrics, declared as a protocol (spec.py) of their own.

    curl -s 127.0.0.1:8000/ready; curl -s 127.0.0.1:8000/metrics | grep qserve_requests_total

/health and /ready answer without the API key (a load balancer's and Kubernetes' probes); /metrics needs it
unless --metrics-public.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from qserve.serve.core.schemas import ErrorResponse
from qserve.serve.core.state import ServeState
from qserve.serve.protocols.spec import ProtocolSpec, Route


async def health(st: ServeState, body: bytes, request: Request) -> dict:
    return {"status": "alive"}


async def ready(st: ServeState, body: bytes, request: Request) -> JSONResponse:
    if st.ready:
        return JSONResponse({"ready": True, "model": st.default})
    return JSONResponse({"ready": False, "reason": st.not_ready_reason()}, status_code=503)


async def metrics(st: ServeState, body: bytes, request: Request) -> Response:
    return Response(st.metrics.render(), media_type=st.metrics.content_type)


PROBES = ProtocolSpec(
    name="probes",
    routes=(
        Route(
            "GET",
            "/health",
            health,
            dict(tags=["health"], summary="Liveness: 200 while the process serves HTTP"),
            open=True,
        ),
        Route(
            "GET",
            "/ready",
            ready,
            dict(
                tags=["health"],
                summary="Readiness: 503 until the model is loaded and warmed up",
                responses={503: {"description": 'Not ready yet: {"ready": false, "reason": "..."}'}},
            ),
            open=True,
        ),
        Route(
            "GET",
            "/metrics",
            metrics,
            dict(
                tags=["health"],
                summary="Prometheus metrics (needs the API key unless --metrics-public)",
                media_type=None,
                responses={401: {"model": ErrorResponse}},
            ),
        ),
    ),
)
