"""The one way in for a request, HTTP or gRPC: its id, its trace, the API key, the overload gate, the body limit,
its arrival mark and its metrics: one gate for both transports.

    python -c "from qserve.serve.infra.admission import request_id; print(request_id('abc-1'), request_id('bad id'))"

Each transport takes its request (a Call) through `enter`, `admit`, `too_large`, `leave`, in that order. Every refusal
is an ApiError counted by reason (qserve_rejected_total). The key is compared in constant time, never logged or echoed.
"""

from __future__ import annotations

import hmac
import re
import time
import uuid
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from qserve.serve.infra.errors import ApiError
from qserve.serve.infra.metrics import Metrics
from qserve.serve.infra.tracing import TRACE_KEY, RequestTrace, Tracing

REQUEST_ID = re.compile(r"^[A-Za-z0-9._\-]{1,64}$")
"""A request id a client sends (X-Request-ID, gRPC metadata x-request-id) is kept when it matches; else one is made."""


def request_id(incoming: str | None) -> str:
    """The request's id: the client's when it is a plain token of at most 64 characters, else a fresh uuid4 hex."""
    return incoming if incoming and REQUEST_ID.match(incoming) else uuid.uuid4().hex


def token_ok(authorization: str | None, api_key: str) -> bool:
    if not authorization:
        return False
    scheme, _, token = authorization.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), api_key.encode())


class Arrivals:
    """Requests that bring texts, received but not yet queued (still being read, parsed or validated).

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


@dataclass(frozen=True)
class Transport:
    """How a transport carries what the admission layer asks and refuses."""

    credentials: str
    """Where a client puts the API key, as the 401 message says it."""
    challenge: Mapping[str, str] = field(default_factory=dict)
    """Headers a 401 carries."""


HTTP = Transport("the header 'Authorization: Bearer <api key>'", {"WWW-Authenticate": 'Bearer realm="qserve"'})
GRPC = Transport("the metadata 'authorization: Bearer <api key>'")


class Refusal(ApiError):
    """A request the admission layer refused, counted under `reason` (qserve_rejected_total) when it was made."""

    def __init__(self, status: int, message: str, reason: str, headers: dict[str, str] | None = None, model: str = ""):
        super().__init__(status, message, headers)
        self.reason, self.model = reason, model


@dataclass(eq=False)
class Call:
    """One request as the admission layer follows it, whatever its transport."""

    scope: MutableMapping[str, Any]
    """The request's ASGI scope (gRPC: a stand-in {"state": {...}}): its state holds the request id, the arrival
    mark, the model label of its metrics (set once a served model is resolved) and its trace."""
    route: str
    """Its metrics route: a path template (HTTP), /Service/Method (gRPC)."""
    method: str
    """The HTTP method, or GRPC."""
    request_id: str
    start: float
    trace: RequestTrace | None = None
    protocol: str = "other"
    """The metrics label of the protocol its route belongs to (qserve_protocol_requests_total)."""


class Admission:
    """The admission layer of one server (ServeState.admission): what both transports call, in the order above."""

    def __init__(
        self,
        *,
        api_key: str | None,
        max_body_bytes: int,
        metrics: Metrics,
        arrivals: Arrivals,
        tracing: Tracing | None = None,
        queue_full: Callable[[str | None], int | None] | None = None,
    ):
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics
        self.arrivals = arrivals
        self.tracing = tracing
        # queue_full(model named before the body is read, or None) -> Retry-After seconds when no text fits in that
        # queue (in every queue, when the body will name the model), else None: a flood is refused before its
        # bodies are read or parsed, so a refusal costs microseconds, not a parse.
        self.queue_full = queue_full

    def enter(
        self,
        scope: MutableMapping[str, Any],
        route: str,
        method: str,
        incoming_id: str | None,
        trace: tuple[str, Mapping[str, str], Mapping[str, Any]] | None = None,
        protocol: str = "other",
    ) -> Call:
        """The request's Call: its id (by REQUEST_ID) and, when tracing is on and `trace` = (span name, the
        carrier of the client's traceparent, attributes) is given, its trace, begun now; `protocol`: its metrics
        label."""
        rid = request_id(incoming_id)
        state = scope.setdefault("state", {})
        state["request_id"] = rid
        begun = None
        if self.tracing is not None and trace is not None:
            begun = state[TRACE_KEY] = self.tracing.begin(*trace)
        return Call(scope, route, method, rid, time.perf_counter(), begun, protocol)

    def admit(
        self,
        call: Call,
        transport: Transport,
        authorization: str | None,
        *,
        open: bool = False,
        arriving: bool = False,
        gate: bool = False,
        model: str | None = None,
    ) -> None:
        """The API key unless `open`; then, for a request that brings texts (`arriving`), the overload gate when
        `gate` (refused at once when no text fits in `model`'s queue, or in any queue when None: the transport
        can refuse before reading the body) and its arrival mark. Raises the Refusal."""
        if self.api_key and not open and not token_ok(authorization, self.api_key):
            why = "missing" if authorization is None else "invalid"
            raise self.refuse(
                401, f"{why} credentials: send {transport.credentials}", "unauthorized", dict(transport.challenge)
            )
        if not arriving:
            return
        if gate and self.queue_full is not None:
            retry_after = self.queue_full(model)
            if retry_after is not None:
                raise self.refuse(
                    429,
                    f"inference queue is full; retry after {retry_after} s",
                    "queue_full",
                    {"Retry-After": str(retry_after)},
                    model or "",
                )
        self.arrivals.begin(call.scope)

    def too_large(self) -> Refusal:
        """The refusal of a body over --max-body-bytes (HTTP: as it is read; gRPC: the serialized request)."""
        return self.refuse(
            413,
            f"request body is over the limit of {self.max_body_bytes} bytes (--max-body-bytes); "
            "send fewer or shorter texts per request",
            "body_too_large",
        )

    def refuse(
        self, status: int, message: str, reason: str, headers: dict[str, str] | None = None, model: str = ""
    ) -> Refusal:
        """A refusal before inference, counted now under `reason`; the caller raises or answers it."""
        self.metrics.reject(reason, model)
        return Refusal(status, message, reason, headers, model)

    def refused(self, call: Call, refusal: Refusal) -> None:
        """After a refusal was answered: the overload gate's cost (qserve_rejection_seconds)."""
        if refusal.reason == "queue_full":
            self.metrics.rejection.labels(refusal.model).observe(time.perf_counter() - call.start)

    def leave(self, call: Call, status: int, trace_attributes: Mapping[str, Any] | None = None) -> None:
        """The request is over: its arrival ended, its metrics (with the model the request reached) and its trace."""
        self.arrivals.end(call.scope)
        model = (call.scope.get("state") or {}).get("qserve_model") or ""
        seconds = time.perf_counter() - call.start
        self.metrics.observe_request(call.route, call.method, status, seconds, model, call.protocol)
        if call.trace is not None:
            call.trace.finish(status, trace_attributes)
