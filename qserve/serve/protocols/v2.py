"""The KServe V2 / Open Inference Protocol, as Triton's and KServe's own clients speak it.

    python -c "import numpy as np, tritonclient.http as t; c = t.InferenceServerClient('127.0.0.1:8000'); \\
i = t.InferInput('text', [1], 'BYTES'); i.set_data_from_numpy(np.array([b'great'], dtype=object)); \\
print(c.infer('onnx-int8', [i]).as_numpy('probabilities'))"

What a stock client sends, and what this module does with it:
- no Content-Type at all (tritonclient.http): the body is JSON, as Triton and KServe assume;
- the binary tensor data extension (tritonclient's default): an `Inference-Header-Content-Length`
  header says how many bytes of the body are the JSON header; an input with
  `parameters.binary_data_size` takes that many bytes of what follows, in input order (a BYTES
  element is a 4-byte little-endian length + its UTF-8 bytes). Outputs come back the same way when
  asked: `parameters.binary_data_output` for all, or `binary_data` per requested output;
- GET /v2/models/{name}/config answers a Triton-style model configuration;
- every error is the protocol's {"error": "..."} (plus our request_id).
A model's version is its manifest's short hash (GET /v2/models/{name} lists it; every infer answer
carries it as model_version). Versioned paths (/v2/models/{name}/versions/{version}/...) answer like
the unversioned ones for the version being served, 404 for any other; a path without a version
reaches whatever version serves now (after a hot swap, the new one). The repository extension
(index, load, unload) is v2_repository.py.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Awaitable, Callable, Mapping
from math import prod
from typing import Any

import numpy as np
from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.datastructures import Headers
from starlette.types import Scope

from qserve import __version__
from qserve.serve.core.answer import Answer
from qserve.serve.core.errors import ApiError
from qserve.serve.core import outputs
from qserve.serve.core.pairs import config_inputs, metadata_inputs, v2_inputs
from qserve.serve.core.schemas import (ErrorResponse, V2InferRequest, V2InferResponse,
                                  V2ModelMetadata, flatten)
from qserve.artifact import Manifest
from qserve.serve.core.served_model import gate_summary
from qserve.serve.core.state import ServedModel, ServeState
from qserve.serve.core.texts import check_texts, unicode_problem
from qserve.serve.infra.config import ServeConfig
from qserve.serve.protocols import v2_repository as repository
from qserve.serve.protocols.spec import Endpoint, OpenApi, Protocol, Route

HEADER_LENGTH = "inference-header-content-length"
EXTENSIONS = ["binary_tensor_data", "model_configuration", "model_repository"]


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {code: {"model": ErrorResponse} for code in codes}


# 401: with --api-key; 415: a Content-Type that is neither JSON nor octet-stream; 413: over --max-body-bytes.
INFER_ERRORS = _errors(400, 401, 404, 413, 415, 422, 429, 500, 503, 504)
INFER_RESPONSES: dict[int | str, dict[str, Any]] = {
    **INFER_ERRORS,
    200: {"description": "JSON, or with binary outputs: JSON header (Inference-Header-Content-Length bytes) "
                         "followed by the outputs' bytes",
          "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}},
}
INFER_BODY = {"requestBody": {"required": True, "content": {
    "application/json": {"schema": {"$ref": "#/components/schemas/V2InferRequest"}}}}}
INFER_DESCRIPTION = (
    "The body is JSON; a missing Content-Type means JSON (as tritonclient sends it). Binary tensor data "
    "extension: with the header `Inference-Header-Content-Length: N`, the first N bytes are the JSON "
    "header and the inputs' bytes follow in input order, each declared by its `parameters.binary_data_size` "
    "instead of "
    "`data` (each BYTES element a 4-byte little-endian length + UTF-8 bytes). Ask for binary outputs with "
    "`parameters.binary_data_output: true` or `outputs[i].parameters.binary_data: true`; the answer is "
    "then the JSON header (its length in the response's Inference-Header-Content-Length) + the bytes. A "
    "text-pair model takes a second BYTES input `text_pair` of the same shape as `text`.")


# -- request decoding ---------------------------------------------------------------------------
def _split_body(body: bytes, header_length: str | None) -> tuple[bytes, bytes]:
    if header_length is None:
        return body, b""
    if not header_length.strip().isdigit() or int(header_length) > len(body):
        raise ApiError(400, f"Inference-Header-Content-Length {header_length!r} must be an integer between 0 "
                            f"and the body's {len(body)} bytes: the length of the JSON header before binary data")
    n = int(header_length)
    return body[:n], body[n:]


def _parse_request(body: bytes, header_length: str | None) -> tuple[V2InferRequest, bytes]:
    head, binary = _split_body(body, header_length)
    try:
        obj = json.loads(head)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        hint = "" if header_length is not None else (
            "; binary tensor data needs the Inference-Header-Content-Length header")
        raise ApiError(400, f"malformed JSON body ({e}){hint}") from None
    try:
        return V2InferRequest.model_validate(obj), binary
    except ValidationError as e:
        raise RequestValidationError([{**err, "loc": ("body", *err["loc"])} for err in e.errors()]) from None


def bytes_elements(raw: bytes, where: str) -> list[str]:
    """Decode a binary BYTES tensor: repeated (uint32 LE length, that many UTF-8 bytes)."""
    out: list[str] = []
    pos = 0
    while pos < len(raw):
        if pos + 4 > len(raw):
            raise ApiError(400, f"{where}: {len(raw) - pos} trailing byte(s) where a 4-byte element length "
                                "was expected; each BYTES element is a little-endian uint32 length + its bytes")
        (n,) = struct.unpack_from("<I", raw, pos)
        pos += 4
        if pos + n > len(raw):
            raise ApiError(400, f"{where}: element {len(out)} declares {n} bytes but only {len(raw) - pos} remain")
        try:
            out.append(raw[pos:pos + n].decode("utf-8"))
        except UnicodeDecodeError as e:
            raise ApiError(422, f"{where}[{len(out)}] is not valid UTF-8: byte 0x{raw[pos + e.start]:02x} at "
                                f"offset {e.start} ({e.reason}); send UTF-8 text") from None
        pos += n
    return out


def request_texts(st: ServeState, req: V2InferRequest, binary: bytes,
                  model: ServedModel | None = None) -> tuple[list[str], list[str] | None]:
    """(texts, text pairs or None) of a request: `text`, and `text_pair` for a pair model (serve/core/pairs.py),
    each in data or as binary data (the inputs' bytes follow the JSON header in input order)."""
    named: dict[str, tuple[int, list[str]]] = {}
    declared = sum(t.parameters.binary_data_size or 0 for t in req.inputs if t.parameters)
    if declared != len(binary):
        raise ApiError(400, f"the inputs' parameters.binary_data_size add up to {declared} but {len(binary)} bytes "
                            "follow the JSON header (Inference-Header-Content-Length)" if declared else
                            f"{len(binary)} bytes follow the JSON header but no input declares "
                            "parameters.binary_data_size")
    offset = 0
    for i, tensor in enumerate(req.inputs):
        if tensor.name in named:
            raise ApiError(422, f"inputs[{i}].name {tensor.name!r} repeats inputs[{named[tensor.name][0]}]; each "
                                "input once: text, and text_pair for a text-pair model")
        size = tensor.parameters.binary_data_size if tensor.parameters else None
        if size is not None:
            if tensor.data is not None:
                raise ApiError(400, f"inputs[{i}] has both data and parameters.binary_data_size; send one of them")
            data = bytes_elements(binary[offset:offset + size], f"inputs[{i}]")
            offset += size
        else:
            if tensor.data is None:
                raise ApiError(400, f"inputs[{i}] has no data: send the texts in data, or as binary data with "
                                    "parameters.binary_data_size and the Inference-Header-Content-Length header")
            data = flatten(tensor.data)
        shape = tensor.shape
        if (len(shape) == 2 and shape[1] != 1) or prod(shape) != len(data):
            raise ApiError(400, f"inputs[{i}].shape {shape} does not describe its {len(data)} data elements; "
                                "use [n] or [n, 1] with n = number of texts")
        named[tensor.name] = (i, data)
    if model is None:  # the one-text rule (no model to ask)
        check_texts(st.config, named["text"][1] if "text" in named else [], "inputs[0].data")
        return named["text"][1], None
    return v2_inputs(st, model, named)


def requested_outputs(req: V2InferRequest) -> tuple[bool, list[tuple[str, bool]]]:
    """(as binary by default?, [(output name, as binary?)] in the order the client asked for them; empty: it
    named none, so it gets all of the model's). ServeState.submit checks the names against the model."""
    default = bool(req.parameters and req.parameters.binary_data_output)
    return default, [(o.name, o.parameters.binary_data if o.parameters and o.parameters.binary_data is not None
                      else default) for o in req.outputs or ()]


# -- response encoding ---------------------------------------------------------------------------
def tensor_bytes(datatype: str, values: Any) -> bytes:  # Any: an FP32 array, BYTES strs or BOOLs (outputs.py)
    if datatype == "FP32":
        return np.ascontiguousarray(values, dtype="<f4").tobytes()
    if datatype == "BOOL":
        return np.asarray(values, dtype=np.bool_).tobytes()
    parts = []
    for v in values:
        b = v.encode("utf-8")
        parts += [struct.pack("<I", len(b)), b]
    return b"".join(parts)


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
    return Response(header + b"".join(blobs), media_type="application/octet-stream",
                    headers={"Inference-Header-Content-Length": str(len(header))})


# -- routes -------------------------------------------------------------------------------------
def output_values(a: Answer) -> dict[str, tuple[dict[str, Any], Any]]:
    """Every output by name: (tensor meta {name, datatype, shape}, values), for HTTP and gRPC alike; which
    outputs a model has depends on its problem type (outputs.py)."""
    return outputs.v2_values(a.problem_type, a.labels, a.probs, a.truncated)


def model_config(st: ServeState, model: ServedModel) -> dict[str, Any]:
    """Triton's model configuration shape (what tritonclient's get_model_config returns)."""
    rt = model.runtime
    cfg, k = st.config, len(rt.labels)
    return {
        "name": model.name, "platform": f"qserve_{rt.manifest.backend}", "backend": "qserve",
        "version_policy": {"specific": {"versions": [model.version]}},
        "max_batch_size": 0,  # shapes below include the batch dimension (-1 = n texts)
        "input": config_inputs(rt),
        "output": outputs.v2_config_outputs(rt.problem_type, k),
        "dynamic_batching": {"max_queue_delay_microseconds": int(cfg.wait_ms * 1000),
                             "preferred_batch_size": [cfg.batch_size]},
        "parameters": {"labels": {"string_value": ",".join(rt.labels)},
                       "problem_type": {"string_value": rt.problem_type},
                       "max_length": {"string_value": str(rt.max_length)},
                       "max_inputs": {"string_value": str(cfg.max_inputs)},
                       "max_chars": {"string_value": str(cfg.max_chars)}},
    }


def model_metadata(model: ServedModel) -> dict[str, Any]:
    """The V2 model metadata (HTTP GET /v2/models/{name}; gRPC ModelMetadata)."""
    rt = model.runtime
    k = len(rt.labels)
    return {"name": model.name, "versions": [model.version], "platform": f"qserve_{rt.manifest.backend}",
            "inputs": metadata_inputs(rt),
            "outputs": outputs.v2_metadata_outputs(rt.problem_type, k),
            "parameters": {"labels": ",".join(rt.labels), "problem_type": rt.problem_type, "max_length": rt.max_length,
                           "long_text": str(rt.long_text), "model_name": rt.manifest.model_name,
                           **gate_parameters(rt.manifest)}}


def gate_parameters(manifest: Manifest) -> dict[str, str]:
    """The release gate's verdict and the calibration as metadata parameters, only for a gated or calibrated
    variant (another answers exactly as before): gate = passed|failed, gate_agreement_lower_bound, gate_bar,
    gate_n, and temperature or thresholds."""
    out: dict[str, str] = {}
    g = gate_summary(manifest)
    if g is not None:
        out.update({"gate": "passed" if g["passed"] else "failed",
                    "gate_agreement_lower_bound": f"{g['agreement_lower_bound']:.6f}", "gate_bar": str(g["bar"]),
                    "gate_n": str(g["n"])})
    if manifest.temperature is not None:
        out["temperature"] = str(manifest.temperature)
    if manifest.thresholds is not None:
        out["thresholds"] = ",".join(f"{t:g}" for t in manifest.thresholds)
    return out


def check_version(model: ServedModel, version: str) -> None:
    """404 unless `version` is the one `model` serves now (HTTP /versions/{version}/..., gRPC model_version)."""
    if version != model.version:
        raise ApiError(404, f"unknown model version {version!r} of {model.name!r}; it serves version "
                            f"{model.version!r} (GET /v2/models/{model.name}), or leave the version out")


async def infer_answer(st: ServeState, model: ServedModel, req: V2InferRequest, binary: bytes,
                       request: Request) -> Response:
    """POST .../infer's answer to a parsed body (the FastAPI route and the guard's fast path both call this)."""
    if req.id is not None and unicode_problem(req.id):
        raise ApiError(422, f"id {unicode_problem(req.id)}")
    texts, pairs = request_texts(st, req, binary, model)
    binary_default, asked = requested_outputs(req)
    long_text = req.parameters.long_text if req.parameters else None
    a = await st.submit(model, texts, request.scope, request.state.request_id, long_text, "parameters.long_text",
                        pairs, outputs=[name for name, _ in asked])
    values = output_values(a)
    flags = [flag for _, flag in asked] or [binary_default] * len(a.outputs)
    head = {"model_name": a.name, "model_version": a.version, "id": req.id or request.state.request_id,
            "parameters": {"labels": ",".join(a.labels), "max_length": a.max_length, "long_text": a.policy}}
    return encode_response(head, [(*values[w], flag) for w, flag in zip(a.outputs, flags)])


def bind_infer(st: ServeState, params: Mapping[str, str], scope: Scope, body: bytes
               ) -> Callable[[Request], Awaitable[Response]] | None:
    """The guard's fast path for POST /v2/models/{name}[/versions/{version}]/infer: the answer to `body`, still to
    compute, or None when the body does not parse (JSON header, binary split, V2InferRequest), so the FastAPI
    route answers it exactly as before. A parsed body is answered by the function the route calls, after the
    same model and version checks the route makes first."""
    try:
        req, binary = _parse_request(body, Headers(scope=scope).get(HEADER_LENGTH))
    except (ApiError, RequestValidationError):
        return None
    name, version = params["name"], params.get("version")

    async def answer(request: Request) -> Response:
        model = st.model(name, request)
        if version is not None:
            check_version(model, version)
        return await infer_answer(st, model, req, binary, request)

    return answer


# -- the declaration (registry.py serves it) ---------------------------------------------------------------
def _server(st: ServeState) -> Endpoint:
    async def v2_server() -> dict:
        return {"name": "qserve", "version": __version__, "extensions": EXTENSIONS}

    return v2_server


def _live(st: ServeState) -> Endpoint:
    async def v2_live() -> dict:
        return {"live": True}

    return v2_live


def _ready(st: ServeState) -> Endpoint:
    async def v2_ready() -> JSONResponse:
        return JSONResponse({"ready": st.ready}, status_code=200 if st.ready else 503)

    return v2_ready


def _metadata(st: ServeState) -> Endpoint:
    async def v2_metadata(name: str, request: Request) -> dict:
        return model_metadata(st.model(name, request))

    return v2_metadata


def _model_ready(st: ServeState) -> Endpoint:
    async def v2_model_ready(name: str, request: Request) -> dict:
        return {"name": st.model(name, request).name, "ready": True}

    return v2_model_ready


def _config(st: ServeState) -> Endpoint:
    async def v2_config(name: str, request: Request) -> dict:
        return model_config(st, st.model(name, request))

    return v2_config


def _infer(st: ServeState) -> Endpoint:
    async def infer(name: str, request: Request) -> Response:
        model = st.model(name, request)
        req, binary = _parse_request(await request.body(), request.headers.get(HEADER_LENGTH))
        return await infer_answer(st, model, req, binary, request)

    return infer


def _model_routes(prefix: str) -> tuple[Route, ...]:
    """A model's routes under `prefix`; the versioned prefix's check the version first (the one being served)."""
    versioned = "{version}" in prefix
    note = " (the version being served only)" if versioned else ""

    def with_version(make: Callable[[ServeState], Endpoint]) -> Callable[[ServeState], Endpoint]:
        if not versioned:
            return make

        def endpoint(st: ServeState) -> Endpoint:
            fn = make(st)

            async def wrapped(name: str, version: str, request: Request) -> Any:  # Any: what `fn` answers
                check_version(st.model(name, request), version)
                return await fn(name, request)

            wrapped.__name__ = fn.__name__ + "_versioned"
            return wrapped

        return endpoint

    model_errors = _errors(401, 404, 503)
    return (
        Route("GET", prefix, with_version(_metadata), dict(
            tags=["v2"], response_model=V2ModelMetadata, responses=model_errors,
            summary="Model metadata: a BYTES text input (and text_pair for a pair model), FP32 probabilities out"
                    + note)),
        Route("GET", prefix + "/ready", with_version(_model_ready), dict(
            tags=["v2"], responses=model_errors, summary="Model ready (404 for another model name)" + note)),
        Route("GET", prefix + "/config", with_version(_config), dict(
            tags=["v2"], responses=model_errors, summary="Triton-style model configuration" + note)),
        Route("POST", prefix + "/infer", with_version(_infer), dict(
            tags=["v2"], response_model=V2InferResponse, responses=INFER_RESPONSES, openapi_extra=INFER_BODY,
            description=INFER_DESCRIPTION, summary="Infer: one BYTES input of n texts -> probabilities FP32 [n, k], "
                                                   "label, truncated; JSON or binary tensor data" + note),
              fast=bind_infer),
    )


def register_schemas(schema: dict[str, Any]) -> None:
    """Put V2InferRequest (read by hand, so FastAPI does not know it) into the OpenAPI components."""
    full = V2InferRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    comps = schema.setdefault("components", {}).setdefault("schemas", {})
    comps.update(full.pop("$defs", {}))
    comps["V2InferRequest"] = full


MAX_SHAPE_BRANCHES = 256  # above this --max-inputs, the shape/data pairing is stated in prose only


def publish(comps: dict[str, Any], config: ServeConfig, manifest: Manifest | None) -> None:
    """JSON Schema cannot say "shape matches len(data)", but it can list every valid pairing."""
    tensor = comps.get("V2InputTensor")
    if tensor is not None and config.max_inputs <= MAX_SHAPE_BRANCHES:
        tensor["anyOf"] = [{"properties": {"shape": {"enum": [[n], [n, 1]]}, "data": {"minItems": n, "maxItems": n}}}
                           for n in range(1, config.max_inputs + 1)]


def expected(cfg: ServeConfig) -> str:
    """What a body the V2 routes refuse should have been."""
    return ('expected {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [n], '
            f'"data": [n strings]}}]}} with 1..{cfg.max_inputs} non-empty texts of at most '
            f"{cfg.max_chars} characters")


# The repository extension (v2_repository.py) is V2's too: the same error shape, metrics label and bodies.
V2 = Protocol(
    name="v2", metrics_label="v2", expected=expected, raw_body=True, hint="POST /v2/models/{name}/infer",
    openapi=OpenApi(texts=("V2InputTensor",), long_text=("V2RequestParameters",), components=register_schemas,
                    publish=publish),
    routes=(
        Route("GET", "/v2", _server, dict(tags=["v2"], summary="Server metadata", responses=_errors(401))),
        Route("GET", "/v2/health/live", _live, dict(tags=["v2"], summary="Server live"), open=True),
        Route("GET", "/v2/health/ready", _ready, dict(tags=["v2"], summary="Server ready (503 until the model is "
                                                      "loaded)", responses={503: {"description": "not ready yet"}}),
              open=True),
        *_model_routes("/v2/models/{name}"),
        *_model_routes("/v2/models/{name}/versions/{version}"),
        *repository.ROUTES,
    ))
