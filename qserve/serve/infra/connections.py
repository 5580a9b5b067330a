"""Connection hygiene for uvicorn: header-read, body-read and keep-alive timeouts, and a connection cap.

    qserve serve VARIANT --header-timeout-s 10 --body-timeout-s 30 --keep-alive-s 5 --max-connections 512
    curl -s 127.0.0.1:8000/metrics | grep qserve_connections_closed_total

uvicorn's httptools protocol plus timers and a cap: uvicorn alone bounds no connection that never finishes its
request (slowloris). Why and how: docs/serving.md, Timeouts and connections.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sized
from typing import TYPE_CHECKING

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

if TYPE_CHECKING:
    from qserve.serve.infra.drain import Drain
    from qserve.serve.infra.metrics import Metrics


def _raw_response(status: bytes, message: str, extra: bytes = b"") -> bytes:
    body = ('{"error":"%s"}' % message).encode()
    head = b"HTTP/1.1 %s\r\ncontent-type: application/json\r\nconnection: close\r\n%scontent-length: %d\r\n\r\n"
    return head % (status, extra, len(body)) + body


class HttpLoad:
    """What the HTTP server (uvicorn's protocol below) shares of its load: the set of open
    connections and the set of request tasks in flight, both uvicorn's own. Until a server registers them
    (the Ray engine's proxy never does) nothing counts as alone."""

    def __init__(self) -> None:
        self.connections: Sized | None = None
        self.tasks: Sized | None = None

    def register(self, connections: Sized, tasks: Sized) -> None:
        self.connections, self.tasks = connections, tasks

    def busy(self) -> bool:
        """More than one HTTP request in flight (uvicorn's request tasks): a batch run now has others beside it, so
        the batcher runs it in a lane (serve/core/batcher.py). gRPC and Ray Serve requests are not counted: there
        every batch takes all the workers, as before lanes."""
        return self.tasks is not None and len(self.tasks) > 1

    def alone(self) -> bool:
        """One client connected and one request (the caller's) in flight: nobody else can be waiting to be
        read while the event loop is busy. wrk -c1 or a keep-alive client is alone; 32 connections never are,
        even between their requests."""
        return (
            self.connections is not None
            and self.tasks is not None
            and len(self.connections) <= 1
            and len(self.tasks) <= 1
        )


def protocol_class(
    *,
    header_timeout_s: float,
    body_timeout_s: float,
    max_connections: int,
    metrics: Metrics | None = None,
    load: HttpLoad | None = None,
    drain: Drain | None = None,
) -> type:
    """A uvicorn `http=` protocol class bound to these limits and this app's metrics; `load` is handed
    uvicorn's sets of open connections and request tasks (what ServeState asks before running inline)."""

    def closed(reason: str) -> None:
        if metrics is not None:
            metrics.connections_closed.labels(reason).inc()

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        _timer: asyncio.TimerHandle | None = None
        _got_bytes = False
        _last = False
        """The server is stopping: the next answer closes the connection."""

        # -- connection lifecycle -----------------------------------------------------------
        def connection_made(self, transport: asyncio.Transport) -> None:
            over = len(self.connections) >= max_connections
            super().connection_made(transport)
            if load is not None:
                load.register(self.connections, self.tasks)
            if metrics is not None:
                metrics.connections.set(len(self.connections))
            if over:
                closed("connection_limit")
                transport.write(
                    _raw_response(
                        b"503 Service Unavailable",
                        f"too many open connections (--max-connections {max_connections}); retry shortly",
                        b"retry-after: 1\r\n",
                    )
                )
                transport.close()
                return
            self._arm(header_timeout_s, self._header_timeout)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)
            if metrics is not None:
                metrics.connections.set(len(self.connections))

        def data_received(self, data: bytes) -> None:
            if data:
                self._got_bytes = True
            super().data_received(data)

        # -- request phases (httptools parser callbacks) --------------------------------------
        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self._timer is None:  # a new request on a kept-alive connection: headers timer again
                self._arm(header_timeout_s, self._header_timeout)

        def on_headers_complete(self) -> None:
            self._disarm()
            before = self.cycle
            super().on_headers_complete()
            if self.cycle is not before and (self._last or (drain is not None and drain.active)):
                self.cycle.keep_alive = False  # draining or stopping: the answer closes its connection
            if self.cycle is not None and self.cycle.more_body:
                self._arm(body_timeout_s, self._body_timeout)

        def on_message_complete(self) -> None:
            self._disarm()
            super().on_message_complete()

        def on_response_complete(self) -> None:
            if drain is not None:
                drain.answered()
            super().on_response_complete()

        def shutdown(self) -> None:
            """The server stops. A connection with no request read yet may have one on its way: not closed under it
            (its header timeout closes it), and its answer closes it. After a drain an idle kept-alive one is left to
            its keep-alive timeout alike. Otherwise uvicorn's: in progress, answered then closed; idle, closed."""
            self._last = True
            if self.cycle is None or (drain is not None and drain.active and self.cycle.response_complete):
                return
            super().shutdown()

        def timeout_keep_alive_handler(self) -> None:
            if not self.transport.is_closing():
                closed("keep_alive")
            super().timeout_keep_alive_handler()

        # -- timers ---------------------------------------------------------------------------
        def _arm(self, delay: float, callback: Callable[[], object]) -> None:
            self._disarm()
            self._timer = self.loop.call_later(delay, callback)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _header_timeout(self) -> None:
            self._timer = None
            if self.transport.is_closing():
                return
            if self.cycle is not None and not self.cycle.response_complete:
                # A pipelined request behind one still being answered: give it the full time again.
                self._arm(header_timeout_s, self._header_timeout)
                return
            if self._got_bytes:
                closed("header_timeout")
                self.transport.write(
                    _raw_response(
                        b"408 Request Timeout",
                        f"request headers not complete within {header_timeout_s} s (--header-timeout-s)",
                    )
                )
            else:
                closed("idle")
            self.transport.close()

        def _body_timeout(self) -> None:
            self._timer = None
            cycle = self.cycle
            if self.transport.is_closing() or cycle is None or not cycle.more_body:
                return
            closed("body_timeout")
            if not cycle.response_started:
                self.transport.write(
                    _raw_response(
                        b"408 Request Timeout",
                        f"request body not complete within {body_timeout_s} s (--body-timeout-s)",
                    )
                )
            # The app sees a disconnect; nothing it writes afterwards reaches the socket.
            cycle.disconnected = True
            cycle.message_event.set()
            self.transport.close()

    return GuardedHttpToolsProtocol
