"""What a serving protocol declares of itself, and the one route table the app, the guard and the metrics read.

    python -c "from qserve.serve.protocols.registry import PROTOCOLS; \\
[print(p.name, r.method, r.path) for p in PROTOCOLS for r in p.routes]"

A ProtocolSpec is one module's declaration (routes, error shape, OpenAPI additions, metrics label, servers beside
HTTP); Protocols is the one route table built from registry.py's list. An inference route (`inference`) is answered
by the guard alone; FastAPI holds only its OpenAPI entry (docs/architecture.md).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from fastapi import Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette._utils import get_route_path
from starlette.routing import compile_path
from starlette.types import Scope

from qserve.artifact import Manifest
from qserve.serve.core.state import ServeState
from qserve.serve.infra.config import ServeConfig
from qserve.serve.infra.errors import ApiError

B = TypeVar("B")
M = TypeVar("M", bound=BaseModel)
REF_TEMPLATE = "#/components/schemas/{model}"
FOUND_CACHE = 4096
"""(path, method) pairs whose protocol Protocols keeps found; more than this are looked up each time."""
DOCS = ("/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc")
"""The paths FastAPI serves itself (its defaults: the document and its two viewers), GET and HEAD, open to all."""

Respond = Callable[[ServeState, bytes, Request], Awaitable[object]]
"""An inference route's one answer: (state, its body as read, the request) -> what its JSONResponse holds (or the
Response itself, as V2 builds it); raises ApiError or RequestValidationError for what it refuses."""

Endpoint = Callable[..., Any]
"""A FastAPI endpoint: its signature is what FastAPI reads (the body model, path and query parameters)."""


@dataclass(frozen=True)
class Route:
    """One HTTP route: `endpoint(st)` makes what FastAPI calls for `method path`; `options` are FastAPI's
    add_api_route keywords. An inference route (made by `inference`) has `answer`, the guard's one way of
    answering it, and `body`, the model its OpenAPI entry shows. `open`: its path answers without the API key (an
    inference route there still needs it). `label`: its metrics label when it is not its protocol's."""

    method: str
    path: str
    endpoint: Callable[[ServeState], Endpoint]
    options: Mapping[str, Any] = field(default_factory=dict)
    answer: Respond | None = None
    body: type[BaseModel] | None = None
    open: bool = False
    label: str | None = None

    @property
    def inference(self) -> bool:
        return self.answer is not None


@dataclass(frozen=True)
class Body(Generic[B]):
    """How an inference route reads its body: `read(body, request)` -> what its answer takes, or raises ApiError /
    RequestValidationError (its 400 / 422); `schema`: the body its OpenAPI entry shows; `first(st, request)`: what
    the route checks before any word on the body (V2: the model its path names, a 404 whatever the body)."""

    schema: type[BaseModel]
    read: Callable[[bytes, Request], B]
    first: Callable[[ServeState, Request], object] | None = None


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


# What FastAPI holds of an inference route: its OpenAPI entry. No docstring: FastAPI would print it as a description.
async def documented() -> None:
    raise RuntimeError("an inference route is answered by the guard (qserve/serve/guard.py), never by FastAPI")


def inference(
    method: str,
    path: str,
    body: Body[B],
    answer: Callable[[ServeState, B, Request], Awaitable[object]],
    name: str,
    **options: object,
) -> Route:
    """An inference route: its body read by `body` and answered by `answer(st, read body, request)`, by the guard
    alone. FastAPI keeps its OpenAPI entry: `name` (the operationId), its body and path parameters, `options`."""

    async def respond(st: ServeState, data: bytes, request: Request) -> object:
        try:
            parsed = body.read(data, request)
        except Exception:
            if body.first is not None:
                body.first(st, request)  # what the route answers before the body's own refusal
            raise
        return await answer(st, parsed, request)

    ref = {"$ref": REF_TEMPLATE.format(model=body.schema.__name__)}
    extra: dict[str, Any] = {"requestBody": {"content": {"application/json": {"schema": ref}}, "required": True}}
    params = compile_path(path)[2]
    if params:
        extra["parameters"] = [
            {"name": p, "in": "path", "required": True, "schema": {"type": "string", "title": p.title()}}
            for p in params
        ]
    return Route(
        method, path, lambda st: documented, {"name": name, "openapi_extra": extra, **options}, respond, body.schema
    )


def document_bodies(schema: dict[str, Any], models: Iterable[type[BaseModel]]) -> None:
    """The inference routes' body models into the OpenAPI components, as FastAPI writes a model's schema (no null
    values): FastAPI does not read their bodies, so it does not know them."""
    comps = schema.setdefault("components", {}).setdefault("schemas", {})
    for model in models:
        full = jsonable_encoder(model.model_json_schema(ref_template=REF_TEMPLATE), exclude_none=True)
        comps.update(full.pop("$defs", {}))
        comps[model.__name__] = full
    schema["components"]["schemas"] = dict(sorted(comps.items()))


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


@dataclass(frozen=True)
class RouteMatch:
    """A request's place in the route table: the `template` it reaches ("unmatched": none), `full` when its method
    takes a `route` there (None: FastAPI's docs), the path's `params`, and the `protocol` it belongs to (for a 405:
    the path's GET route for HEAD, else its POST route, else its first) with its metrics `label`."""

    template: str
    full: bool = False
    route: Route | None = None
    params: Mapping[str, str] = field(default_factory=dict)
    protocol: ProtocolSpec | None = None
    label: str = "other"


UNMATCHED = RouteMatch("unmatched")


class Protocols:
    """The served protocols and the one route table built from them, read through one lookup, `match(path,
    method)`: what the app's router will reach (FastAPI's docs first, then the declared routes in order)."""

    def __init__(self, protocols: Sequence[ProtocolSpec], default: ProtocolSpec, docs: Sequence[str] = DOCS):
        self.all = tuple(protocols)
        self.default = default
        self.docs = frozenset(docs)
        self._routes = [(compile_path(r.path)[0], r, p) for p in self.all for r in p.routes]
        self._docs = [(compile_path(d)[0], d) for d in docs]
        self._found: dict[tuple[str, str], RouteMatch] = {}
        self.inference_paths = frozenset(r.path for p in self.all for r in p.routes if r.inference)
        self.bodies = tuple(dict.fromkeys(r.body for p in self.all for r in p.routes if r.body is not None))
        self.open_paths = frozenset(r.path for p in self.all for r in p.routes if r.open)
        self.raw_body_paths = frozenset(r.path for p in self.all if p.raw_body for r in p.routes if r.method == "POST")
        labels = [p.metrics_label for p in self.all] + [r.label for p in self.all for r in p.routes if r.label]
        self.labels = tuple(dict.fromkeys([x for x in labels if x != "other"] + ["other"]))
        self.hint = " or ".join(p.hint for p in self.all if p.hint)

    def match(self, path: str, method: str) -> RouteMatch:
        """The route a request at `path` (a concrete path or a route template) with `method` reaches."""
        key = (path, method)
        found = self._found.get(key)
        if found is None:
            found = self._lookup(path, method)
            if len(self._found) < FOUND_CACHE:  # paths carry client-chosen model names: a bound all the same
                self._found[key] = found
        return found

    def _lookup(self, path: str, method: str) -> RouteMatch:
        partial: str | None = None
        for regex, doc in self._docs:
            if regex.match(path):
                if method in ("GET", "HEAD"):
                    return RouteMatch(doc, True)
                partial = partial or doc
        here = [(m, r, p) for regex, r, p in self._routes if (m := regex.match(path)) is not None]
        for m, r, p in here:
            if r.method == method:
                return RouteMatch(r.path, True, r, m.groupdict(), p, r.label or p.metrics_label)
        if not here:
            return UNMATCHED if partial is None else RouteMatch(partial)
        get = "GET" if method == "HEAD" else method
        _, owner, p = next((x for want in (get, "POST") for x in here if x[1].method == want), here[0])
        return RouteMatch(partial or here[0][1].path, protocol=p, label=owner.label or p.metrics_label)

    def allowed(self, template: str) -> list[str]:
        """The methods the routes declared at `template` take (a 405's Allow), sorted; [] for none."""
        methods = {m for d in self.docs if d == template for m in ("GET", "HEAD")}
        methods |= {r.method for p in self.all for r in p.routes if r.path == template}
        return sorted(methods)

    def label(self, template: str, method: str) -> str:
        """The metrics label of a request by its route template ("other" for none)."""
        return self.match(template, method).label

    def expected(self, found: RouteMatch, config: ServeConfig) -> str:
        """What a body refused on the matched route should have been (the 400/422 message's second half)."""
        expected = (found.protocol.expected if found.protocol is not None else None) or self.default.expected
        return expected(config) if expected is not None else ""

    @staticmethod
    def refusal(found: RouteMatch, status: int, message: str) -> bytes | None:
        """The guard's refusal (401, 413, 415, 429) in the matched protocol's error shape; None: qserve's."""
        shape = errors(found)
        return None if shape is None else json.dumps(shape.body(shape.status(status, False), message)).encode()


def errors(found: RouteMatch) -> ErrorShape | None:
    """The error shape of the protocol a request belongs to (None: qserve's {"error", "request_id"})."""
    return None if found.protocol is None else found.protocol.errors


def route_path(scope: Scope) -> str:
    """The path the route table matches: the request's path under the app's root_path, as Starlette routes it."""
    return get_route_path(scope)
