"""Several server processes on one port: `qserve serve --workers N`, and the supervisor that runs them.

    qserve serve models/minilm-imdb-variants/torch-bf16 --device cuda --workers 8

For when one process's event loop is the bound (in front of a GPU): N spawned servers, each with its own models, on
SO_REUSEPORT sockets; /metrics and a repository load or unload reach one worker only. The supervisor forwards
each SIGINT/SIGTERM (the first starts each worker's drain, a second stops them at once) and stops all when one exits
on its own. More: docs/serving.md, On a GPU.
"""

from __future__ import annotations

import contextlib
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
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG


def supervise(workers: int, target: Callable[..., object], args_of: Callable[[int], tuple[object, ...]]) -> int:
    """Run `target(*args_of(i))` in `workers` spawned processes until they end; 0 when every one ended on the
    supervisor's signal, else the status of the first that ended on its own (the others are stopped)."""
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter each: no forked CUDA, threads or locks
    procs = [ctx.Process(target=target, args=args_of(i), name=f"qserve-worker-{i}") for i in range(workers)]
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
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
