"""Several server processes on one port: `qserve serve --workers N`, and the supervisor that runs them.

    qserve serve models/minilm-imdb-variants/torch-bf16 --device cuda --workers 8

In front of a GPU the bound is one process's event loop (HTTP parsing, JSON, the answer), not the model: a torch
variant replaying CUDA graphs answers a batch in well under a millisecond. --workers N runs N whole servers, each
a spawned process with its own ServeState (its own models, batcher, inference thread and metrics; on a GPU its
own CUDA context and graphs, the device shared), each listening on its own SO_REUSEPORT socket bound to the one
port, so the kernel spreads new connections over the workers that listen. A worker listens only once its models
are loaded (its lifespan waits for them: serve/cli.py), so a connection never lands on a loading worker; until the
first one listens, the supervisor holds the port with a bound socket that does not listen.

The supervisor (this process) starts the workers, forwards SIGINT/SIGTERM to them once (they drain as one server
does), and, when one exits on its own (a failed load, a crash), stops the others and exits with its status.
Answers are the same as one server's: each worker runs the same code on the same model. /metrics, /v1/models and
the repository API answer for the worker that accepted the connection: metrics are per process, not aggregated
(each scrape carries qserve_worker_info{worker, workers, pid}; sum a counter over workers by scraping each
until every worker id was seen), and a repository load or unload reaches one worker only, so hot swaps and
--model-repository are for one worker.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
from collections.abc import Callable

from qserve import QserveError

log = logging.getLogger("qserve.serve")

WORKER_INFO = "qserve_worker_info"
"""The gauge (value 1) each worker's /metrics carries: its index, the worker count and its pid."""


def reuseport_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port) with SO_REUSEPORT, not listening: the supervisor's hold on the port, or
    a worker's own listener (uvicorn listens on it at startup, after the lifespan)."""
    if not hasattr(socket, "SO_REUSEPORT"):
        raise QserveError("--workers N > 1 needs SO_REUSEPORT (Linux) to share one port; serve one worker here")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise QserveError(f"cannot bind {host}:{port} for --workers: {e}") from None
    sock.set_inheritable(True)
    return sock


def worker_threads(workers: int, threads: int | None, cores: int) -> int | None:
    """Each worker's intra-op threads: --threads if given, else the cores shared out (one worker: the library's)."""
    if threads is not None or workers <= 1:
        return threads
    return max(1, cores // workers)


def die_with_parent() -> None:
    """Linux: this process gets SIGTERM when the supervisor dies, so a killed supervisor leaves no worker
    holding the port (best effort elsewhere)."""
    try:
        ctypes.CDLL(None).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def supervise(workers: int, target: Callable[..., object], args_of: Callable[[int], tuple[object, ...]]) -> int:
    """Run `target(*args_of(i))` in `workers` spawned processes until they end; 0 when every one ended on the
    supervisor's signal, else the status of the first that ended on its own (the others are stopped)."""
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter each: no forked CUDA, threads or locks
    procs = [ctx.Process(target=target, args=args_of(i), name=f"qserve-worker-{i}") for i in range(workers)]
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        if stopping:
            return
        stopping = True
        for p in procs:
            if p.pid is not None and p.exitcode is None:
                os.kill(p.pid, signal.SIGTERM)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    code = 0
    try:
        for p in procs:
            p.start()
        log.info("started %d workers: pids %s", workers, ", ".join(str(p.pid) for p in procs))
        alive = list(procs)
        while alive:
            ended = multiprocessing.connection.wait([p.sentinel for p in alive])
            for p in [p for p in alive if p.sentinel in ended]:
                p.join()
                alive.remove(p)
                if not stopping:
                    code = p.exitcode if p.exitcode and p.exitcode > 0 else 1  # killed by a signal: 1
                    log.error(
                        "worker %s (pid %s) exited on its own (status %s): stopping the others",
                        p.name,
                        p.pid,
                        p.exitcode,
                    )
                    stop()
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    return code
