"""`qserve serve` and `qserve loadtest`; every serve setting is a flag and a QSERVE_<FLAG> env var (the flag wins).

    qserve serve models/minilm-imdb-variants/onnx-int8 --max-batch-size 32 --max-wait-ms 5
    qserve serve int8=models/m/variants/onnx-int8 fp32=models/m/variants/torch-fp32   # two models, by name
    qserve serve --model-repository models/repo --shadow int8=models/m/variants/onnx-fp32
    qserve serve models/m/variants/torch-bf16 --device cuda --workers 8      # 8 server processes, one port, one GPU
    qserve loadtest http://127.0.0.1:8000 --concurrency 1,8,32,64 --duration 10

Prefer QSERVE_API_KEY to --api-key: a command line is visible to other local users.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import uvicorn
from prometheus_client import Gauge

from qserve import QserveError
from qserve.configflags import ENV_PREFIX, add_flags, config_values, field_docs, flag, option_name
from qserve.devices import usable_cores
from qserve.files import write_json_atomic
from qserve.loadtest import format_report, read_texts_file, run_loadtest
from qserve.modeling import skip_unused_imports
from qserve.serve.app import create_app
from qserve.serve.core.repository import Repository, sources_from_dirs, sources_from_root
from qserve.serve.infra.config import ServeConfig, config_from_sources
from qserve.serve.infra.deploy import RayOptions, Scaling
from qserve.serve.infra.uvicorn_server import server
from qserve.serve.infra.workers import WORKER_INFO, die_with_parent, reuseport_socket, supervise, worker_threads

log = logging.getLogger("qserve.serve")


ENGINES = ("uvicorn", "ray")
LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclass
class ServeCommand:
    """How `qserve serve` runs the app: not app settings, so flags only (no env var)."""

    engine: str = field(default="uvicorn", metadata=flag(choices=ENGINES))
    """uvicorn: one process (--workers N: N processes on one port). ray: Ray Serve replicas of the same app
    behind Ray's HTTP proxy on --host/--port (needs the qserve[ray] extra)."""
    log_level: str = field(default="info", metadata=flag(choices=LOG_LEVELS))
    """Server log level; at info and debug every request gets an access-log line."""
    workers: int = 1
    """--engine uvicorn: server processes sharing the port (SO_REUSEPORT), each with its own model on the same
    device and its own /metrics (qserve_worker_info names it); each listens once loaded. For when one process's
    event loop is the bound (in front of a GPU). Their --threads default to the cores shared out; hot swaps and
    --model-repository need one worker (serve/infra/workers.py)."""


MAX_WORKERS = 64


def _add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="serve one or several variants over HTTP with dynamic batching",
        description="Serve variants with FastAPI + uvicorn: POST /v1/classify (HF pipeline format), "
        "the KServe V2 protocol under /v2 (with the model repository extension: load, hot swap, "
        "unload), /health, /ready, /metrics, /docs. One process, one inference thread (--workers N: N such "
        "processes on one port); throughput comes from dynamic batching and the backend's intra-op "
        "threads (--threads). "
        "Every setting can also come from its env var (QSERVE_<FLAG>, named in its help); a flag "
        "given on the command line wins.",
    )
    # DIR [DIR...]: the one positional that takes several values (QSERVE_VARIANT_DIR holds one).
    p.add_argument(
        "variant_dir",
        nargs="*",
        default=None,
        metavar="DIR",
        help=field_docs(ServeConfig)["variant_dir"].replace("%", "%%") + f" (env {ENV_PREFIX}VARIANT_DIR)",
    )
    # unset: a flag not given parses to None, so its env var (then the default) decides
    add_flags(
        p,
        ServeConfig,
        [f.name for f in fields(ServeConfig) if f.name != "variant_dir"],
        unset=True,
        env_prefix=ENV_PREFIX,
    )
    add_flags(p, ServeCommand, ("log_level", "workers"))
    ray = p.add_argument_group("engine", "How the app runs; the flags after --engine apply to --engine ray only.")
    add_flags(ray, ServeCommand, ("engine",))
    add_flags(ray, RayOptions, unset=True)  # unset: given only with --engine ray
    p.set_defaults(func=run_serve)


def _add_loadtest(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "loadtest",
        help="load-test a local qserve server and check every answer",
        description="Send /v1/classify requests from N concurrent clients for a fixed time per level; report "
        "p50/p99 latency, throughput, errors, lost requests and label mismatches against a "
        "sequential first pass (or a csv of text,label). Loopback targets only.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("url", help="server base URL, e.g. http://127.0.0.1:8000 (loopback only)")
    p.add_argument("--concurrency", default="1,8,32,64", help="comma-separated client counts, each 1..1024")
    p.add_argument("--duration", type=float, default=10.0, help="seconds per concurrency level (max 600)")
    p.add_argument("--max-requests", type=int, default=100_000, help="request cap per level")
    p.add_argument(
        "--texts",
        help="csv with header text[,label] (label = expected), or one text per line; "
        "default: 96 built-in review sentences",
    )
    p.add_argument("--api-key", default=None, help="bearer token (default: env QSERVE_API_KEY)")
    p.add_argument("--timeout", type=float, default=30.0, help="per-request timeout in seconds")
    p.add_argument("--json", dest="json_out", help="also write the report as JSON here")
    p.set_defaults(func=run_loadtest_cmd)


def register(subparsers: argparse._SubParsersAction) -> None:
    _add_serve(subparsers)
    _add_loadtest(subparsers)


def run_serve(args: argparse.Namespace) -> int:
    dirs = list(args.variant_dir or [])
    args.variant_dir = dirs[0] if dirs else None  # none given: QSERVE_VARIANT_DIR decides
    cfg = config_from_sources(args)
    if cfg.model_repository:
        repository = Repository(sources_from_root(cfg.model_repository), cfg.model_repository)
    else:
        # Names are fixed here, reading manifests only: a clash is refused before anything loads.
        repository = Repository(
            sources_from_dirs(dirs or ([cfg.variant_dir] if cfg.variant_dir else []), cfg.model_name)
        )
        cfg.variant_dir = repository.initial[0].path
    for source in repository.initial:
        log.info("model %s: %s", source.name, source.path)
    if cfg.host not in ("127.0.0.1", "localhost", "::1") and not cfg.api_key:
        log.warning("binding %s without an API key: anyone who can reach this port can use the model", cfg.host)

    check_workers(cfg, args.workers, args.engine)
    if args.engine == "ray":
        if cfg.grpc_port is not None:
            raise QserveError(
                "--grpc-port (or QSERVE_GRPC_PORT) applies to --engine uvicorn only: the Ray engine "
                "serves HTTP (/v1 and the V2 REST API); unset it, or serve gRPC with --engine uvicorn"
            )
        scaling = Scaling.parse(args.replicas, args.min_replicas, args.max_replicas, cfg.threads)
        from qserve.serve.ray_engine import run_ray  # imports Ray; a clear error names the extra if missing

        return run_ray(cfg, scaling, args.ray_address, args.log_level, repository=repository)
    given = [option_name(RayOptions, name) for name in config_values(RayOptions, args)]
    if given:
        raise QserveError(f"{', '.join(given)} only apply with --engine ray (this is --engine {args.engine})")
    if args.workers > 1:
        return run_workers(cfg, repository, args.workers, args.log_level)

    failed: list[BaseException] = []
    running: uvicorn.Server | None = None

    def on_load_failure(exc: BaseException) -> None:
        failed.append(exc)
        if running is not None:
            running.should_exit = True

    app = create_app(cfg, on_load_failure=on_load_failure, repository=repository)
    running = server(app, cfg.host, cfg.port, args.log_level)
    running.run()
    if failed:
        what = cfg.model_repository or ", ".join(s.path for s in repository.initial)
        print(f"qserve serve: error: could not load {what}: {failed[0]}", file=sys.stderr)
        return 2
    return 0


def check_workers(cfg: ServeConfig, workers: int, engine: str) -> None:
    """--workers: 1..MAX_WORKERS, the uvicorn engine, and none of what one worker alone can serve."""
    if not 1 <= workers <= MAX_WORKERS:
        raise QserveError(f"--workers must be 1..{MAX_WORKERS} (got {workers})")
    if workers == 1:
        return
    if engine != "uvicorn":
        raise QserveError("--workers applies to --engine uvicorn; the Ray engine scales with --replicas")
    if cfg.grpc_port is not None:
        raise QserveError("--grpc-port (or QSERVE_GRPC_PORT) needs one worker: unset it, or serve --workers 1")
    if cfg.model_repository:
        raise QserveError(
            "--model-repository needs one worker (a repository load or unload would reach one "
            "worker only): serve DIRs with --workers, or the repository with --workers 1"
        )


def run_workers(cfg: ServeConfig, repository: Repository, workers: int, log_level: str) -> int:
    """`qserve serve --workers N`: hold the port, start N workers (serve_worker) and supervise them."""
    cfg.threads = worker_threads(workers, cfg.threads, usable_cores())
    hold = reuseport_socket(cfg.host, cfg.port)  # port 0: the OS picks it here, once, for every worker
    port = int(hold.getsockname()[1])
    log.info(
        "serving on http://%s:%d with %d workers (%s intra-op threads each)",
        cfg.host,
        port,
        workers,
        cfg.threads or "the library's",
    )
    try:
        return supervise(workers, serve_worker, lambda i: (cfg, repository, log_level, i, workers, port))
    finally:
        hold.close()


def serve_worker(cfg: ServeConfig, repository: Repository, log_level: str, index: int, workers: int, port: int) -> None:
    """One of --workers N, in its own spawned process: the one-process server on its own SO_REUSEPORT socket,
    listening once its models are loaded; exits 2 when they cannot load."""
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s %(levelname)s %(name)s [worker {index}]: %(message)s")
    die_with_parent()
    skip_unused_imports()

    sock = reuseport_socket(cfg.host, port)
    failed: list[BaseException] = []
    app = create_app(cfg, on_load_failure=failed.append, repository=repository)
    st = app.state.qserve
    Gauge(
        WORKER_INFO,
        "The worker this /metrics scrape came from (qserve serve --workers: metrics per process)",
        ["worker", "workers", "pid"],
        registry=st.metrics.registry,
    ).labels(str(index), str(workers), str(os.getpid())).set(1)

    async def engine_info() -> dict[str, Any]:
        return {"engine": "uvicorn", "replica_count": 1, "workers": workers, "worker": index, "pid": os.getpid()}

    st.engine_info = engine_info
    app.lifespan_context = listen_once_loaded(app.lifespan_context)
    running = server(app, cfg.host, port, log_level)
    # uvicorn re-raises the signal that stopped it once it has drained: end this worker as a normal exit (its
    # libraries' finalizers run), not by the signal's default action.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: sys.exit(0))
    try:
        running.run(sockets=[sock])
    except SystemExit:  # uvicorn's startup failure: the lifespan raised because the models did not load
        if not failed:
            raise
    if failed:
        what = cfg.model_repository or ", ".join(s.path for s in repository.initial)
        print(f"qserve serve: error: worker {index} could not load {what}: {failed[0]}", file=sys.stderr)
        sys.exit(2)


def listen_once_loaded(
    lifespan: Callable[[Any], AbstractAsyncContextManager[Any]],
) -> Callable[[Any], AbstractAsyncContextManager[Any]]:
    """The app's lifespan, finished only once its models are loaded: uvicorn listens after the lifespan's startup,
    so a worker takes connections only when it can answer them (a failed load fails the startup)."""

    @asynccontextmanager
    async def loaded(app: Any) -> AsyncIterator[Any]:
        async with lifespan(app) as state:
            st = app.state.qserve
            if st.load_task is not None:
                await st.load_task
            if st.load_error:
                raise QserveError(f"the models did not load: {st.load_error}")
            yield state

    return loaded


def run_loadtest_cmd(args: argparse.Namespace) -> int:
    try:
        levels = [int(x) for x in args.concurrency.split(",") if x.strip()]
    except ValueError:
        raise QserveError(
            f"--concurrency {args.concurrency!r}: expected comma-separated integers, e.g. 1,8,32"
        ) from None
    logging.getLogger("httpx2").setLevel(logging.WARNING)  # one INFO line per request would drown the report
    texts, labels = read_texts_file(args.texts) if args.texts else (None, None)
    report = run_loadtest(
        args.url,
        levels,
        args.duration,
        texts=texts,
        labels=labels,
        max_requests=args.max_requests,
        api_key=args.api_key or os.environ.get("QSERVE_API_KEY"),
        timeout_s=args.timeout,
    )
    print(format_report(report))
    if args.json_out:
        write_json_atomic(Path(args.json_out), report)
    bad = sum(lv["errors"] + lv["lost"] + lv["mismatched"] for lv in report["levels"])
    return 1 if bad else 0
