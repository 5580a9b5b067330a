"""The drain at SIGTERM/SIGINT: readiness fails at once, answers go on for --drain-seconds, then the server exits.

    qserve serve VARIANT --drain-seconds 5     # kill -TERM PID: /ready 503 at once, answers for 5 s, exits 0
    curl -s 127.0.0.1:8000/metrics | grep qserve_drain

After the drain the listener closes once the kernel's accept queue is taken, a connection with no request yet
keeps its header timeout, in-flight requests finish; a second signal ends it at once. docs/deploy.md, Shutdown.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import uvicorn

from qserve.serve.infra.metrics import Metrics

log = logging.getLogger("qserve.serve")


@dataclass
class Drain:
    """One server's drain: when it began, what it answered and refused (counted in the metrics too)."""

    seconds: float
    metrics: Metrics | None = None
    began: float | None = None
    over: float | None = None
    """When the listener closed (the drain's end)."""
    counts: dict[str, int] = field(default_factory=lambda: {"drain": 0, "after": 0, "refused": 0, "queued": 0})
    window_us: float = 0.0
    """Microseconds from the last accept to the listener's close: a handshake completed within them is reset."""

    @property
    def active(self) -> bool:
        return self.began is not None

    def begin(self, why: str) -> None:
        self.began = time.monotonic()
        log.info(
            "%s: draining for %g s (--drain-seconds): /ready answers 503, requests are still answered, each "
            "with Connection: close; a second signal stops at once",
            why,
            self.seconds,
        )

    def due(self) -> bool:
        return self.began is not None and time.monotonic() >= self.began + self.seconds

    def count(self, what: str) -> None:
        """One request answered ("drain" or "after" the listener closed) or "refused" as the server stops."""
        self.counts[what] += 1
        if self.metrics is not None:
            self.metrics.drain.labels(what).inc()

    def answered(self) -> None:
        if self.began is not None:
            self.count("after" if self.over is not None else "drain")

    def closed(self, queued: int, window_us: float) -> None:
        self.over, self.counts["queued"], self.window_us = time.monotonic(), queued, window_us
        if self.began is None:
            return
        took = self.over - self.began
        if self.metrics is not None:
            self.metrics.drain_seconds.set(took)
        log.info(
            "drain over after %.2f s: %d answered during it; the listener closed %.0f us after its last accept, "
            "with %d queued connection(s) taken",
            took,
            self.counts["drain"],
            window_us,
            queued,
        )

    def report(self) -> None:
        if self.began is not None:
            c = self.counts
            log.info("stopped: %d answered after the drain, %d refused", c["after"], c["refused"])


class DrainingServer(uvicorn.Server):
    """uvicorn's Server with qserve's shutdown (`drain`); `serving()`: a server not yet serving skips the drain."""

    def __init__(self, config: Any, drain: Drain, serving: Callable[[], bool] = lambda: True):
        super().__init__(config)
        self.should_exit: bool = False
        self.drain, self.serving = drain, serving

    def handle_exit(self, sig: int, frame: Any) -> None:
        self._captured_signals.append(sig)  # uvicorn raises it again once stopped (a venv server ends by it)
        if self.should_exit or self.drain.active:
            self.force_exit = True  # the second signal
        elif self.drain.seconds > 0 and self.started and self.serving():
            self.drain.begin(signal.Signals(sig).name)
            return
        self.should_exit = True

    async def on_tick(self, counter: int) -> bool:
        if self.drain.due():
            self.should_exit = True
        return await super().on_tick(counter)

    async def shutdown(self, sockets: Any = None) -> None:
        if not self.force_exit:
            await self._take_backlog()
        await super().shutdown(sockets)
        self.drain.report()

    async def _take_backlog(self) -> None:
        """Close the listeners after accepting what their accept queues hold, which closing would reset."""
        taken, window = [], 0.0
        for server in self.servers:
            held = [s.dup() for s in server.sockets]  # each keeps its listener open past asyncio's close
            server.close()
            for sock in held:
                sock.setblocking(False)
                try:
                    while True:
                        taken.append(sock.accept()[0])
                except OSError:  # BlockingIOError: the queue is empty
                    t = time.perf_counter()
                sock.close()  # the listener closes here
                window = max(window, (time.perf_counter() - t) * 1e6)
        self.drain.closed(len(taken), window)
        loop = asyncio.get_running_loop()
        for conn in taken:
            conn.setblocking(False)
            await loop.connect_accepted_socket(self._protocol, conn)

    def _protocol(self) -> asyncio.Protocol:
        # as uvicorn's startup builds it
        return self.config.http_protocol_class(
            config=self.config, server_state=self.server_state, app_state=self.lifespan.state
        )
