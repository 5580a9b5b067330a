"""The ASGI layer in front of every route: request id, bearer auth, content type, body size, metrics.

    curl -H "Authorization: Bearer $QSERVE_API_KEY" -H 'Content-Type: application/json' \\
         -d '{"inputs": "fine"}' 127.0.0.1:8000/v1/classify

It runs before FastAPI parses anything, so an unauthenticated caller learns
nothing about the body rules, and a huge body is refused (413) without being
parsed. Every request, refused or served, is counted by route template and status.
The token is compared in constant time and never logged or echoed.
"""

from __future__ import annotations

import hmac
import json
import re
import time
import uuid
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any

from starlette.datastructures import Headers, MutableHeaders
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

if TYPE_CHECKING:
    from qserve.serve.infra.metrics import Metrics

# The docs stay open so humans can reach them without the key; so do the probes and the page, which their
# protocols declare open (protocols/spec.py Route.open) and the app passes in as open_paths.
DOCS_PATHS = frozenset({"/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})
JSON_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_RID = re.compile(r"^[A-Za-z0-9._\-]{1,64}$")
DISCONNECTED = object()  # _read_body's answer when the client left before its body was complete


def token_ok(authorization: str | None, api_key: str) -> bool:
    if not authorization:
        return False
    scheme, _, token = authorization.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), api_key.encode())


def is_json(content_type: str | None) -> bool:
    mime = (content_type or "").split(";", 1)[0].strip().lower()
    return mime == "application/json" or (mime.startswith("application/") and mime.endswith("+json"))


def raw_body_ok(content_type: str | None) -> bool:
    """A body that may carry binary data: no Content-Type at all (tritonclient.http sends none; Triton and KServe
    read that as JSON), JSON, or application/octet-stream."""
    mime = (content_type or "").split(";", 1)[0].strip().lower()
    return not mime or is_json(mime) or mime == "application/octet-stream"


def error_body(message: str, request_id: str | None) -> bytes:
    return json.dumps({"error": message, "request_id": request_id}, separators=(",", ":")).encode()


class Arrivals:
    """Inference requests received but not yet queued (still being read, parsed or validated).

    The batcher waits for a batch to fill only while this is > 0: when every request
    the server has received is already queued, waiting could only add latency."""

    KEY = "qserve_arriving"

    def __init__(self) -> None:
        self.n = 0

    def begin(self, scope: MutableMapping[str, Any]) -> None:
        scope.setdefault("state", {})[self.KEY] = True
        self.n += 1

    def end(self, scope: MutableMapping[str, Any]) -> None:
        state = scope.get("state") or {}
        if state.pop(self.KEY, False):
            self.n -= 1


class GuardMiddleware:
    def __init__(self, app: ASGIApp, *, api_key: str | None, max_body_bytes: int, metrics: Metrics,
                 routes: Sequence[BaseRoute], arrivals: Arrivals | None = None,
                 queue_full: Callable[[str | None], int | None] | None = None,
                 inference_paths: frozenset[str] = frozenset(), metrics_public: bool = False,
                 refusal: Callable[[str, str, int, str], bytes | None] | None = None,
                 fast: Callable[[Scope, bytes, Send], Awaitable[bool]] | None = None,
                 raw_body_paths: frozenset[str] = frozenset(), open_paths: frozenset[str] = frozenset()):
        self.app = app
        # fast(scope, body, send) -> True once it answered: a route served from here once the body is read
        # (protocols/spec.py fast_routes), past the framework; False hands the request on to the app
        self.fast = fast
        self.arrivals = arrivals or Arrivals()
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics
        self.routes = routes  # the FastAPI router's routes, to label metrics by template
        # queue_full(model named by the path, or None) -> Retry-After seconds when no text fits in that queue
        # (every queue, when the body will name the model), else None: lets a flood be refused before its
        # bodies are read or parsed, so a refusal costs microseconds, not a parse.
        self.queue_full = queue_full
        # the inference routes' templates (protocols/spec.py Route.inference): refused early when the queue is
        # full; one on an open path (POST / beside the page) needs the key all the same
        self.inference_paths = inference_paths
        # POST routes whose bodies may come without a Content-Type or as application/octet-stream (binary tensor
        # data, protocols/spec.py Protocol.raw_body); every other body must be JSON
        self.raw_body_paths = raw_body_paths
        self.open_paths = DOCS_PATHS | open_paths | ({"/metrics"} if metrics_public else set())
        # refusal(path, method, status, message) -> the error body of the protocol the request is on, when it has
        # its own error shape, else None: qserve's {"error", "request_id"} (protocols/spec.py Protocols.refusal)
        self.refusal = refusal

    def _match(self, scope: Scope) -> tuple[BaseRoute | None, str, str | None]:
        """(the route this method + path reach, or None; the path template for metrics; the model the path
        names, if any). A path that exists under another method matches PARTIAL: routing then answers 405,
        so no body rule applies."""
        partial = None
        for r in self.routes:
            match, child = r.matches(scope)
            if match == Match.FULL:
                return r, getattr(r, "path", "unmatched"), (child.get("path_params") or {}).get("name")
            if match == Match.PARTIAL and partial is None:
                partial = r
        return None, getattr(partial, "path", "unmatched"), None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        incoming = headers.get("x-request-id", "")
        rid = incoming if _RID.match(incoming) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = rid
        method = scope["method"]
        start = time.perf_counter()
        status = [500]

        async def send_wrapped(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                MutableHeaders(scope=message)["X-Request-ID"] = rid
            await send(message)

        async def refuse(code: int, message: str, reason: str, extra: dict[str, str] | None = None,
                         model: str = "") -> None:
            self.metrics.reject(reason, model)
            own = self.refusal(scope["path"], method, code, message) if self.refusal is not None else None
            body = own or error_body(message, rid)
            hdrs = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            hdrs += [(k.lower().encode(), v.encode()) for k, v in (extra or {}).items()]
            await send_wrapped({"type": "http.response.start", "status": code, "headers": hdrs})
            await send_wrapped({"type": "http.response.body", "body": body})

        route, template, named = self._match(scope)
        try:
            path = scope["path"]
            # an open path is open to reading; an inference route on it (POST / beside the page) needs the key
            is_open = path in self.open_paths and not (path in self.inference_paths and method not in ("GET", "HEAD"))
            if self.api_key and not is_open and not token_ok(headers.get("authorization"),
                                                                               self.api_key):
                why = "missing" if "authorization" not in headers else "invalid"
                await refuse(401, f"{why} credentials: send the header 'Authorization: Bearer <api key>'",
                             "unauthorized", {"WWW-Authenticate": 'Bearer realm="qserve"'})
                return
            if method in JSON_BODY_METHODS and route is not None:
                if template in self.inference_paths and self.queue_full is not None:
                    retry_after = self.queue_full(named)
                    if retry_after is not None:
                        await refuse(429, "inference queue is full; retry after "
                                          f"{retry_after} s", "queue_full", {"Retry-After": str(retry_after)},
                                     named or "")
                        self.metrics.rejection.labels(named or "").observe(time.perf_counter() - start)
                        return
                self.arrivals.begin(scope)
                ctype = headers.get("content-type")
                raw = template in self.raw_body_paths
                if not (raw_body_ok(ctype) if raw else is_json(ctype)):
                    allowed = ("application/json, application/octet-stream or none (= JSON)" if raw
                               else "application/json")
                    await refuse(415, f"Content-Type must be {allowed}, got {ctype or 'none'!r}", "content_type")
                    return
                encoding = headers.get("content-encoding", "identity").strip().lower()
                if encoding not in ("", "identity"):
                    await refuse(415, f"Content-Encoding {encoding!r} is not accepted; send the body "
                                      "uncompressed (tritonclient: no request_compression_algorithm)", "content_type")
                    return
                body = await self._read_body(headers, receive)
                if body is None:
                    await refuse(413, f"request body is over the limit of {self.max_body_bytes} bytes "
                                      "(--max-body-bytes); send fewer or shorter texts per request", "body_too_large")
                    return
                if body is DISCONNECTED:
                    status[0] = 499  # nginx's "client closed request": counted, nobody to answer
                    return
                if self.fast is not None and await self.fast(scope, body, send_wrapped):
                    return
                receive = _replay(body, receive)
            await self.app(scope, receive, send_wrapped)
        finally:
            self.arrivals.end(scope)
            if scope.get("route") is not None and getattr(scope["route"], "path", None):
                template = scope["route"].path
            # The model label: set by the route once it resolved a served model (never a client's free text).
            model = (scope.get("state") or {}).get("qserve_model") or ""
            self.metrics.observe_request(template, method, status[0], time.perf_counter() - start, model)

    async def _read_body(self, headers: Headers, receive: Receive) -> Any:  # Any: bytes, None or DISCONNECTED
        """The whole body, None as soon as it is known to exceed the limit, DISCONNECTED if the client left."""
        declared = headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > self.max_body_bytes:
            return None
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return DISCONNECTED
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # later calls wait for disconnect, as the real receive would

    return replay
