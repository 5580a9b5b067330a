"""KServe V2 over HTTP (the Open Inference Protocol's REST API), as Triton's and KServe's own clients speak it.

    python -c "import numpy as np, tritonclient.http as t; c = t.InferenceServerClient('127.0.0.1:8000'); \\
i = t.InferInput('text', [1], 'BYTES'); i.set_data_from_numpy(np.array([b'great'], dtype=object)); \\
print(c.infer('onnx-int8', [i]).as_numpy('probabilities'))"

A body with no Content-Type is JSON (tritonclient.http sends none); what a stock client sends: docs/protocols.md.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from qserve import __version__
from qserve.serve.core.answer import InferenceRequest, Origin
from qserve.serve.core.schemas import ErrorResponse
from qserve.serve.core.state import ServedModel, ServeState
from qserve.serve.core.texts import check_texts, unicode_problem
from qserve.serve.infra.config import ServeConfig
from qserve.serve.infra.errors import ApiError
from qserve.serve.protocols.spec import Answer, Body, Route
from qserve.serve.protocols.v2.models import EXTENSIONS, model_config, model_metadata, served
from qserve.serve.protocols.v2.schemas import V2InferRequest, V2InferResponse, V2ModelMetadata, flatten
from qserve.serve.protocols.v2.tensors import (
    Tensor,
    answered_outputs,
    bytes_elements,
    named_inputs,
    output_values,
    shaped,
    tensor_bytes,
)

HEADER_LENGTH = "inference-header-content-length"
ORIGIN = Origin("v2", "parameters.long_text")


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {code: {"model": ErrorResponse} for code in codes}


# 401: with --api-key; 415: a Content-Type that is neither JSON nor octet-stream; 413: over --max-body-bytes.
INFER_ERRORS = errors(400, 401, 404, 413, 415, 422, 429, 500, 503, 504)
INFER_RESPONSES: dict[int | str, dict[str, Any]] = {
    **INFER_ERRORS,
    200: {
        "description": "JSON, or with binary outputs: JSON header (Inference-Header-Content-Length bytes) "
        "followed by the outputs' bytes",
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    },
}
INFER_DESCRIPTION = (
    "The body is JSON; a missing Content-Type means JSON (as tritonclient sends it). Binary tensor data "
    "extension: with the header `Inference-Header-Content-Length: N`, the first N bytes are the JSON "
    "header and the inputs' bytes follow in input order, each declared by its `parameters.binary_data_size` "
    "instead of "
    "`data` (each BYTES element a 4-byte little-endian length + UTF-8 bytes). Ask for binary outputs with "
    "`parameters.binary_data_output: true` or `outputs[i].parameters.binary_data: true`; the answer is "
    "then the JSON header (its length in the response's Inference-Header-Content-Length) + the bytes. A "
    "text-pair model takes a second BYTES input `text_pair` of the same shape as `text`."
)


# -- request decoding ---------------------------------------------------------------------------
@dataclass(frozen=True)
class InferBody:
    """An infer body as read: the JSON header's request and the binary tensor data that followed it."""

    request: V2InferRequest
    binary: bytes


def _split_body(body: bytes, header_length: str | None) -> tuple[bytes, bytes]:
    if header_length is None:
        return body, b""
    if not header_length.strip().isdigit() or int(header_length) > len(body):
        raise ApiError(
            400,
            f"Inference-Header-Content-Length {header_length!r} must be an integer between 0 "
            f"and the body's {len(body)} bytes: the length of the JSON header before binary data",
        )
    n = int(header_length)
    return body[:n], body[n:]


def parse_infer(body: bytes, request: Request) -> InferBody:
    """The body of POST .../infer: JSON, or a JSON header followed by binary tensor data (its length in the
    Inference-Header-Content-Length header). A 400 for what is not JSON, a RequestValidationError (the route's
    422, as FastAPI words it) for JSON that is not a V2InferRequest."""
    header_length = request.headers.get(HEADER_LENGTH)
    head, binary = _split_body(body, header_length)
    try:
        obj = json.loads(head)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        hint = (
            "" if header_length is not None else "; binary tensor data needs the Inference-Header-Content-Length header"
        )
        raise ApiError(400, f"malformed JSON body ({e}){hint}") from None
    try:
        return InferBody(V2InferRequest.model_validate(obj), binary)
    except ValidationError as e:
        raise RequestValidationError([{**err, "loc": ("body", *err["loc"])} for err in e.errors()]) from None


def request_texts(
    st: ServeState, req: V2InferRequest, binary: bytes, model: ServedModel | None = None
) -> tuple[list[str], list[str] | None]:
    """(texts, text pairs or None) of a request: `text`, and `text_pair` for a pair model (tensors.named_inputs),
    each in data or as binary data (the inputs' bytes follow the JSON header in input order)."""
    named: dict[str, tuple[int, list[str]]] = {}
    declared = sum(t.parameters.binary_data_size or 0 for t in req.inputs if t.parameters)
    if declared != len(binary):
        raise ApiError(
            400,
            f"the inputs' parameters.binary_data_size add up to {declared} but {len(binary)} bytes "
            "follow the JSON header (Inference-Header-Content-Length)"
            if declared
            else f"{len(binary)} bytes follow the JSON header but no input declares parameters.binary_data_size",
        )
    offset = 0
    for i, tensor in enumerate(req.inputs):
        if tensor.name in named:
            raise ApiError(
                422,
                f"inputs[{i}].name {tensor.name!r} repeats inputs[{named[tensor.name][0]}]; each "
                "input once: text, and text_pair for a text-pair model",
            )
        size = tensor.parameters.binary_data_size if tensor.parameters else None
        if size is not None:
            if tensor.data is not None:
                raise ApiError(400, f"inputs[{i}] has both data and parameters.binary_data_size; send one of them")
            data = bytes_elements(binary[offset : offset + size], f"inputs[{i}]")
            offset += size
        else:
            if tensor.data is None:
                raise ApiError(
                    400,
                    f"inputs[{i}] has no data: send the texts in data, or as binary data with "
                    "parameters.binary_data_size and the Inference-Header-Content-Length header",
                )
            data = flatten(tensor.data)
        named[tensor.name] = (i, shaped(i, tensor.shape, data))
    if model is None:  # the one-text rule (no model to ask)
        check_texts(st.config, named["text"][1] if "text" in named else [], "inputs[0].data")
        return named["text"][1], None
    return named_inputs(st, model, named)


def requested_outputs(req: V2InferRequest) -> tuple[bool, list[tuple[str, bool]]]:
    """(as binary by default?, [(output name, as binary?)] in the order the client asked for them; empty: it
    named none, so it gets all of the model's). ServeState.submit checks the names against the model."""
    default = bool(req.parameters and req.parameters.binary_data_output)
    return default, [
        (o.name, o.parameters.binary_data if o.parameters and o.parameters.binary_data is not None else default)
        for o in req.outputs or ()
    ]


# -- response encoding ---------------------------------------------------------------------------
def encode_response(head: dict[str, Any], tensors: list[tuple[dict[str, Any], Any, bool]]) -> Response:
    """head + [(tensor meta, values, binary?)] -> JSON, or JSON header + binary tensor data."""
    outputs, blobs = [], []
    for meta, values, as_binary in tensors:
        if as_binary:
            blob = tensor_bytes(meta["datatype"], values)
            blobs.append(blob)
            outputs.append({**meta, "parameters": {"binary_data_size": len(blob)}})
        else:
            data = [float(x) for x in np.asarray(values).reshape(-1)] if meta["datatype"] == "FP32" else list(values)
            outputs.append({**meta, "data": data})
    body = {**head, "outputs": outputs}
    if not blobs:
        return JSONResponse(body)
    header = json.dumps(body, separators=(",", ":")).encode("utf-8")
    return Response(
        header + b"".join(blobs),
        media_type="application/octet-stream",
        headers={"Inference-Header-Content-Length": str(len(header))},
    )


# -- routes -------------------------------------------------------------------------------------
def target(st: ServeState, request: Request) -> ServedModel:
    """The model (and version) a model route's path names (models.served)."""
    return served(st, request.path_params["name"], request.path_params.get("version"), request.scope)


async def infer(st: ServeState, body: InferBody, request: Request) -> Response:
    """POST .../infer's answer to a parsed body."""
    model = target(st, request)
    req = body.request
    if req.id is not None and unicode_problem(req.id):
        raise ApiError(422, f"id {unicode_problem(req.id)}")
    texts, pairs = request_texts(st, req, body.binary, model)
    binary_default, asked = requested_outputs(req)
    long_text = req.parameters.long_text if req.parameters else None
    outputs = answered_outputs([name for name, _ in asked])
    rid = request.state.request_id
    a = await st.submit(
        InferenceRequest(model.name, texts, ORIGIN, request.scope, rid, pairs, long_text, None, outputs)
    )
    values = output_values(a)
    flags = [flag for _, flag in asked] or [binary_default] * len(a.outputs)
    head = {
        "model_name": a.name,
        "model_version": a.version,
        "id": req.id or rid,
        "parameters": {"labels": ",".join(a.labels), "max_length": a.max_length, "long_text": a.policy},
    }
    tensors: list[Tensor] = [values[w] for w in a.outputs]
    return encode_response(head, [(*t, flag) for t, flag in zip(tensors, flags)])


INFER_BODY = Body(V2InferRequest, parse_infer, first=target)
"""POST .../infer's body, read by hand (JSON or binary tensor data); the path's model and version answer first."""


async def v2_server(st: ServeState, body: bytes, request: Request) -> dict:
    return {"name": "qserve", "version": __version__, "extensions": EXTENSIONS}


async def v2_live(st: ServeState, body: bytes, request: Request) -> dict:
    return {"live": True}


async def v2_ready(st: ServeState, body: bytes, request: Request) -> JSONResponse:
    return JSONResponse({"ready": st.ready}, status_code=200 if st.ready else 503)


def _model_route(answer: Callable[[ServeState, ServedModel], dict[str, Any]]) -> Answer:
    """A GET route about the model (and version) the path names: `answer(st, model)`."""

    async def route(st: ServeState, body: bytes, request: Request) -> dict:
        return answer(st, target(st, request))

    return route


def _model_routes(prefix: str) -> tuple[Route, ...]:
    """A model's routes under `prefix`; the versioned prefix's answer for the version being served only."""
    versioned = "{version}" in prefix
    note = " (the version being served only)" if versioned else ""
    model_errors = errors(401, 404, 503)
    suffix = "_versioned" if versioned else ""
    return (
        Route(
            "GET",
            prefix,
            _model_route(lambda st, m: model_metadata(m)),
            dict(
                tags=["v2"],
                response_model=V2ModelMetadata,
                responses=model_errors,
                summary="Model metadata: a BYTES text input (and text_pair for a pair model), FP32 probabilities out"
                + note,
            ),
            name="v2_metadata" + suffix,
        ),
        Route(
            "GET",
            prefix + "/ready",
            _model_route(lambda st, m: {"name": m.name, "ready": True}),
            dict(tags=["v2"], responses=model_errors, summary="Model ready (404 for another model name)" + note),
            name="v2_model_ready" + suffix,
        ),
        Route(
            "GET",
            prefix + "/config",
            _model_route(model_config),
            dict(tags=["v2"], responses=model_errors, summary="Triton-style model configuration" + note),
            name="v2_config" + suffix,
        ),
        Route(
            "POST",
            prefix + "/infer",
            infer,
            dict(
                tags=["v2"],
                response_model=V2InferResponse,
                responses=INFER_RESPONSES,
                description=INFER_DESCRIPTION,
                summary="Infer: one BYTES input of n texts -> probabilities FP32 "
                "[n, k], label, truncated; JSON or binary tensor data" + note,
            ),
            body=INFER_BODY,
            name="infer" + suffix,
            inference=True,
        ),
    )


def expected(cfg: ServeConfig) -> str:
    """What a body the V2 routes refuse should have been."""
    return (
        'expected {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [n], '
        f'"data": [n strings]}}]}} with 1..{cfg.max_inputs} non-empty texts of at most '
        f"{cfg.max_chars} characters"
    )


ROUTES = (
    Route("GET", "/v2", v2_server, dict(tags=["v2"], summary="Server metadata", responses=errors(401))),
    Route("GET", "/v2/health/live", v2_live, dict(tags=["v2"], summary="Server live"), open=True),
    Route(
        "GET",
        "/v2/health/ready",
        v2_ready,
        dict(
            tags=["v2"],
            summary="Server ready (503 until the model is loaded)",
            responses={503: {"description": "not ready yet"}},
        ),
        open=True,
    ),
    *_model_routes("/v2/models/{name}"),
    *_model_routes("/v2/models/{name}/versions/{version}"),
)
"""V2's HTTP routes but the repository extension's (repository.py); protocol.py declares them all."""
