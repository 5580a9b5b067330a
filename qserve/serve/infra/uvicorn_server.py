"""Run an app under a real uvicorn server: in the foreground (CLI) or a background thread (tests).

    python -c "from qserve.serve.infra.uvicorn_server import ServerThread; from qserve.serve.app import create_app; \\
from qserve.serve.infra.config import ServeConfig; \\
s = ServerThread(create_app(ServeConfig(variant_dir='V'))).start(); print(s.url); s.stop()"

Port 0 lets the OS pick a free port at bind time (no probe-then-bind race); the
bound port is read back from the listening socket.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

import uvicorn

from qserve import QserveError
from qserve.serve.infra.connections import protocol_class
from qserve.serve.infra.drain import Drain, DrainingServer

if TYPE_CHECKING:
    from starlette.types import ASGIApp


def uvicorn_config(
    app: ASGIApp, host: str, port: int, log_level: str = "info", log_config: str | dict[str, Any] | None = "default"
) -> Any:  # a uvicorn.Config (no stubs)

    kwargs: dict[str, Any] = {}
    if log_config != "default":
        kwargs["log_config"] = log_config
    st = getattr(getattr(app, "state", None), "qserve", None)
    if st is not None:  # a qserve app: its connection limits and timeouts (connections.py)
        cfg = st.config
        kwargs["http"] = protocol_class(
            header_timeout_s=cfg.header_timeout_s,
            body_timeout_s=cfg.body_timeout_s,
            max_connections=cfg.max_connections,
            metrics=st.metrics,
            load=st.http_load,
            drain=st.drain,
        )
        kwargs["timeout_keep_alive"] = cfg.keep_alive_s
    # One process, one event loop: the model lives in this process (see config.py for why).
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        lifespan="on",
        workers=1,
        timeout_graceful_shutdown=None,
        **kwargs,
    )


def server(app: ASGIApp, host: str, port: int, log_level: str = "info", log_config: Any = "default") -> DrainingServer:
    """A uvicorn server for `app` that drains at SIGTERM as its --drain-seconds say (a qserve app; others: none)."""
    st = getattr(getattr(app, "state", None), "qserve", None)
    drain, serving = (st.drain, lambda: st.started) if st is not None else (Drain(0.0), lambda: True)
    return DrainingServer(uvicorn_config(app, host, port, log_level, log_config), drain, serving)


class ServerThread:
    """A uvicorn.Server on a daemon thread; `stop()` is a graceful shutdown (in-flight work finishes)."""

    def __init__(self, app: ASGIApp, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"):
        # log_config=None: keep the host process's logging (pytest's caplog sees everything).
        self.server = server(app, host, port, log_level, log_config=None)
        self.thread = threading.Thread(target=self.server.run, name="qserve-uvicorn", daemon=True)
        self.host = host
        self.port: int | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive():
                raise QserveError(f"uvicorn exited during startup on {self.host}")
            if time.monotonic() > deadline:
                raise QserveError(f"uvicorn did not start within {timeout} s")
            time.sleep(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise QserveError(f"uvicorn did not stop within {timeout} s")

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
