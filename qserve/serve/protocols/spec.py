"""What a serving protocol declares of itself, and the one route table the app, the guard and the fast path read.

    python -c "from qserve.serve.protocols.registry import PROTOCOLS; \\
[print(p.name, r.method, r.path) for p in PROTOCOLS for r in p.routes]"

A ProtocolSpec is one module's declaration: its routes (method, path, the endpoint FastAPI calls and, for a route
that classifies, how its body is read and the answer function), its error shape, its OpenAPI additions, its
metrics label and any server it runs beside HTTP (V2's gRPC). registry.py lists the protocols; from that one tuple
Protocols builds the one route table: the app registers every FastAPI route from it, the guard (qserve/serve/
guard.py) matches each request against it once (its template for metrics, whether its body is read, its path's
model) and answers the inference routes from that match on the fast path (fast_routes), metrics label each
request by it, tracing picks the routes it traces on open paths, and the OpenAPI document gets each protocol's
additions. A route declared with `answered` gives both its FastAPI route and its fast path, so the two cannot
drift.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette._utils import get_route_path
from starlette.datastructures import Headers
from starlette.routing import compile_path
from starlette.types import Message, Scope, Send

from qserve.artifact import Manifest
from qserve.serve.core.state import ServeState
from qserve.serve.infra.config import ServeConfig
from qserve.serve.infra.errors import ApiError

B = TypeVar("B")
FOUND_CACHE = 4096
"""(path, method) pairs whose protocol Protocols keeps found; more than this are looked up each time."""
DOCS = ("/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc")
"""The paths FastAPI serves itself (its defaults: the document and its two viewers), GET and HEAD, open to all."""

Bound = Callable[[Request], Awaitable[object]]
"""A parsed body's answer, still to compute: (the request) -> what the route's JSONResponse holds (or the route's
Response itself, as V2 builds it)."""

Binder = Callable[[ServeState, Scope, bytes], Bound | None]
"""One route's fast path: (state, scope, body) -> its answer still to compute, or None when the body does not
parse, so the FastAPI route answers it exactly as it would have."""

Endpoint = Callable[..., Any]
"""A FastAPI endpoint: its signature is what FastAPI reads (the body model, path and query parameters)."""


@dataclass(frozen=True)
class Route:
    """One HTTP route: `endpoint(st)` makes what FastAPI calls for `method path`; `options` are FastAPI's
    add_api_route keywords (tags, summary, response_model, responses, ...). A route with `fast` is an
    inference route (it queues texts): the guard answers it from its fast path, refuses it early when the
    queue is full, and tracing follows it even on an open path. `open`: its path answers without the API key
    (a probe, the page; an inference route on the same path still needs it). `label`: its metrics label when it
    is not its protocol's."""

    method: str
    path: str
    endpoint: Callable[[ServeState], Endpoint]
    options: Mapping[str, Any] = field(default_factory=dict)
    fast: Binder | None = None
    open: bool = False
    label: str | None = None

    @property
    def inference(self) -> bool:
        return self.fast is not None


@dataclass(frozen=True)
class RawBody(Generic[B]):
    """A body an inference route reads as bytes, not as one JSON model (V2: JSON, or a JSON header followed by
    binary tensor data). `parse(body, headers)` -> the request, or raises ApiError / RequestValidationError (the
    route's 400 / 422). `first(st, request)`: the checks the route answers before any word on the body (V2: the
    model and version its path names, so an unknown model is a 404 whatever the body); the answer makes them
    itself for a body that parses."""

    parse: Callable[[bytes, Headers], B]
    first: Callable[[ServeState, Request], object] | None = None


def answered(
    method: str,
    path: str,
    body: type[BaseModel] | RawBody[Any],
    answer: Callable[[ServeState, Any, Request], Awaitable[object]],
    name: str,
    **options: Any,
) -> Route:  # Any: the parsed body (the model or what the RawBody parses); FastAPI's keywords
    """An inference route: its body read as `body` (a JSON model, or a RawBody) and answered by `answer(st, parsed
    body, request)`, as JSON (or the Response it returns). Both the FastAPI route (a JSON model validated by
    FastAPI and shown in OpenAPI; a raw body parsed by the route, its path parameters in the signature) and the
    guard's fast path (the same model or parser on the body already read) call `answer`. `name` is the endpoint's
    name (OpenAPI's operationId)."""

    def endpoint(st: ServeState) -> Endpoint:
        async def respond(parsed: Any, request: Request) -> Response:  # Any: what `body` reads
            out = await answer(st, parsed, request)
            return out if isinstance(out, Response) else JSONResponse(out)

        if isinstance(body, RawBody):
            raw = body

            async def route(request: Request, **path: str) -> Response:
                try:
                    parsed = raw.parse(await request.body(), request.headers)
                except Exception:
                    if raw.first is not None:
                        raw.first(st, request)  # what the route answers before the body's own refusal
                    raise
                return await respond(parsed, request)

            params = [
                inspect.Parameter(p, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=str)
                for p in compile_path(path)[2]
            ]
            returns: type[Response] = Response
        else:

            async def route(body: Any, request: Request) -> Response:  # type: ignore[misc]  # Any: `body`, as the signature says
                return await respond(body, request)

            params = [inspect.Parameter("body", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=body)]
            returns = JSONResponse

        route.__name__ = route.__qualname__ = name
        # FastAPI reads the body model and path parameters from the signature; they are only known here, at run time
        route.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [*params, inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Request)],
            return_annotation=returns,
        )
        return route

    def fast(st: ServeState, scope: Scope, data: bytes) -> Bound | None:
        try:
            parsed = (
                body.parse(data, Headers(scope=scope)) if isinstance(body, RawBody) else body.model_validate_json(data)
            )
        except (ValidationError, ApiError, RequestValidationError):
            return None
        return lambda request: answer(st, parsed, request)

    return Route(method, path, endpoint, options, fast)


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
    """A protocol's part of the OpenAPI document. `texts`: components whose texts and lists of texts carry this
    server's --max-chars and --max-inputs; `long_text`: components whose long_text pattern is bounded by the
    served model's max_length; `components(schema)` adds what FastAPI does not know (before the limits);
    `publish(components, published)` narrows the protocol's schemas to this server and its model (after them)."""

    texts: tuple[str, ...] = ()
    long_text: tuple[str, ...] = ()
    components: Callable[[dict[str, Any]], None] | None = None
    publish: Callable[[dict[str, Any], Published], None] | None = None


class Running(Protocol):
    """A server a protocol runs beside HTTP (V2's gRPC), stopped when the app shuts down."""

    async def stop(self) -> None: ...


Start = Callable[[ServeState], Awaitable[Running | None]]
"""Start a server beside HTTP on the serving state, on the app's event loop; None: not asked for (no --grpc-port)."""


@dataclass(frozen=True)
class ProtocolSpec:
    """One protocol, as its module declares it. `expected(config)`: what a body its routes refuse should have
    been, said in the 400/422 message (None: the default protocol's); `raw_body`: its POST bodies may come
    without a Content-Type or as application/octet-stream (binary data), not only as JSON; `hint`: the
    inference call the 404 message points to, if any; `servers`: servers it runs beside HTTP, by the name the
    app's state keeps each under (app.state.grpc)."""

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
    """A request's place in the route table: `template` is the path template of the route it reaches (a route at
    its path under another method: the 405's path; "unmatched": none); `full` when its method takes a route
    there, `route` that route (None for FastAPI's own docs), `params` the path's parameters (the model named).
    `protocol` is the protocol the request belongs to (its error shape, its metrics `label`): the route's; for a
    method no route at the path takes (a 405), the path's GET route for HEAD, else its POST route (an inference
    route speaks for its path: POST / beside the page's GET /), else its first; None: the docs, or no route."""

    template: str
    full: bool = False
    route: Route | None = None
    params: Mapping[str, str] = field(default_factory=dict)
    protocol: ProtocolSpec | None = None
    label: str = "other"


UNMATCHED = RouteMatch("unmatched")


class Protocols:
    """The served protocols (registry.PROTOCOLS) and the one route table built from them, read through one
    lookup: `match(path, method)`, what a request reaches as the app's router will route it (FastAPI's docs
    first, then every declared route in order) and the protocol it belongs to. The guard, the fast path, the
    error handlers and the metrics all decide on that match."""

    def __init__(self, protocols: Sequence[ProtocolSpec], default: ProtocolSpec, docs: Sequence[str] = DOCS):
        self.all = tuple(protocols)
        self.default = default
        self.docs = frozenset(docs)
        self._routes = [(compile_path(r.path)[0], r, p) for p in self.all for r in p.routes]
        self._docs = [(compile_path(d)[0], d) for d in docs]
        self._found: dict[tuple[str, str], RouteMatch] = {}
        self.inference_paths = frozenset(r.path for p in self.all for r in p.routes if r.inference)
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


FastRoute = Callable[[RouteMatch, Scope, bytes, Send], Awaitable[bool]]
"""The guard's hook once it holds a request's whole body: (its match, scope, body, send) -> True when it answered."""


def fast_routes(
    st: ServeState, protocols: Protocols, error: Callable[[Request, Exception], Awaitable[Response]]
) -> FastRoute:
    """Every inference route answered straight from the guard, past FastAPI's request machinery.

    Profiled at one client (py-spy, onnx-int8), FastAPI's per-request work around the endpoint (body and
    content-type handling, dependency solving, the exception-handling layers, the response's send chain) was
    about a third of the event loop's time outside the model. The guard's match in the route table names the
    route; its body is read by the very model or parser the route declares and answered by the function the route
    calls (Route.fast); `error` renders an exception as the app's handlers do (in the route's protocol's error
    shape). A body the route's fast path refuses goes on to the FastAPI route untouched, so every 400/422 reads
    exactly as before; the routes stay what OpenAPI shows."""

    async def handle(found: RouteMatch, scope: Scope, body: bytes, send: Send) -> bool:
        if found.route is None or found.route.fast is None:
            return False
        bound = found.route.fast(st, scope, body)
        if bound is None:
            return False
        scope["path_params"] = dict(found.params)  # what request.path_params reads, as the router would set it
        request = Request(scope)
        try:
            answer = await bound(request)
        except Exception as e:  # ApiError and the unexpected, as the app's exception handlers answer them
            await (await error(request, e))(scope, _no_receive, send)
            return True
        if isinstance(answer, Response):  # V2: JSON or binary tensor data, built by the route's own encoder
            await answer(scope, _no_receive, send)
            return True
        # What JSONResponse(answer) sends, byte for byte (same dumps, same headers), without building one
        out = json.dumps(answer, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-length", str(len(out)).encode()), (b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": out})
        return True

    return handle


def route_path(scope: Scope) -> str:
    """The path the route table matches: the request's path under the app's root_path, as Starlette routes it."""
    return get_route_path(scope)


async def _no_receive() -> Message:
    return {"type": "http.disconnect"}  # a plain Response never reads; the body was consumed already
