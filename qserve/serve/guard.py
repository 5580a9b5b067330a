"""The HTTP front of every protocol: each request matched once in the route table and taken through the admission
layer, the inference routes answered from here once their body is read.

    curl -H "Authorization: Bearer $QSERVE_API_KEY" -H 'Content-Type: application/json' \\
         -d '{"inputs": "fine"}' 127.0.0.1:8000/v1/classify

It runs before FastAPI parses anything, so an unauthenticated caller learns nothing about the body rules, and a
huge body is refused (413) without being parsed. The steps are the admission layer's (infra/admission.py, the
same for gRPC): the request id, the request's trace (when tracing is on: every route but the probes, the docs and
/metrics, and an inference route on an open path), the API key, the early 429 when the queue is full, the arrival
mark; then what only HTTP has: the Content-Type and Content-Encoding (415), the body read up to --max-body-bytes
(413); then the fast path (protocols/spec.py fast_routes) or the app. Every request, refused or served, is
counted by route template and status; its refusals read in the error shape of the protocol its route belongs to.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from qserve.serve.infra.admission import HTTP, Admission, Refusal
from qserve.serve.protocols.spec import FastRoute, Protocols, RouteMatch, route_path

JSON_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
DISCONNECTED = object()  # _read_body's answer when the client left before its body was complete


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


class GuardMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        *,
        admission: Admission,
        protocols: Protocols,
        fast: FastRoute | None = None,
        metrics_public: bool = False,
    ):
        self.app = app
        self.admission = admission
        # the one route table (protocols/spec.py Protocols): each request's route, template and protocol
        self.protocols = protocols
        # fast(match, scope, body, send) -> True once it answered: an inference route served from here once the
        # body is read (protocols/spec.py fast_routes), past the framework; False hands the request on to the app
        self.fast = fast
        # the docs, the probes and the page stay open so humans can reach them without the key (their protocols
        # declare them open, spec.Route.open); /metrics with --metrics-public
        self.open_paths = protocols.docs | protocols.open_paths | ({"/metrics"} if metrics_public else set())
        # not traced: the open paths and /metrics, unless an inference route is there (POST / beside the page)
        self.untraced = protocols.docs | protocols.open_paths | {"/metrics"}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        method, path = scope["method"], scope["path"]
        # one match decides everything below: the route, open or not, traced or not, and the refusal's shape
        found = self.protocols.match(route_path(scope), method)
        template, inference_paths = found.template, self.protocols.inference_paths
        trace = None
        if self.admission.tracing is not None and (
            template not in self.untraced or (method == "POST" and template in inference_paths)
        ):
            carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers") or ()}
            trace = (f"{method} {path}", carrier, {"http.request.method": method, "url.path": path})
        call = self.admission.enter(scope, template, method, headers.get("x-request-id"), trace)
        rid = call.request_id
        status, traced = [500], [500]

        async def send_traced(message: Message) -> None:
            if message["type"] == "http.response.start":
                traced[0] = message["status"]
                MutableHeaders(scope=message)["X-Trace-Id"] = call.trace.trace_id  # type: ignore[union-attr]
            await send(message)

        outer = send if call.trace is None else send_traced

        async def send_wrapped(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                MutableHeaders(scope=message)["X-Request-ID"] = rid
            await outer(message)

        try:
            # an open path is open to reading; an inference route on it (POST / beside the page) needs the key
            is_open = template in self.open_paths and not (
                template in inference_paths and method not in ("GET", "HEAD")
            )
            arriving = method in JSON_BODY_METHODS and found.full
            self.admission.admit(
                call,
                HTTP,
                headers.get("authorization"),
                open=is_open,
                arriving=arriving,
                gate=template in inference_paths,
                model=found.params.get("name") if found.full else None,
            )
            if arriving:
                ctype = headers.get("content-type")
                raw = template in self.protocols.raw_body_paths
                if not (raw_body_ok(ctype) if raw else is_json(ctype)):
                    allowed = (
                        "application/json, application/octet-stream or none (= JSON)" if raw else "application/json"
                    )
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
                body = await self._read_body(headers, receive)
                if body is None:
                    raise self.admission.too_large()
                if body is DISCONNECTED:
                    status[0] = 499  # nginx's "client closed request": counted, nobody to answer
                    return
                if self.fast is not None and await self.fast(found, scope, body, send_wrapped):
                    return
                receive = _replay(body, receive)
            await self.app(scope, receive, send_wrapped)
        except Refusal as refusal:
            await self._refuse(refusal, found, rid, send_wrapped)
            self.admission.refused(call, refusal)
        finally:
            route = getattr(scope.get("route"), "path", None)  # the app's route, once it routed the request
            self.admission.leave(
                call,
                status[0],
                route,
                f"{method} {route}" if route else None,
                traced[0],
                {"http.response.status_code": traced[0], **({"http.route": route} if route else {})},
            )

    async def _refuse(self, refusal: Refusal, found: RouteMatch, rid: str, send: Send) -> None:
        """The refusal in the error shape of the protocol the request is on, else qserve's {"error", "request_id"}."""
        own = self.protocols.refusal(found, refusal.status, refusal.message)
        body = own or error_body(refusal.message, rid)
        hdrs = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        hdrs += [(k.lower().encode(), v.encode()) for k, v in refusal.headers.items()]
        await send({"type": "http.response.start", "status": refusal.status, "headers": hdrs})
        await send({"type": "http.response.body", "body": body})

    async def _read_body(self, headers: Headers, receive: Receive) -> Any:  # Any: bytes, None or DISCONNECTED
        """The whole body, None as soon as it is known to exceed the limit, DISCONNECTED if the client left."""
        limit = self.admission.max_body_bytes
        declared = headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            return None
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return DISCONNECTED
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
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
