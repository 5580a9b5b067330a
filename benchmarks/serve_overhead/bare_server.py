"""The floor of serving on this machine: a bare HTTP server that answers with the model inline and nothing else.

    python -m benchmarks.serve_overhead models/minilm-l6-distilbert-imdb/variants/onnx-int8 --rounds 1 --duration 5

benchmarks.serve_overhead runs floor() once per variant and round: this module as a child process (the checkout's
qserve on its PYTHONPATH) loads the same runtime with the same settings, times `predict([text])` over the
reviews itself (its own in-process p50, in the very process that then serves), then serves on uvloop with
httptools (the event loop and parser uvicorn uses) from one asyncio Protocol: each request's body is read,
its first input run through `predict([text])` right on the event loop, and a small JSON answer written. No
framework, no validation, no queue, no thread hop, no logging, no metrics: what is left between wrk's p50
and the in-process p50 is loopback TCP, the two wake-ups of a round trip (the server's and wrk's) and
parsing, i.e. what any Python server on this machine pays. qserve's overhead above that floor is its own.
Not a server to use: it has no limits, no errors beyond a 400, one request at a time.

The same child serves qserve itself with `server="qserve"` (serve_qserve): this checkout's app under a real
uvicorn on a thread of the process, its default model's runtime timed in the main thread while the server
idles, then wrk. Two processes of the same code can differ by milliseconds per call on this machine (one
child's predict p50 read 16.3 ms, the next 10.9), which swamps a 1 ms overhead measured across processes;
within one process that drift is gone. For qserve the child then also takes the 32-client reading the same
way: its runtime's real-text b32 texts/s while the server idles, wrk at 32 connections, b32 again, and the
served req/s over the mean of the two b32 readings that bracket it (the VM's speed drifts within a minute;
a reading before and after cancels a steady drift). The harness asks for each in-process reading on the
child's stdin, one command a line.
"""

from __future__ import annotations

import asyncio
import json
import logging
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

import httptools
import uvloop

from benchmarks.harness import code_env, free_port, run_wrk, spawn
from qserve.runtime import RuntimeOptions, load_runtime
from qserve.serve.app import create_app
from qserve.serve.infra.config import ServeConfig
from qserve.serve.infra.uvicorn_server import ServerThread

READY = "bare-server ready"


def floor(
    root: Path, variant: Path, lua: Path, args: Any, texts: list[str], server: str = "bare", batch: int = 32
) -> dict[str, Any]:
    """wrk at one connection against one child process that timed its own runtime's predict([text]) first:
    its served p50, its in-process p50, and the difference. `server`: "bare" (the floor) or "qserve" (the
    app of this checkout under a real uvicorn in that process, log level info, its default model's runtime
    timed while the server idles): the same comparison without the drift between two processes. For
    qserve also `batch` clients: wrk's req/s over the child's in-process b`batch` texts/s taken just before
    and just after it (their mean)."""
    port = free_port()
    cfg = {
        "variant": str(variant),
        "threads": args.threads,
        "long_text": args.long_text,
        "texts": texts,
        "seconds": args.duration,
        "port": port,
        "server": server,
        "batch": batch,
    }
    log = tempfile.TemporaryFile("w+")  # the child's log (qserve's access log); its tail explains a failure
    proc = spawn(
        [sys.executable, "-m", "benchmarks.serve_overhead.bare_server"],
        root,
        code_env(root),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )

    def ask(command: str) -> dict[str, Any]:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(command + "\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        if not line.startswith(READY):
            log.seek(0)
            raise RuntimeError(
                f"{server} server did not answer {command[:20]!r} (exit {proc.poll()}): {line!r} {log.read()[-2000:]}"
            )
        return cast(dict[str, Any], json.loads(line[len(READY) :]))

    def load(clients: int) -> dict[str, Any]:
        return run_wrk(args.wrk, f"http://127.0.0.1:{port}", lua, clients, args.duration)

    try:
        inproc = ask(json.dumps(cfg))
        w = load(1)
        p50 = w["p50_us"] / 1e3
        out = {
            "in_process_p50_ms": inproc["p50_ms"],
            "served_c1_p50_ms": p50,
            "overhead_ms": p50 - inproc["p50_ms"],
            "requests": w["requests"],
            "errors": w["errors"],
        }
        if server == "qserve":
            before = ask("b32")["texts_per_s"]
            wb = load(batch)
            after = ask("b32")["texts_per_s"]
            req_s = wb["requests"] / (wb["duration_us"] / 1e6)
            out.update(
                {
                    "in_process_b32_texts_per_s": [before, after],
                    "served_c32_req_s": req_s,
                    "c32_ratio": req_s / ((before + after) / 2),
                    "c32_requests": wb["requests"],
                    "c32_errors": wb["errors"],
                }
            )
        return out
    finally:
        proc.kill()
        proc.wait()
        log.close()


def render(variants: list[dict[str, Any]], target_ms: float, target_ratio: float = 0.95) -> list[str]:
    """serve_overhead's table of floor() per variant: bare, then qserve in one process against `target_ms`, and
    qserve's 32-client reading in that process against `target_ratio`."""
    rows = [v for v in variants if v.get("floor")]
    if not rows:
        return []
    L = [
        "",
        "In one process (benchmarks/serve_overhead/bare_server.py), each round: a child times its runtime's "
        "`predict([text])` over the reviews, then serves them to wrk at one connection; served p50 minus that "
        "in-process p50, with no drift between two processes in it. **bare**: uvloop + httptools, the model "
        "inline on the event loop, no framework, validation, queue, logging or metrics: the floor (loopback TCP, "
        "the wake-ups of a round trip, parsing) any Python server pays here. **qserve**: this checkout's app "
        "under a real uvicorn in the same kind of child, access log on, its own runtime timed while it idles. "
        "Median of the rounds (per round in report.json).",
        "",
        "| variant | server | in-proc p50 ms | served c1 p50 ms | overhead ms | above the floor ms |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for v in rows:
        fl = v["floor"]
        L.append(
            f"| {v['name']} | bare | {fl['in_process_p50_ms']:.2f} | {fl['served_c1_p50_ms']:.2f} | "
            f"{fl['overhead_ms']:.2f} | – |"
        )
        sp = v.get("same_process")
        if sp:
            ok = "✓" if sp["overhead_ms"] <= target_ms else "✗"
            L.append(
                f"| {v['name']} | qserve | {sp['in_process_p50_ms']:.2f} | {sp['served_c1_p50_ms']:.2f} | "
                f"**{sp['overhead_ms']:.2f}** {ok} | {sp['overhead_ms'] - fl['overhead_ms']:.2f} |"
            )
    c32 = [v for v in rows if "c32_ratio" in (v.get("same_process") or {})]
    if c32:
        L += [
            "",
            "32 clients in that same qserve process, each round: the runtime's real-text b32 while the server "
            "idles, wrk at 32 connections, b32 again; the served req/s over the mean of the two b32 readings around "
            f"it (target >= {target_ratio}x). The ratio is the median of the rounds' ratios.",
            "",
            "| variant | rounds: b32 texts/s before, after -> served c32 req/s (ratio) | median ratio |",
            "|---|---|---:|",
        ]
        for v in c32:
            sp = v["same_process"]
            per = "; ".join(
                f"{r['in_process_b32_texts_per_s'][0]:.1f}, {r['in_process_b32_texts_per_s'][1]:.1f} -> "
                f"{r['served_c32_req_s']:.1f} ({r['c32_ratio']:.2f}x)"
                for r in sp["rounds"]
            )
            ok = "✓" if sp["c32_ratio"] >= target_ratio else "✗"
            L.append(f"| {v['name']} | {per} | **{sp['c32_ratio']:.2f}x** {ok} |")
    return L


def _p50_ms(rt: Any, texts: list[str], seconds: float) -> float:
    lat: list[float] = []
    w0 = time.perf_counter()
    while len(lat) < len(texts) or time.perf_counter() - w0 < seconds:
        t0 = time.perf_counter()
        rt.predict([texts[len(lat) % len(texts)]])
        lat.append(time.perf_counter() - t0)
    return statistics.median(lat) * 1e3


def _texts_per_s(rt: Any, texts: list[str], batch: int, seconds: float) -> float:
    """Real-text batches of `batch` reviews in turn (serve_overhead's in-process b32), texts per second."""
    chunks = [texts[i : i + batch] for i in range(0, len(texts), batch)]
    n, calls, w0 = 0, 0, time.perf_counter()
    while calls < len(chunks) or time.perf_counter() - w0 < seconds:
        c = chunks[calls % len(chunks)]
        rt.predict(c)
        n, calls = n + len(c), calls + 1
    return n / (time.perf_counter() - w0)


def serve_qserve(cfg: dict[str, Any]) -> None:
    """qserve's app (create_app, real uvicorn on a thread of this process, access log on), then its runtime
    timed in this process's main thread while the server idles, then serve until killed; each further line
    on stdin ("b32") times the runtime's real-text batches again, the server idling meanwhile."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)  # the access log, as `qserve serve` writes it
    app = create_app(ServeConfig(variant_dir=cfg["variant"], threads=cfg["threads"], long_text=cfg["long_text"]))
    ServerThread(app, port=cfg["port"], log_level="info").start()
    st = app.state.qserve
    deadline = time.monotonic() + 240
    while not st.ready:
        if time.monotonic() > deadline:
            raise SystemExit(f"qserve did not become ready: {st.not_ready_reason()}")
        time.sleep(0.05)
    rt = st.models[st.default].runtime
    rt.predict(cfg["texts"][: cfg["batch"]])  # the batched path's first call (a second compiled model) untimed
    p50 = _p50_ms(rt, cfg["texts"], cfg["seconds"])
    print(READY + json.dumps({"p50_ms": p50}), flush=True)
    for command in sys.stdin:
        if command.strip() != "b32":
            raise SystemExit(f"unknown command {command.strip()!r} (allowed: b32)")
        print(
            READY + json.dumps({"texts_per_s": _texts_per_s(rt, cfg["texts"], cfg["batch"], cfg["seconds"])}),
            flush=True,
        )


def serve(cfg: dict[str, Any]) -> None:
    rt = load_runtime(cfg["variant"], "cpu", RuntimeOptions(threads=cfg["threads"], long_text=cfg["long_text"]))
    p50 = _p50_ms(rt, cfg["texts"], cfg["seconds"])
    labels = rt.labels

    class Bare(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = cast(asyncio.Transport, transport)  # uvloop's TCP transport (not a registered subclass)
            self.parser = httptools.HttpRequestParser(self)
            self.body: list[bytes] = []

        def data_received(self, data: bytes) -> None:
            self.parser.feed_data(data)

        def on_body(self, chunk: bytes) -> None:
            self.body.append(chunk)

        def on_message_complete(self) -> None:
            try:
                inputs = json.loads(b"".join(self.body))["inputs"]
                probs = rt.predict([inputs[0] if isinstance(inputs, list) else inputs])[0]
                j = int(probs.argmax())
                status, body = b"200 OK", json.dumps({"label": labels[j], "score": float(probs[j])}).encode()
            except (ValueError, KeyError, IndexError, TypeError) as e:
                status, body = b"400 Bad Request", json.dumps({"error": str(e)}).encode()
            self.body = []
            self.transport.write(
                b"HTTP/1.1 "
                + status
                + b"\r\ncontent-type: application/json\r\ncontent-length: "
                + str(len(body)).encode()
                + b"\r\n\r\n"
                + body
            )

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Bare, "127.0.0.1", cfg["port"])
        print(READY + json.dumps({"p50_ms": p50}), flush=True)
        await server.serve_forever()

    uvloop.run(main())


if __name__ == "__main__":
    settings = json.loads(sys.stdin.readline())  # the settings, one line; more lines are commands (qserve)
    (serve_qserve if settings.get("server") == "qserve" else serve)(settings)
