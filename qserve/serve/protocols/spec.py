"""What a serving protocol declares of itself, and what the app, the guard, metrics and tracing derive from it.

    python -c "from qserve.serve.protocols.registry import PROTOCOLS; [print(p.name, r.method, r.path) for p in PROTOCOLS for r in p.routes]"

A Protocol is one module's declaration: its routes (method, path, the endpoint FastAPI calls and, for a route
that classifies, the body model and the answer function), its error shape, its OpenAPI additions and its
metrics label. registry.py lists the protocols; from that one tuple the app registers every FastAPI route,
the guard answers the inference routes on its fast path (fast_routes), metrics label each request, tracing
picks the routes it traces on open paths, and the OpenAPI document gets each protocol's additions. A route
declared with `answered` gives both its FastAPI route and its fast path, so the two cannot drift.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.routing import compile_path
from starlette.types import Message, Scope, Send

from qserve.artifact import Manifest
from qserve.serve.core.state import ServeState
from qserve.serve.infra.config import ServeConfig

B = TypeVar("B", bound=BaseModel)
FOUND_CACHE = 4096
"""(path, method) pairs whose route Protocols keeps found; more than this are looked up each time."""

FastRoute = Callable[[Scope, bytes, Send], Awaitable[bool]]
"""The guard's hook once it holds a request's whole body: (scope, body, send) -> True when it answered."""

Bound = Callable[[Request], Awaitable[object]]
"""A parsed body's answer, still to compute: (the request) -> what the route's JSONResponse holds (or the route's
Response itself, as V2 builds it)."""

Binder = Callable[[ServeState, Mapping[str, str], Scope, bytes], Bound | None]
"""One route's fast path: (state, the path's parameters, scope, body) -> its answer still to compute, or None when
the body does not parse, so the FastAPI route answers it exactly as it would have."""

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


def answered(method: str, path: str, schema: type[B], answer: Callable[[ServeState, B, Request], Awaitable[object]],
             name: str, **options: Any) -> Route:  # Any: FastAPI's add_api_route keywords
    """A route that reads `schema` and answers `answer(st, body, request)` as JSON: the FastAPI route (body
    validated by FastAPI, shown in OpenAPI as `schema`) and the guard's fast path (the same model validating the
    raw bytes in one pydantic call) both call `answer`. `name` is the endpoint's name (OpenAPI's operationId)."""

    def endpoint(st: ServeState) -> Endpoint:
        async def route(body: Any, request: Request) -> JSONResponse:  # Any: `schema`, as the signature says
            return JSONResponse(await answer(st, body, request))

        route.__name__ = route.__qualname__ = name
        # FastAPI reads the body model from the signature; `schema` is only known here, at run time
        route.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [inspect.Parameter("body", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=schema),
             inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Request)],
            return_annotation=JSONResponse)
        return route

    def fast(st: ServeState, params: Mapping[str, str], scope: Scope, body: bytes) -> Bound | None:
        try:
            parsed = schema.model_validate_json(body)
        except ValidationError:
            return None
        return lambda request: answer(st, parsed, request)

    return Route(method, path, endpoint, options, fast)


@dataclass(frozen=True)
class ErrorShape:
    """A protocol's own error answer: `status(qserve's status, the body did not parse?)` -> the protocol's
    status; `body(that status, message)` -> its JSON body. None on a Protocol: qserve's {"error", "request_id"}."""

    status: Callable[[int, bool], int]
    body: Callable[[int, str], dict[str, Any]]


@dataclass(frozen=True)
class OpenApi:
    """A protocol's part of the OpenAPI document. `texts`: components whose texts and lists of texts carry this
    server's --max-chars and --max-inputs; `long_text`: components whose long_text pattern is bounded by the
    served model's max_length; `components(schema)` adds what FastAPI does not know (before the limits);
    `publish(components, config, manifest or None)` narrows the protocol's schemas to this server (after them)."""

    texts: tuple[str, ...] = ()
    long_text: tuple[str, ...] = ()
    components: Callable[[dict[str, Any]], None] | None = None
    publish: Callable[[dict[str, Any], ServeConfig, Manifest | None], None] | None = None


@dataclass(frozen=True)
class Protocol:
    """One protocol, as its module declares it. `expected(config)`: what a body its routes refuse should have
    been, said in the 400/422 message (None: the default protocol's); `raw_body`: its POST bodies may come
    without a Content-Type or as application/octet-stream (binary data), not only as JSON; `hint`: the
    inference call the 404 message points to, if any."""

    name: str
    routes: tuple[Route, ...]
    metrics_label: str = "other"
    errors: ErrorShape | None = None
    expected: Callable[[ServeConfig], str] | None = None
    openapi: OpenApi = OpenApi()
    raw_body: bool = False
    hint: str = ""


class Protocols:
    """The served protocols (registry.PROTOCOLS) and what follows from them for a request's path and method.

    A request belongs to the protocol of the route declared for its path and method (HEAD counts as GET). A
    method no route at the path takes (a 405) belongs to the protocol of the path's POST route (a path's
    inference route speaks for it: POST / is an inference route beside the page's GET /), else to the
    protocol of the path's first route. A path no route declares belongs to none."""

    def __init__(self, protocols: Sequence[Protocol], default: Protocol):
        self.all = tuple(protocols)
        self.default = default
        self._routes = [(compile_path(r.path)[0], r, p) for p in self.all for r in p.routes]
        self._found: dict[tuple[str, str], tuple[Route, Protocol] | None] = {}
        self.inference_paths = frozenset(r.path for p in self.all for r in p.routes if r.inference)
        self.open_paths = frozenset(r.path for p in self.all for r in p.routes if r.open)
        self.raw_body_paths = frozenset(r.path for p in self.all if p.raw_body for r in p.routes if r.method == "POST")
        labels = [p.metrics_label for p in self.all] + [r.label for p in self.all for r in p.routes if r.label]
        self.labels = tuple(dict.fromkeys([x for x in labels if x != "other"] + ["other"]))
        self.hint = " or ".join(p.hint for p in self.all if p.hint)

    def route_at(self, path: str, method: str) -> tuple[Route, Protocol] | None:
        """The route (and its protocol) a request at `path` (a concrete path or a route template) belongs to."""
        key = (path, method)
        if key in self._found:  # a refusal (the guard's 429 under a flood) should cost microseconds, not a scan
            return self._found[key]
        get = "GET" if method == "HEAD" else method
        here = [(r, p) for regex, r, p in self._routes if regex.match(path)]
        found = next((rp for want in (get, "POST") for rp in here if rp[0].method == want), here[0] if here else None)
        if len(self._found) < FOUND_CACHE:  # paths carry client-chosen model names: a bound all the same
            self._found[key] = found
        return found

    def at(self, path: str, method: str) -> Protocol | None:
        found = self.route_at(path, method)
        return None if found is None else found[1]

    def label(self, template: str, method: str) -> str:
        """The metrics label of a request by its route template ("other" for none)."""
        found = self.route_at(template, method)
        if found is None:
            return "other"
        route, protocol = found
        return route.label or protocol.metrics_label

    def error_shape(self, path: str, method: str) -> ErrorShape | None:
        protocol = self.at(path, method)
        return None if protocol is None else protocol.errors

    def expected(self, path: str, method: str, config: ServeConfig) -> str:
        """What a body refused at `path` should have been (the 400/422 message's second half)."""
        protocol = self.at(path, method)
        expected = (protocol.expected if protocol is not None else None) or self.default.expected
        return expected(config) if expected is not None else ""

    def refusal(self, path: str, method: str, status: int, message: str) -> bytes | None:
        """The guard's refusal (401, 413, 415, 429) at `path` in its protocol's error shape; None: qserve's."""
        shape = self.error_shape(path, method)
        if shape is None:
            return None
        return json.dumps(shape.body(shape.status(status, False), message)).encode()


def fast_routes(st: ServeState, protocols: Protocols,
                error: Callable[[Request, Exception], Awaitable[Response]]) -> FastRoute:
    """Every inference route answered straight from the guard, past FastAPI's request machinery.

    Profiled at one client (py-spy, onnx-int8), FastAPI's per-request work around the endpoint (body and
    content-type handling, dependency solving, the exception-handling layers, the response's send chain) was
    about a third of the event loop's time outside the model. The body is validated by the very model the
    route declares and answered by the function the route calls (Route.fast); `error` renders an exception as
    the app's handlers do (in the route's protocol's error shape). A body the route's fast path refuses goes on
    to the FastAPI route untouched, so every 400/422 reads exactly as before; the routes stay what OpenAPI
    shows."""
    # a path without parameters is one dict lookup; a path with them (V2's infer: the model in the path) a match
    literal: dict[tuple[str, str], Binder] = {}
    templated: list[tuple[str, re.Pattern[str], Binder]] = []
    for p in protocols.all:
        for r in p.routes:
            if r.fast is None:
                continue
            if "{" in r.path:
                templated.append((r.method, compile_path(r.path)[0], r.fast))
            else:
                literal.setdefault((r.method, r.path), r.fast)

    def bind(scope: Scope, body: bytes) -> Bound | None:
        method, path = scope["method"], scope["path"]
        binder = literal.get((method, path))
        if binder is not None:
            return binder(st, {}, scope, body)
        for want, regex, binder in templated:
            if want == method and (m := regex.match(path)) is not None:
                return binder(st, m.groupdict(), scope, body)
        return None

    async def handle(scope: Scope, body: bytes, send: Send) -> bool:
        bound = bind(scope, body)
        if bound is None:
            return False
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
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(out)).encode()), (b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": out})
        return True

    return handle


async def _no_receive() -> Message:
    return {"type": "http.disconnect"}  # a plain Response never reads; the body was consumed already
