"""The Ray Serve engine: the one app (create_app) as N replicas behind Ray's HTTP proxy.

    qserve serve models/minilm-imdb-variants/onnx-int8 --engine ray --replicas 2
    qserve deploy ray "$PWD/models/minilm-imdb-variants/onnx-int8" --out serve_config.yaml && \\
serve run serve_config.yaml

Importing it imports Ray (without the `ray` extra: QserveError naming the install command); `import qserve` never does.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

from prometheus_client import Gauge
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from qserve import QserveError
from qserve.extras import require
from qserve.rundir import Served
from qserve.serve.app import create_app
from qserve.serve.core.repository import ModelSource, Repository
from qserve.serve.core.state import ServeState
from qserve.serve.infra.config import ServeConfig, config_from_sources, settings_batch_size
from qserve.serve.infra.deploy import APP_NAME, DEPLOYMENT_NAME, Scaling, app_args, deployment_options

ray = require("ray", "the Ray engine (--engine ray)")
serve = require("ray.serve", "the Ray engine (--engine ray)")

log = logging.getLogger("qserve.serve")

REPLICA_HEADER = "X-Qserve-Replica"
DRAIN_ACTOR = ("qserve-drain", "qserve")
"""The named actor (name, namespace) `qserve serve --engine ray` tells its replicas of a shutdown's drain through."""


@ray.remote(num_cpus=0)
class DrainFlag:
    """Whether `qserve serve --engine ray` is draining: each replica asks twice a second and fails /ready once so."""

    def __init__(self) -> None:
        self.on = False

    def begin(self) -> None:
        self.on = True

    def draining(self) -> bool:
        return self.on


async def watch_drain(st: ServeState) -> None:
    """A replica's side of the drain: /ready answers 503 once the engine's DrainFlag says so (none: never)."""
    try:
        flag = ray.get_actor(DRAIN_ACTOR[0], namespace=DRAIN_ACTOR[1])
    except ValueError:  # deployed by `serve run`: Ray's own shutdown, no drain flag
        return
    while not await flag.draining.remote():
        await asyncio.sleep(0.5)
    st.drain.begin("the Ray engine's shutdown")


class ReplicaMiddleware:
    """Outermost ASGI layer of a replica's app: replica header on every response; lifespan gated on the load."""

    def __init__(self, app: ASGIApp, *, replica_id: str, state: ServeState):
        self.app = app
        self.header = (REPLICA_HEADER.lower().encode(), replica_id.encode())
        self.state = state
        self.watch: asyncio.Task | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, self._gate_startup(send))
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def stamp(message: Message) -> None:
            if message["type"] == "http.response.start":
                # Ray's proxy appends its own X-Request-ID (the same id the router used, as it forwards
                # the header to us): drop ours so clients see one header, not "id, id".
                hdrs = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"x-request-id"]
                message = {**message, "headers": hdrs + [self.header]}
            await send(message)

        await self.app(scope, receive, stamp)

    def _gate_startup(self, send: Send) -> Send:
        st = self.state

        async def gated(message: Message) -> None:
            if message["type"] == "lifespan.startup.complete":
                self.watch = asyncio.create_task(watch_drain(st))
            if message["type"] == "lifespan.startup.complete" and st.load_task is not None:
                await asyncio.shield(st.load_task)
                if st.load_error:
                    message = {
                        "type": "lifespan.startup.failed",
                        "message": f"could not load {st.config.variant_dir}: {st.load_error}",
                    }
            await send(message)

        return gated


async def ray_engine_info(replica_id: str) -> dict[str, Any]:
    """engine, replica count and each replica's state, as the Serve controller sees them now."""
    from ray.serve.context import _get_global_client
    from ray.serve.schema import ServeInstanceDetails

    ctx = serve.get_replica_context()
    info: dict[str, Any] = {"engine": "ray", "replica": replica_id, "app": ctx.app_name, "deployment": ctx.deployment}
    try:
        # The controller call is a blocking ray.get: keep it off the replica's event loop.
        details = ServeInstanceDetails(**await asyncio.to_thread(_get_global_client().get_serve_details))
        dep = details.applications[ctx.app_name].deployments[ctx.deployment]
        replicas = [
            {"id": r.replica_id, "state": str(getattr(r.state, "value", r.state)), "node_id": r.node_id, "pid": r.pid}
            for r in dep.replicas
        ]
        info.update(
            status=str(getattr(dep.status, "value", dep.status)),
            target_replicas=dep.target_num_replicas,
            replica_count=sum(r["state"] == "RUNNING" for r in replicas),
            replicas=replicas,
        )
    except Exception as e:  # noqa: BLE001 - the model summary must still answer if the controller is busy
        info.update(replica_count=None, replicas=None, replicas_error=f"{type(e).__name__}: {e}")
    return info


@serve.ingress()  # late-bound: __serve_build_asgi_app__ builds the app inside the replica
class QserveReplica:
    def __init__(
        self, settings: dict[str, Any], selection: Served | None = None, models: list[tuple[str, str]] | None = None
    ):
        # Settings from the builder args, then QSERVE_* in the replica's own environment (the API key).
        self.cfg = config_from_sources({k: v for k, v in settings.items() if v is not None})
        self.cfg.grpc_port = None  # the Ray engine serves HTTP only (QSERVE_GRPC_PORT must not bind per replica)
        self.selection = selection
        self.models = [tuple(m) for m in models] if models else None  # (name, dir): `qserve serve DIR DIR ...`
        self.replica_id = serve.get_replica_context().replica_id.unique_id

    def __serve_build_asgi_app__(self) -> ASGIApp:

        repository = None
        if self.models:
            repository = Repository([ModelSource(name, path) for name, path in self.models])
        app = create_app(self.cfg, selection=self.selection, repository=repository)
        st: ServeState = app.state.qserve
        replica_id = self.replica_id
        st.engine_info = functools.partial(ray_engine_info, replica_id)
        Gauge(
            "qserve_replica_info",
            "The replica this /metrics scrape came from (Ray engine: per-replica metrics)",
            ["engine", "replica"],
            registry=st.metrics.registry,
        ).labels("ray", replica_id).set(1)
        return ReplicaMiddleware(app, replica_id=replica_id, state=st)


def logging_config(log_level: str) -> dict[str, Any]:
    """Ray's logging for --log-level: an access-log line per request only at info/debug, as uvicorn does
    (on two cores that line is a measurable share of a request's CPU)."""
    return {"log_level": log_level.upper(), "enable_access_log": log_level.lower() in ("debug", "info")}


def application(
    settings: dict[str, Any],
    scaling: Scaling,
    cores: int | None = None,
    log_level: str | None = None,
    selection: Served | None = None,
    models: list[tuple[str, str]] | None = None,
) -> Any:  # a ray.serve Application (no stubs)
    """The bound Ray Serve application for these ServeConfig settings and this scaling; `selection` (why the
    default model's variant was chosen) and `models` ((name, dir) of each model) travel to every replica."""
    mbs = settings_batch_size(settings)
    opts = deployment_options(scaling, mbs, cores)
    if log_level:
        opts["logging_config"] = logging_config(log_level)
    # A replica that cannot load will not load on retry #20 either: fail the deploy quickly.
    return (
        serve.deployment(QserveReplica, max_constructor_retry_count=3).options(**opts).bind(settings, selection, models)
    )


def build_app(args: dict[str, Any]) -> Any:  # a ray.serve Application (no stubs)
    """Ray Serve application builder (the config's import_path): args = the ServeConfig fields to set.

    Deployment options in the config file's `deployments:` entry override the defaults set here."""
    args = dict(args or {})
    if not args.get("variant_dir") and not args.get("model_repository"):
        raise QserveError(
            "args.variant_dir is missing: the absolute variant path every node can read (or "
            "args.model_repository: a directory of models every node can read)"
        )
    ServeConfig(**args).validate()  # unknown keys or bad values fail the deploy with the flag's message
    threads = args.get("threads")
    return application(args, Scaling(1, num_cpus=float(threads) if threads else None))


def recorded_cluster() -> str | None:
    """The cluster a plain ray.init() would join instead of starting one: RAY_ADDRESS, or the address
    `ray start` records in Ray's temp dir (still there after that cluster crashed)."""
    if os.environ.get("RAY_ADDRESS"):
        return os.environ["RAY_ADDRESS"]
    try:
        from ray._private.utils import read_ray_address  # Ray's own lookup (Ray is pinned: see deploy.py)

        return read_ray_address()
    except Exception:  # noqa: BLE001 - only feeds a log line
        return None


def run_ray(
    cfg: ServeConfig,
    scaling: Scaling,
    address: str | None,
    log_level: str = "info",
    selection: Served | None = None,
    repository: Repository | None = None,
) -> int:
    """`qserve serve --engine ray`: start (or join) Ray, run the app on --host/--port, wait for a signal.

    Without --ray-address this always starts a local instance, even where `ray start` left a cluster
    (running, or its stale address file after a crash) that a plain ray.init() would try to join."""
    local = address is None
    cores = os.cpu_count() or 1
    threads = cfg.threads or scaling.threads_per_replica(cores if local else None)
    settings = app_args(cfg.variant_dir, {**vars(cfg), "threads": threads})
    if cfg.model_repository:
        settings.pop("variant_dir")  # the replicas read the repository: ROOT's subdirectories
        settings["model_repository"] = str(Path(cfg.model_repository).resolve())
    if cfg.shadow:  # replicas may run in another working directory
        settings["shadow"] = [f"{n}={Path(d).resolve()}" for n, _, d in (e.partition("=") for e in cfg.shadow)]
    # DIRs: the names fixed here (a clash was refused) travel as data; --model-repository: replicas scan ROOT.
    models = (
        None
        if repository is None or repository.root is not None
        else [(s.name, str(Path(s.path).resolve())) for s in repository.initial]
    )
    if cfg.api_key:  # through the actor's init args, never into a config file
        settings["api_key"] = cfg.api_key
    need = scaling.cpus_per_replica(cores) * (scaling.replicas or scaling.min_replicas or 1)
    if local and need > cores:
        raise QserveError(
            f"{scaling.replicas or scaling.min_replicas} replica(s) x {scaling.cpus_per_replica(cores)}"
            f" CPUs (--threads) = {need:g} CPUs, but this machine has {cores}; lower --threads or "
            "--replicas (Ray would otherwise wait forever for CPUs)"
        )
    port = cfg.port or _free_port(cfg.host)
    if local:
        found = recorded_cluster()
        if found:
            log.warning(
                "Ray records a cluster at %s (from `ray start` or RAY_ADDRESS; it may have stopped since); "
                "starting a separate local Ray instance, as without --ray-address. To serve on that "
                "cluster instead, pass --ray-address %s",
                found,
                found,
            )
        # address="local": a new instance, never the recorded cluster (which would also refuse num_cpus).
        ray.init(address="local", num_cpus=cores, include_dashboard=False, logging_level=log_level.upper())
    else:
        ray.init(address=address, logging_level=log_level.upper())
    signals: list[int] = []
    stop = threading.Event()

    def on_signal(sig: int, _: Any) -> None:
        signals.append(sig)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    flag = DrainFlag.options(name=DRAIN_ACTOR[0], namespace=DRAIN_ACTOR[1]).remote()  # type: ignore[attr-defined]
    try:
        serve.start(http_options={"host": cfg.host, "port": port}, logging_config=logging_config(log_level))
        t0 = time.perf_counter()
        try:
            serve.run(
                application(settings, scaling, cores if local else None, log_level, selection, models),
                name=APP_NAME,
                route_prefix="/",
            )
        except Exception as e:  # noqa: BLE001 - Ray's deploy failure carries the replica's load error
            print(f"qserve serve: error: Ray could not start {cfg.variant_dir}: {e}", flush=True)
            return 2
        log.info(
            "Ray engine: %s replica(s) of %s ready in %.1f s on http://%s:%d (Ray %s%s)",
            scaling.replicas or f"{scaling.min_replicas}..{scaling.max_replicas}",
            cfg.variant_dir,
            time.perf_counter() - t0,
            cfg.host,
            port,
            ray.__version__,
            ", local instance" if local else f", cluster {address}",
        )
        while not stop.wait(1.0):  # a timed wait keeps the main thread responsive to signals
            pass
        if cfg.drain_seconds > 0:  # the replicas fail /ready; Ray's proxy answers on until a second signal
            ray.get(flag.begin.remote())
            why = signal.Signals(signals[0]).name
            log.info("%s: draining for %g s (--drain-seconds): /ready answers 503", why, cfg.drain_seconds)
            deadline = time.monotonic() + cfg.drain_seconds
            while len(signals) < 2 and time.monotonic() < deadline:
                time.sleep(0.1)
        return 0
    finally:
        try:
            serve.delete(APP_NAME)
            if local:
                serve.shutdown()
        finally:
            ray.shutdown()


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


__all__ = ["DEPLOYMENT_NAME", "QserveReplica", "REPLICA_HEADER", "application", "build_app", "run_ray"]
