"""The HTTP front of every route: each request matched once in the route table, taken through the admission layer,
and an inference route answered here, by the one code path that reads its body and calls its answer.

    curl -H "Authorization: Bearer $QSERVE_API_KEY" -H 'Content-Type: application/json' \\
         -d '{"inputs": "fine"}' 127.0.0.1:8000/v1/classify

It runs before FastAPI: an unauthenticated caller learns nothing of the body rules, a huge body is refused unparsed.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

from fastapi import Request, Response
from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from qserve.serve.core.state import ServeState
from qserve.serve.infra.admission import HTTP, Refusal
from qserve.serve.protocols.spec import Protocols, Respond, RouteMatch, route_path

JSON_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
Render = Callable[[Request, Exception], Awaitable[Response]]
"""An exception as the app's handlers answer it, in the error shape of the request's protocol (app.Errors)."""


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


class ClientLeft(Exception):
    """The client left before its body was complete."""


class GuardMiddleware:
    def __init__(self, app: ASGIApp, *, state: ServeState, protocols: Protocols, render: Render):
        self.app = app
        self.state = state
        self.admission = state.admission
        self.protocols = protocols  # the one route table: each request's route, template and protocol
        self.render = render
        metrics_public = state.config.metrics_public
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
                answer = found.route.answer if found.route is not None else None
                if answer is not None:
                    await self._answer(answer, found, scope, body, send_wrapped)
                    return
                receive = _replay(body, receive)
            await self.app(scope, receive, send_wrapped)
        except ClientLeft:
            status[0] = 499  # nginx's "client closed request": counted, nobody to answer
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

    async def _answer(self, answer: Respond, found: RouteMatch, scope: Scope, body: bytes, send: Send) -> None:
        """An inference route's one answer: its body read and answered by the route (spec.inference), past FastAPI's
        per-request machinery (docs/serving.md: what that saves), its errors as the app's handlers render them."""
        scope["path_params"] = dict(found.params)  # what request.path_params reads, as the router would set it
        request = Request(scope)
        try:
            out = await answer(self.state, body, request)
        except Exception as e:  # ApiError, a refused body and the unexpected, as the app's handlers answer them
            out = await self.render(request, e)
        if isinstance(out, Response):  # an error, or V2's JSON or binary tensor data
            await out(scope, _no_receive, send)
            return
        # What JSONResponse(out) sends, byte for byte (same dumps, same headers), without building one
        data = json.dumps(out, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")).encode()
        headers = [(b"content-length", str(len(data)).encode()), (b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": data})

    async def _refuse(self, refusal: Refusal, found: RouteMatch, rid: str, send: Send) -> None:
        """The refusal in the error shape of the protocol the request is on, else qserve's {"error", "request_id"}."""
        own = self.protocols.refusal(found, refusal.status, refusal.message)
        body = own or error_body(refusal.message, rid)
        hdrs = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        hdrs += [(k.lower().encode(), v.encode()) for k, v in refusal.headers.items()]
        await send({"type": "http.response.start", "status": refusal.status, "headers": hdrs})
        await send({"type": "http.response.body", "body": body})

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


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # later calls wait for disconnect, as the real receive would

    return replay


async def _no_receive() -> Message:
    return {"type": "http.disconnect"}  # a plain Response never reads; the body was consumed already
