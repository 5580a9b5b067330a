"""A shutdown under load: keep-alive and new-connection clients around one SIGTERM, every request accounted for.

    python -m benchmarks.drain_bench VARIANT --runs 20      # the suite that runs this 20 times per server kind

Lost is any request without a response except a refused connect: a reset or an early EOF counts as lost.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

KEEP_ALIVE = 32
"""Clients sending on one kept-alive connection each until the server closes it."""
FRESH = 8
"""Clients opening a new connection per request until the drain period minus 1 s after the signal, as new
connections keep arriving while an orchestrator removes the endpoint."""


def sigterm_under_load(
    url: str,
    texts: list[str],
    signal: Callable[[], None],
    wait_exit: Callable[[float], int | None],
    drain_s: float,
    keep_alive: int = KEEP_ALIVE,
    fresh: int = FRESH,
) -> dict[str, Any]:
    """Load `url` with both kinds of client, call `signal()` once each client has an answer, poll /ready until
    it says 503, then `wait_exit(timeout)` (the exit status, None if it did not exit): what every request got."""
    host, port = urlsplit(url).hostname or "127.0.0.1", urlsplit(url).port
    lock = threading.Lock()
    out = {"answered": 0, "after_signal": 0, "kept_after_signal": 0, "kept_closed": 0, "refused": 0}
    errors: list[str] = []
    lost: list[str] = []
    signalled = threading.Event()
    fresh_until = [float("inf")]
    started = [threading.Event() for _ in range(keep_alive + fresh)]

    def ask(conn: http.client.HTTPConnection, k: int, headers: dict[str, str]) -> http.client.HTTPResponse | None:
        """One request: its response, or None after counting a refused connect or a lost request."""
        body = json.dumps({"inputs": [f"{texts[k % len(texts)]} {k}"]})
        try:
            conn.request("POST", "/v1/classify", body, {"Content-Type": "application/json", **headers})
            r = conn.getresponse()
            r.read()
        except ConnectionRefusedError:
            with lock:
                out["refused"] += 1
            return None
        except (OSError, http.client.HTTPException) as e:
            with lock:
                lost.append(f"{'after' if signalled.is_set() else 'before'} the signal: {e!r}")
            return None
        with lock:
            if r.status == 200:
                out["answered"] += 1
            else:
                errors.append(str(r.status))
            if signalled.is_set():
                out["after_signal"] += 1
                if not headers:  # a keep-alive client: each answer in the drain must close its connection
                    out["kept_after_signal"] += 1
                    out["kept_closed"] += r.will_close
        started[k].set()
        return r

    def kept(k: int) -> None:
        conn = http.client.HTTPConnection(host, port, timeout=60)
        while True:
            r = ask(conn, k, {})
            if r is None or r.will_close:  # the server closed it (Connection: close), or it was lost or refused
                started[k].set()
                return

    def each_new(k: int) -> None:
        while time.monotonic() < fresh_until[0]:
            conn = http.client.HTTPConnection(host, port, timeout=60)
            if ask(conn, k, {"Connection": "close"}) is None:
                time.sleep(0.02)
            conn.close()
        started[k].set()

    threads = [threading.Thread(target=kept, args=(k,), daemon=True) for k in range(keep_alive)]
    threads += [threading.Thread(target=each_new, args=(keep_alive + k,), daemon=True) for k in range(fresh)]
    for t in threads:
        t.start()
    for e in started:
        e.wait(120)
    t0 = time.monotonic()
    fresh_until[0] = t0 + drain_s - 1.0
    signalled.set()
    signal()
    unready_ms = _until_unready(host, port, t0, drain_s)
    code = wait_exit(drain_s + 60)
    exit_s = time.monotonic() - t0
    fresh_until[0] = 0.0
    for t in threads:
        t.join(60)
    return {
        **out,
        "lost": lost,
        "error_statuses": errors,
        "unready_ms": unready_ms,
        "exit_code": code,
        "exit_s": exit_s,
    }


def _until_unready(host: str, port: int | None, t0: float, drain_s: float) -> float | None:
    """Milliseconds from the signal to /ready's first 503 (None: never seen before the drain ended)."""
    while time.monotonic() < t0 + max(drain_s - 0.5, 0.5):
        conn = http.client.HTTPConnection(host, port, timeout=10)
        try:
            conn.request("GET", "/ready")
            if conn.getresponse().status == 503:
                return (time.monotonic() - t0) * 1e3
        except (OSError, http.client.HTTPException):
            return None
        finally:
            conn.close()
        time.sleep(0.01)
    return None
