"""The in-process measurement of serve_overhead, run in a child of the code tree it times.

    echo '{"variant": "models/m/variants/onnx-int8", "threads": 2, "long_text": "head", "texts": ["Great."],
           "seconds": 1, "batch": 32}' | python -m benchmarks.serve_overhead.inproc

Reads its settings as JSON on stdin, prints its result as JSON: every text's answer alone, runtime.predict([text])
p50 and CPU ms per call (the child's own process time), then predict() on consecutive batches (texts/s, CPU).
It imports qserve only (and the standard library), so a child whose path puts an older tree's qserve/ first
times that code's runtime.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Any

from qserve.runtime import RuntimeOptions, load_runtime


def timed(rt: Any, chunks: list[list[str]], seconds: float) -> tuple[list[float], int, float, float]:
    """predict() on `chunks` in turn, every chunk once and until `seconds` have passed: (ms per call, texts,
    CPU seconds, wall seconds)."""
    lat: list[float] = []
    n, c0, w0 = 0, time.process_time(), time.perf_counter()
    while len(lat) < len(chunks) or time.perf_counter() - w0 < seconds:
        c = chunks[len(lat) % len(chunks)]
        t0 = time.perf_counter()
        rt.predict(c)
        lat.append((time.perf_counter() - t0) * 1e3)
        n += len(c)
    return lat, n, time.process_time() - c0, time.perf_counter() - w0


def measure(cfg: dict[str, Any]) -> dict[str, Any]:
    rt = load_runtime(cfg["variant"], "cpu", RuntimeOptions(threads=cfg["threads"], long_text=cfg["long_text"]))
    texts = cfg["texts"]
    answers = [rt.predict([t])[0].tolist() for t in texts]
    lat, n, cpu, wall = timed(rt, [[t] for t in texts], cfg["seconds"])
    b32 = [texts[i : i + cfg["batch"]] for i in range(0, len(texts), cfg["batch"])]
    rt.predict(b32[0])
    blat, bn, bcpu, bwall = timed(rt, b32, cfg["seconds"])
    return {
        "answers": answers,
        "labels": list(rt.labels),
        "name": rt.name,
        "b1": {"p50_ms": statistics.median(lat), "calls": len(lat), "cpu_ms_per_call": cpu * 1e3 / len(lat)},
        "b32": {"texts_per_s": bn / bwall, "cpu_ms_per_text": bcpu * 1e3 / bn, "texts": bn},
    }


if __name__ == "__main__":
    print(json.dumps(measure(json.load(sys.stdin))))
