"""What a serving protocol declares of itself: its routes, error shape, OpenAPI additions, metrics label and servers.

    python -c "from qserve.serve.protocols.registry import PROTOCOLS; \\
[print(p.name, r.method, r.path) for p in PROTOCOLS for r in p.routes]"

A ProtocolSpec is one module's declaration; registry.py lists them, the router (serve/router.py) builds its one route
table from that list and answers every route by its declaration, and protocols/docs.py writes the OpenAPI document
from the same declarations (docs/architecture.md).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from qserve.artifact import Manifest
from qserve.serve.core.state import ServeState
from qserve.serve.infra.config import ServeConfig
from qserve.serve.infra.errors import ApiError

B = TypeVar("B")
M = TypeVar("M", bound=BaseModel)

Answer = Callable[[ServeState, Any, Request], Awaitable[object]]
"""A route's answer: (state, its body as its Body read it (the bytes without a Body; b"" for a GET), the request) ->
a JSON value, or a Response; raises ApiError or RequestValidationError for what it refuses."""


@dataclass(frozen=True)
class Body(Generic[B]):
    """How a route reads its body: `read(body, request)` -> what its answer takes, or raises ApiError /
    RequestValidationError (its 400 / 422); `schema`: the body its OpenAPI entry shows; `first(st, request)`: what
    the route checks before any word on the body (V2: the model its path names, a 404 whatever the body)."""

    schema: type[BaseModel]
    read: Callable[[bytes, Request], B]
    first: Callable[[ServeState, Request], object] | None = None

    def parse(self, st: ServeState, data: bytes, request: Request) -> B:
        try:
            return self.read(data, request)
        except Exception:
            if self.first is not None:
                self.first(st, request)  # what the route answers before the body's own refusal
            raise


@dataclass(frozen=True)
class Route:
    """One HTTP route: `answer` answers `method path`, its body read by `body` first. `doc`: its OpenAPI entry (tags,
    summary, description, responses, response_model (default: the answer's return annotation), media_type,
    openapi_extra); `name`: its operationId's stem (default: the answer's name). `open`: it answers without the API
    key; `inference`: it brings texts to classify (the overload gate); `label`: its metrics label, when not its
    protocol's."""

    method: str
    path: str
    answer: Answer
    doc: Mapping[str, Any] = field(default_factory=dict)
    body: Body[Any] | None = None
    name: str = ""
    open: bool = False
    inference: bool = False
    label: str | None = None


def json_body(model: type[M]) -> Body[M]:
    """A JSON body read as `model`, with FastAPI's statuses and words (read_json)."""
    return Body(model, lambda data, request: read_json(model, data))


def read_json(model: type[M], data: bytes) -> M:
    """`data` as `model`: pydantic's JSON parser first (one pass); what it refuses is read as FastAPI reads a JSON
    body (json.loads, then the model), so a BOM is taken and every refusal is FastAPI's RequestValidationError."""
    try:
        return model.model_validate_json(data)
    except ValidationError:
        pass
    if not data:
        raise RequestValidationError([{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}])
    try:
        value = json.loads(data)
    except json.JSONDecodeError as e:
        error = {"type": "json_invalid", "loc": ("body", e.pos), "msg": "JSON decode error", "input": {}}
        raise RequestValidationError([{**error, "ctx": {"error": e.msg}}]) from None
    except Exception:  # not UTF-8, too deep: FastAPI's words
        raise ApiError(400, "There was an error parsing the body") from None
    try:
        return model.model_validate(value, from_attributes=True)
    except ValidationError as e:
        raise RequestValidationError([{**x, "loc": ("body", *x["loc"])} for x in e.errors(include_url=False)]) from None


@dataclass(frozen=True)
class ErrorShape:
    """A protocol's own error answer: `status(qserve's status, the body did not parse?)` -> the protocol's
    status; `body(that status, message)` -> its JSON body. None on a ProtocolSpec: qserve's {"error", "request_id"}."""

    status: Callable[[int, bool], int]
    body: Callable[[int, str], dict[str, Any]]


@dataclass(frozen=True)
class Published:
    """What the OpenAPI document is narrowed to: this server's settings and the model it serves by default."""

    config: ServeConfig
    manifest: Manifest | None
    """The default model's manifest when one variant is served from a plain DIR (None: several models, a model
    dir, a repository, or no readable manifest): its inputs and max_length."""
    answers: Manifest | None
    """The manifest whose problem type the answers' shapes (outputs, threshold) are narrowed to: `manifest`, and
    also the one model served as NAME=DIR."""


@dataclass(frozen=True)
class OpenApi:
    """A protocol's part of the OpenAPI document: `texts` (components given --max-chars and --max-inputs),
    `long_text` (components whose long_text pattern gets the model's max_length), `publish` (its own narrowing)."""

    texts: tuple[str, ...] = ()
    long_text: tuple[str, ...] = ()
    publish: Callable[[dict[str, Any], Published], None] | None = None


class Running(Protocol):
    """A server a protocol runs beside HTTP (V2's gRPC), stopped when the app shuts down."""

    async def stop(self) -> None: ...


Start = Callable[[ServeState], Awaitable[Running | None]]
"""Start a server beside HTTP on the serving state, on the app's event loop; None: not asked for (no --grpc-port)."""


@dataclass(frozen=True)
class ProtocolSpec:
    """One protocol, as its module declares it. `expected(config)`: the 400/422 message's "expected ..." (None: the
    default protocol's); `raw_body`: its POST bodies may be octet-stream or untyped; `hint`: the 404's pointer;
    `servers`: what it runs beside HTTP, by its name on app.state (V2's grpc)."""

    name: str
    routes: tuple[Route, ...]
    metrics_label: str = "other"
    errors: ErrorShape | None = None
    expected: Callable[[ServeConfig], str] | None = None
    openapi: OpenApi = OpenApi()
    raw_body: bool = False
    hint: str = ""
    servers: Mapping[str, Start] = field(default_factory=dict)
