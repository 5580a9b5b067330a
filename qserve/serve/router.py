"""The one router: every HTTP request looked up once in the route table, taken through the admission layer and
answered by its route, or refused (401, 413, 415, 429, 404, 405, a body's 400/422) in its protocol's error shape.

    curl -H "Authorization: Bearer $QSERVE_API_KEY" -H 'Content-Type: application/json' \\
         -d '{"inputs": "fine"}' 127.0.0.1:8000/v1/classify

The key is checked before the body is read and a huge body is refused unread; metrics and traces name the template.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from starlette._utils import get_route_path
from starlette.datastructures import Headers, MutableHeaders
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import compile_path
from starlette.types import Message, Receive, Scope, Send

from qserve.serve.core.state import ServeState
from qserve.serve.core.texts import unicode_problem
from qserve.serve.infra.admission import HTTP, Call, Refusal
from qserve.serve.infra.config import ServeConfig
from qserve.serve.infra.errors import ApiError
from qserve.serve.protocols.spec import ProtocolSpec, Route

log = logging.getLogger("qserve.serve")
JSON_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
FOUND_CACHE = 4096
"""(path, method) pairs whose match the table keeps; more than this are looked up each time."""


def is_json(content_type: str | None) -> bool:
    mime = (content_type or "").split(";", 1)[0].strip().lower()
    return mime == "application/json" or (mime.startswith("application/") and mime.endswith("+json"))


def raw_body_ok(content_type: str | None) -> bool:
    """A body that may carry binary data: no Content-Type at all (tritonclient.http sends none; Triton and KServe
    read that as JSON), JSON, or application/octet-stream."""
    mime = (content_type or "").split(";", 1)[0].strip().lower()
    return not mime or is_json(mime) or mime == "application/octet-stream"


class ClientLeft(Exception):
    """The client left before its body was complete."""


@dataclass(frozen=True)
class RouteMatch:
    """A request's place in the table: the `route` its method and path reach (None: none), the `template` it reached
    ("unmatched": no path), the path's `params`, and the `protocol` it belongs to (for a 405: the path's GET route
    for HEAD, else its POST route, else its first) with its metrics `label`."""

    template: str
    route: Route | None = None
    params: Mapping[str, str] = field(default_factory=dict)
    protocol: ProtocolSpec | None = None
    label: str = "other"


UNMATCHED = RouteMatch("unmatched")


class Table:
    """The route table: every protocol's routes in order, read through one lookup, `match(path, method)`.
    `default`: the protocol whose form a refused body is told when its own protocol says nothing."""

    def __init__(self, protocols: Sequence[ProtocolSpec], default: ProtocolSpec):
        self.all, self.default = tuple(protocols), default
        self.routes = [(compile_path(r.path)[0], r, p) for p in self.all for r in p.routes]
        self._found: dict[tuple[str, str], RouteMatch] = {}
        self.inference_paths = frozenset(r.path for _, r, _ in self.routes if r.inference)
        self.open_paths = frozenset(r.path for _, r, _ in self.routes if r.open)
        labels = [p.metrics_label for p in self.all] + [r.label for _, r, _ in self.routes if r.label]
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
        here = [(m, r, p) for regex, r, p in self.routes if (m := regex.match(path)) is not None]
        for m, r, p in here:
            if r.method == method:
                return RouteMatch(r.path, r, m.groupdict(), p, r.label or p.metrics_label)
        if not here:
            return UNMATCHED
        get = "GET" if method == "HEAD" else method
        _, owner, p = next((x for want in (get, "POST") for x in here if x[1].method == want), here[0])
        return RouteMatch(here[0][1].path, protocol=p, label=owner.label or p.metrics_label)

    def allowed(self, template: str) -> list[str]:
        """The methods the routes at `template` take (a 405's Allow), sorted."""
        return sorted({r.method for _, r, _ in self.routes if r.path == template})

    def expected(self, found: RouteMatch, config: ServeConfig) -> str:
        """What a body refused on the matched route should have been (the 400/422 message's second half)."""
        expected = (found.protocol.expected if found.protocol is not None else None) or self.default.expected
        return expected(config) if expected is not None else ""


class Router:
    """The ASGI app's HTTP side: each request's one lookup, its admission, its body, its answer and its metrics."""

    def __init__(self, state: ServeState, table: Table):
        self.state, self.table, self.admission = state, table, state.admission
        # the docs, the probes and the page are open so humans reach them without the key (their routes say so,
        # spec.Route.open); /metrics with --metrics-public. Not traced: the open paths and /metrics.
        self.untraced = table.open_paths | {"/metrics"}
        self.open_paths = table.open_paths | ({"/metrics"} if state.config.metrics_public else set())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = Headers(scope=scope)
        method, path = scope["method"], scope["path"]
        found = self.table.match(get_route_path(scope), method)  # the one lookup: everything below reads it
        template, inference = found.template, found.template in self.table.inference_paths
        trace = None
        if self.admission.tracing is not None and (template not in self.untraced or (inference and method == "POST")):
            carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers") or ()}
            attributes = {"http.request.method": method, "url.path": path}
            if found.route is not None:
                attributes["http.route"] = template
            trace = (f"{method} {template if found.route else path}", carrier, attributes)
        call = self.admission.enter(scope, template, method, headers.get("x-request-id"), trace, found.label)
        status = [500]

        async def send_wrapped(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                added = MutableHeaders(scope=message)
                added["X-Request-ID"] = call.request_id
                if call.trace is not None:
                    added["X-Trace-Id"] = call.trace.trace_id
            await send(message)

        request = Request(scope, receive)
        refused = None
        try:
            try:
                out = await self._answer(found, call, headers, request)
            except ClientLeft:
                status[0] = 499  # nginx's "client closed request": counted, nobody to answer
                return
            except Exception as e:  # a refusal, ApiError, a refused body and the unexpected, in the protocol's shape
                refused = e if isinstance(e, Refusal) else None
                out = self._error(found, request, e)
            await _respond(out, found.route is not None and not found.route.inference, scope, receive, send_wrapped)
            if refused is not None:
                self.admission.refused(call, refused)
        finally:
            self.admission.leave(call, status[0], {"http.response.status_code": status[0]})

    async def _answer(self, found: RouteMatch, call: Call, headers: Headers, request: Request) -> object:
        """The route's answer: the admission layer's word first (the key, the overload gate), then a 404/405, then
        the body (its Content-Type, its size), read by the route's Body, and the route's answer."""
        route, template, method = found.route, found.template, request.method
        # an open path is open to reading; an inference route on it (POST / beside the page) needs the key
        is_open = template in self.open_paths and not (
            template in self.table.inference_paths and method not in ("GET", "HEAD")
        )
        arriving = method in JSON_BODY_METHODS and route is not None
        self.admission.admit(
            call,
            HTTP,
            headers.get("authorization"),
            open=is_open,
            arriving=arriving,
            gate=route is not None and route.inference,
            model=found.params.get("name"),
        )
        if route is None:
            where = request.url.path
            if found.protocol is None:
                raise ApiError(404, f"no route {where}; see /docs. Inference: {self.table.hint}")
            allow = {"Allow": ", ".join(self.table.allowed(template))}
            raise ApiError(405, f"method {method} not allowed on {where}; see /docs", allow)
        request.scope["path_params"] = found.params  # what request.path_params reads
        data = b""
        if arriving:
            ctype = headers.get("content-type")
            raw = found.protocol is not None and found.protocol.raw_body
            if not (raw_body_ok(ctype) if raw else is_json(ctype)):
                allowed = "application/json, application/octet-stream or none (= JSON)" if raw else "application/json"
                raise self.admission.refuse(
                    415, f"Content-Type must be {allowed}, got {ctype or 'none'!r}", "content_type"
                )
            encoding = headers.get("content-encoding", "identity").strip().lower()
            if encoding not in ("", "identity"):
                raise self.admission.refuse(
                    415,
                    f"Content-Encoding {encoding!r} is not accepted; send the body "
                    "uncompressed (tritonclient: no request_compression_algorithm)",
                    "content_type",
                )
            data = await self._read_body(headers, request.receive)
        body = data if route.body is None else route.body.parse(self.state, data, request)
        return await route.answer(self.state, body, request)

    def _error(self, found: RouteMatch, request: Request, exc: Exception) -> Response:
        """An exception as its answer, in the error shape of the protocol the request is on (qserve's {"error",
        "request_id"} unless the protocol declares its own)."""
        rid = request.state.request_id
        status, headers, validation = 500, None, False
        if isinstance(exc, RequestValidationError):
            status, message, validation = *self._invalid(found, exc), True
        elif isinstance(exc, ApiError):
            status, message, headers = exc.status, exc.message, exc.headers
            validation = getattr(exc, "body_error", False)
        else:
            log.exception("request %s: unhandled error", rid, exc_info=exc)
            message = f"internal error; quote request id {rid}"
        # A message may quote client input (a field name, say) holding a lone surrogate: escape it, so rendering
        # the error can never fail.
        message = message.encode("utf-8", "backslashreplace").decode("utf-8")
        shape = found.protocol.errors if found.protocol is not None else None
        if shape is None:
            return JSONResponse({"error": message, "request_id": rid}, status_code=status, headers=headers)
        code = shape.status(status, validation)
        # the admission layer's refusal keeps its status; its body says what the protocol calls it
        return JSONResponse(shape.body(code, message), status if isinstance(exc, Refusal) else code, headers)

    def _invalid(self, found: RouteMatch, exc: RequestValidationError) -> tuple[int, str]:
        """A body that did not parse, in the protocol's own words for what it reads."""
        allowed = self.table.expected(found, self.state.config)
        errs = exc.errors()
        bad_json = [e for e in errs if e.get("type") == "json_invalid"]
        if bad_json:
            detail = bad_json[0].get("ctx", {}).get("error", "JSON decode error")
            return 400, f"malformed JSON body ({detail}); {allowed}"
        for e in errs:  # pydantic says only "not a valid string" for a lone surrogate: say why
            value = e.get("input")
            if isinstance(value, str) and unicode_problem(value):
                return 422, f"{_loc(e)} {unicode_problem(value)}"
        parts = [f"{'.'.join(str(p) for p in e.get('loc', ())[1:]) or 'body'}: {e.get('msg')}" for e in errs[:4]]
        return 422, f"invalid request: {'; '.join(parts)}; {allowed}"

    async def _read_body(self, headers: Headers, receive: Receive) -> bytes:
        """The whole body; refused (413) as soon as it is known to exceed the limit; ClientLeft if the client left."""
        limit = self.admission.max_body_bytes
        declared = headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            raise self.admission.too_large()
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientLeft
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise self.admission.too_large()
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)


async def _respond(out: object, encode: bool, scope: Scope, receive: Receive, send: Send) -> None:
    """The answer sent: a Response as it is, else its JSON; `encode`: through jsonable_encoder first (a model, a
    date: what an answer other than an inference route's may hold)."""
    if isinstance(out, Response):
        await out(scope, receive, send)
        return
    # What JSONResponse(out) sends, byte for byte (same dumps, same headers), without building one
    value = jsonable_encoder(out) if encode else out
    data = json.dumps(value, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")).encode()
    headers = [(b"content-length", str(len(data)).encode()), (b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": data})


def _loc(error: Mapping) -> str:
    """pydantic's loc as the client wrote it: ("body", "inputs", "list[str]", 1) -> inputs[1]."""
    out = ""
    for p in error.get("loc", ())[1:]:
        if isinstance(p, int):
            out += f"[{p}]"
        elif "[" not in p and "-" not in p:  # skip union-member tags such as constrained-str
            out += f".{p}" if out else p
    return out or "body"
