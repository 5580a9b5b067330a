"""The KServe / Triton model repository extension, as tritonclient calls it: index, load, unload.

    python -c "import tritonclient.http as t; c = t.InferenceServerClient('127.0.0.1:8000'); \\
print(c.get_model_repository_index()); c.load_model('onnx-int8'); c.unload_model('onnx-int8')"

What HTTP's /v2/repository/... and gRPC's Repository* RPCs both call, behind the API key. A load reads only the
model's own directory, never a client's path; one that fails leaves the old version serving (docs/serving.md).
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request

from qserve.serve.core.schemas import ErrorResponse
from qserve.serve.core.state import ServeState
from qserve.serve.infra.errors import ApiError
from qserve.serve.protocols.spec import Route

ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorResponse} for code in (400, 401, 404, 413, 415, 503)}
BODY = {"requestBody": {"required": False, "content": {"application/json": {"schema": {"type": "object"}}}}}


def _body(raw: bytes, allowed: str) -> dict[str, Any]:
    """The JSON object body; an empty body (tritonclient's index call) is {}."""
    if not raw.strip():
        return {}
    try:
        obj = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ApiError(400, f"malformed JSON body ({e}); expected {allowed}") from None
    if not isinstance(obj, dict):
        raise ApiError(400, f"the body is a JSON {type(obj).__name__}; expected {allowed}")
    return obj


def _parameters(body: dict[str, Any], allowed: str) -> dict[str, Any]:
    params = body.get("parameters") or {}
    if not isinstance(params, dict):
        raise ApiError(400, f"parameters is a JSON {type(params).__name__}; expected {allowed}")
    return params


def index(st: ServeState, ready_only: bool) -> list[dict[str, str]]:
    """The repository index: [{name, version, state, reason}], READY ones only when `ready_only`."""
    st.require_ready()
    models = st.index()
    return [m for m in models if m["state"] == "READY"] if ready_only else models


def model_label(st: ServeState, name: str, loading: bool) -> str:
    """The `model` label a repository call's metrics carry: the name when this server knows it, else ""."""
    return name if name in st.models or (loading and _known(st, name)) else ""


async def load(st: ServeState, name: str, overrides: list[str]) -> dict[str, str]:
    """(Re)load `name` from its own directory; `overrides`: the parameter names the client sent (refused)."""
    st.require_ready()
    if overrides:
        raise ApiError(
            400,
            f"load takes no parameters (got {', '.join(sorted(overrides))}): a model is loaded from "
            "its own directory on the server, never from a configuration or files a client sends",
        )
    model = await st.load(name)
    return {"name": model.name, "version": model.version, "state": "READY"}


async def unload(st: ServeState, name: str) -> dict[str, str]:
    """Stop serving `name`; what it accepted finishes first."""
    st.require_ready()
    await st.unload(name)
    return {"name": name, "state": "UNAVAILABLE"}


async def repository_index(st: ServeState, body: bytes, request: Request) -> list[dict[str, str]]:
    st.require_ready()
    ready_only = _body(body, '{} or {"ready": true}').get("ready", False)
    if not isinstance(ready_only, bool):
        raise ApiError(400, f"ready is {type(ready_only).__name__}; expected true or false")
    return index(st, ready_only)


async def repository_load(st: ServeState, body: bytes, request: Request) -> dict[str, str]:
    st.require_ready()
    params = _parameters(_body(body, "{} (no parameters)"), "an object")
    name = request.path_params["name"]
    request.state.qserve_model = model_label(st, name, loading=True)
    return await load(st, name, list(params))


async def repository_unload(st: ServeState, body: bytes, request: Request) -> dict[str, str]:
    st.require_ready()
    _parameters(_body(body, '{"parameters": {"unload_dependents": false}}'), "an object")
    name = request.path_params["name"]
    request.state.qserve_model = model_label(st, name, loading=False)
    return await unload(st, name)


# V2's routes (protocol.py declares the protocol they belong to)
ROUTES = tuple(
    Route("POST", path, answer, dict(tags=["v2 repository"], responses=ERRORS, openapi_extra=BODY, summary=summary))
    for path, answer, summary in (
        (
            "/v2/repository/index",
            repository_index,
            "Every model this server can load, its version and state (READY, LOADING, UNAVAILABLE)",
        ),
        (
            "/v2/repository/models/{name}/load",
            repository_load,
            "(Re)load a model from its own directory; hot swap when it is serving",
        ),
        (
            "/v2/repository/models/{name}/unload",
            repository_unload,
            "Stop serving a model; what it accepted finishes first",
        ),
    )
)


def _known(st: ServeState, name: str) -> bool:
    try:
        assert st.repository is not None
        st.repository.source(name)
        return True
    except ApiError:
        return False
