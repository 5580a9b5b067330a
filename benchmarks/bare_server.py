"""The floor of serving on this machine: a bare HTTP server that answers with the model inline and nothing else.

    python benchmarks/serve_overhead.py models/minilm-l6-distilbert-imdb/variants/onnx-int8 --rounds 1 --duration 5

serve_overhead.py runs floor() once per variant and round: this file as a child process (the checkout's
qserve on its PYTHONPATH) loads the same runtime with the same settings, times `predict([text])` over the
reviews itself (its own in-process p50, in the very process that then serves), then serves on uvloop with
httptools (the event loop and parser uvicorn uses) from one asyncio Protocol: each request's body is read,
its first input run through `predict([text])` right on the event loop, and a small JSON answer written. No
framework, no validation, no queue, no thread hop, no logging, no metrics: what is left between wrk's p50
and the in-process p50 is loopback TCP, the two wake-ups of a round trip (the server's and wrk's) and
parsing, i.e. what any Python server on this machine pays. qserve's overhead above that floor is its own.
Not a server to use: it has no limits, no errors beyond a 400, one request at a time.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

READY = "bare-server ready"


def floor(root: Path, variant: Path, lua: Path, args: Any, parse_wrk: Callable[[str], dict[str, Any]],
          texts: list[str]) -> dict[str, Any]:
    """wrk at one connection against the bare server: its p50, its own in-process p50, and the difference."""
    from netutil import code_env, free_port

    port = free_port()
    cfg = {"variant": str(variant), "threads": args.threads, "long_text": args.long_text, "texts": texts,
           "seconds": args.duration, "port": port}
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve())], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=code_env(root), cwd=root)
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps(cfg))
        proc.stdin.close()
        line = proc.stdout.readline()
        if not line.startswith(READY):
            raise RuntimeError(f"bare server did not start (exit {proc.poll()}): {line!r}")
        inproc = json.loads(line[len(READY):])
        out = subprocess.run([args.wrk, "-t1", "-c1", f"-d{args.duration:g}s", "--timeout", "30s", "--latency",
                              "-s", str(lua), f"http://127.0.0.1:{port}"], capture_output=True, text=True, check=True)
        w = parse_wrk(out.stdout)
        p50 = w["p50_us"] / 1e3
        return {"in_process_p50_ms": inproc["p50_ms"], "served_c1_p50_ms": p50, "overhead_ms": p50 - inproc["p50_ms"],
                "requests": w["requests"], "errors": w["errors"]}
    finally:
        proc.kill()
        proc.wait()


def serve(cfg: dict[str, Any]) -> None:
    import asyncio

    import httptools
    import uvloop

    from qserve.runtime import RuntimeOptions, load_runtime

    rt = load_runtime(cfg["variant"], "cpu", RuntimeOptions(threads=cfg["threads"], long_text=cfg["long_text"]))
    texts = cfg["texts"]
    lat: list[float] = []
    w0 = time.perf_counter()
    while len(lat) < len(texts) or time.perf_counter() - w0 < cfg["seconds"]:
        t0 = time.perf_counter()
        rt.predict([texts[len(lat) % len(texts)]])
        lat.append(time.perf_counter() - t0)
    labels = rt.labels

    class Bare(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport
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
            self.transport.write(b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\ncontent-length: "  # type: ignore[attr-defined]
                                 + str(len(body)).encode() + b"\r\n\r\n" + body)

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Bare, "127.0.0.1", cfg["port"])
        print(READY + json.dumps({"p50_ms": statistics.median(lat) * 1e3}), flush=True)
        await server.serve_forever()

    uvloop.run(main())


if __name__ == "__main__":
    serve(json.load(sys.stdin))
