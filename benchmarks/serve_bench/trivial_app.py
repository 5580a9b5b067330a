"""The trivial app: what the HTTP layer and a proxy hop cost with no model (engines.py's baseline rows).

    python -m uvicorn --factory benchmarks.serve_bench.trivial_app:trivial_app --port 8001 --log-level warning

Answers every POST /v1/classify with one fixed prediction per input, without reading a model.
"""

from __future__ import annotations

from fastapi import FastAPI, Request  # module level: FastAPI resolves the route's annotations here
from fastapi.responses import JSONResponse


def trivial_app() -> FastAPI:
    app = FastAPI()

    @app.post("/v1/classify")
    async def echo(request: Request) -> JSONResponse:
        body = await request.json()
        n = 1 if isinstance(body["inputs"], str) else len(body["inputs"])
        return JSONResponse({"predictions": [[{"label": "positive", "score": 1.0}]] * n})

    return app
