"""The app factory: the serving state (core/state.py) in the lifespan, what a protocol serves beside HTTP (V2's gRPC),
and every HTTP request through the router (router.py) and its one route table, built from every protocol's routes.

    qserve serve models/minilm-imdb-variants/onnx-int8 --port 8000
    curl -s 127.0.0.1:8000/openapi.json

/health is 200 from the first moment; /ready and the inference routes answer 503 until every model is loaded and
warmed up (the lifespan loads in the background).
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from starlette.datastructures import State
from starlette.types import Receive, Scope, Send

from qserve.rundir import Served
from qserve.runtime import threadnames
from qserve.serve.core.repository import Repository
from qserve.serve.core.state import Loader, ServeState, load_model
from qserve.serve.infra.config import ServeConfig
from qserve.serve.infra.metrics import Metrics
from qserve.serve.infra.tracing import from_env as tracing_from_env
from qserve.serve.protocols import docs
from qserve.serve.protocols.registry import DEFAULT, PROTOCOLS
from qserve.serve.protocols.spec import Running
from qserve.serve.router import Router, Table

log = logging.getLogger("qserve.serve")


def create_app(
    config: ServeConfig,
    loader: Loader | None = None,
    on_load_failure: Callable[[BaseException], None] | None = None,
    selection: Served | None = None,
    repository: Repository | None = None,
) -> App:
    """Build the app. `loader(config)` returns a model (default: state.load_model, load_runtime on
    config.variant_dir); tests inject wrappers through it. `on_load_failure` lets the CLI exit when loading
    fails. `selection` says why the default model's variant was chosen, shown in /v1/models (a model dir
    says so itself). `repository` names the models and their dirs (default: config's DIR or
    --model-repository); a name clash or a --shadow naming no model raises QserveError here."""
    config = config.validate().for_device()  # the batcher sized for the device, where the flags leave it
    # every route this server answers: the document's pages, then every protocol's (protocols/registry.py)
    table = Table((docs.protocol(PROTOCOLS, config), *PROTOCOLS), default=DEFAULT)
    st = ServeState(
        config=config,
        metrics=Metrics(table.labels),
        loader=loader or load_model,
        selection=selection,
        on_load_failure=on_load_failure,
        repository=repository,
        tracing=tracing_from_env(),
    )

    @asynccontextmanager
    async def lifespan(app: App) -> AsyncIterator[None]:
        st.executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="qserve-infer", initializer=threadnames.named("qserve-infer")
        )  # its OS name: profilers see it
        st.load_task = asyncio.create_task(st.start())
        running: list[Running] = []
        try:
            for protocol in PROTOCOLS:  # what a protocol serves beside HTTP (V2's gRPC), on this loop and state
                for key, start in protocol.servers.items():
                    server = await start(st)
                    if server is not None:
                        setattr(app.state, key, server)
                        running.append(server)
            yield
        finally:
            for server in reversed(running):
                await server.stop()
            # uvicorn has already let in-flight requests finish; now drain what is still queued.
            await st.stop()
            if st.tracing is not None:
                st.tracing.shutdown()  # exports the spans still buffered
            log.info("shutdown complete")

    app = App(Router(st, table), lifespan)
    app.state.qserve = st
    return app


Lifespan = Callable[[Any], AbstractAsyncContextManager[None]]


class App:
    """The ASGI app: every HTTP request to the router; the lifespan protocol around `lifespan_context(app)`; a
    websocket refused. `state`: what the engines and tests read (state.qserve: the ServeState; state.grpc)."""

    def __init__(self, router: Router, lifespan: Lifespan):
        self.router, self.lifespan_context, self.state = router, lifespan, State()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self.router(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self.lifespan(receive, send)
        else:
            await send({"type": "websocket.close", "code": 1000})

    async def lifespan(self, receive: Receive, send: Send) -> None:
        """ASGI's lifespan protocol, as Starlette speaks it: a failure is reported with its traceback, then raised."""
        started = False
        await receive()  # lifespan.startup
        try:
            async with self.lifespan_context(self):
                await send({"type": "lifespan.startup.complete"})
                started = True
                await receive()  # lifespan.shutdown
        except BaseException:
            failed = "lifespan.shutdown.failed" if started else "lifespan.startup.failed"
            await send({"type": failed, "message": traceback.format_exc()})
            raise
        await send({"type": "lifespan.shutdown.complete"})
