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
from typing import Any

from starlette.datastructures import Headers, MutableHeaders
from starlette.routing import Match

# Probes and docs stay open so orchestrators and humans can reach them without the key.
OPEN_PATHS = frozenset({"/health", "/ready", "/v2/health/live", "/v2/health/ready", "/docs",
                        "/docs/oauth2-redirect", "/redoc", "/openapi.json"})
JSON_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_RID = re.compile(r"^[A-Za-z0-9._\-]{1,64}$")


def token_ok(authorization: str | None, api_key: str) -> bool:
    if not authorization:
        return False
    scheme, _, token = authorization.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), api_key.encode())


def is_json(content_type: str | None) -> bool:
    mime = (content_type or "").split(";", 1)[0].strip().lower()
    return mime == "application/json" or (mime.startswith("application/") and mime.endswith("+json"))


def error_body(message: str, request_id: str | None) -> bytes:
    return json.dumps({"error": message, "request_id": request_id}, separators=(",", ":")).encode()


class Arrivals:
    """Inference requests received but not yet queued (still being read, parsed or validated).

    The batcher waits for a batch to fill only while this is > 0: when every request
    the server has received is already queued, waiting could only add latency."""

    KEY = "qserve_arriving"

    def __init__(self) -> None:
        self.n = 0

    def begin(self, scope: dict) -> None:
        scope.setdefault("state", {})[self.KEY] = True
        self.n += 1

    def end(self, scope: dict) -> None:
        state = scope.get("state") or {}
        if state.pop(self.KEY, False):
            self.n -= 1


class GuardMiddleware:
    def __init__(self, app: Any, *, api_key: str | None, max_body_bytes: int, metrics: Any, routes: Any,
                 arrivals: Arrivals | None = None):
        self.app = app
        self.arrivals = arrivals or Arrivals()
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics
        self.routes = routes  # the FastAPI router's routes, to label metrics by template

    def _route_path(self, scope: dict) -> str:
        route = scope.get("route")
        if route is not None and getattr(route, "path", None):
            return route.path
        for r in self.routes:
            match, _ = r.matches(scope)
            if match == Match.FULL:
                return getattr(r, "path", "unmatched")
        return "unmatched"

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
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

        async def send_wrapped(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                MutableHeaders(scope=message)["X-Request-ID"] = rid
            await send(message)

        async def refuse(code: int, message: str, reason: str, extra: dict[str, str] | None = None) -> None:
            self.metrics.rejected.labels(reason).inc()
            body = error_body(message, rid)
            hdrs = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            hdrs += [(k.lower().encode(), v.encode()) for k, v in (extra or {}).items()]
            await send_wrapped({"type": "http.response.start", "status": code, "headers": hdrs})
            await send_wrapped({"type": "http.response.body", "body": body})

        try:
            path = scope["path"]
            if self.api_key and path not in OPEN_PATHS and not token_ok(headers.get("authorization"), self.api_key):
                why = "missing" if "authorization" not in headers else "invalid"
                await refuse(401, f"{why} credentials: send the header 'Authorization: Bearer <api key>'",
                             "unauthorized", {"WWW-Authenticate": 'Bearer realm="qserve"'})
                return
            if method in JSON_BODY_METHODS:
                self.arrivals.begin(scope)
                if not is_json(headers.get("content-type")):
                    await refuse(415, f"Content-Type must be application/json, got "
                                      f"{headers.get('content-type', 'none')!r}", "content_type")
                    return
                body = await self._read_body(headers, receive)
                if body is None:
                    await refuse(413, f"request body is over the limit of {self.max_body_bytes} bytes "
                                      "(--max-body-bytes); send fewer or shorter texts per request", "body_too_large")
                    return
                receive = _replay(body, receive)
            await self.app(scope, receive, send_wrapped)
        finally:
            self.arrivals.end(scope)
            self.metrics.observe_request(self._route_path(scope), method, status[0], time.perf_counter() - start)

    async def _read_body(self, headers: Headers, receive: Any) -> bytes | None:
        """The whole body, or None as soon as it is known to exceed the limit."""
        declared = headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > self.max_body_bytes:
            return None
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)


def _replay(body: bytes, receive: Any) -> Any:
    sent = False

    async def replay() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # later calls wait for disconnect, as the real receive would

    return replay
