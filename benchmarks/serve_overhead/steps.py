"""Where a served request's time goes at one client: the server's own trace spans, step by step.

    python -m benchmarks.serve_overhead models/minilm-l6-distilbert-imdb/variants/onnx-int8 --rounds 1 --duration 5

benchmarks.serve_overhead calls steps() once per variant on this checkout: `qserve serve` with tracing on
(OTEL_TRACES_EXPORTER=console, the batch processor told to hold every span until shutdown, so no
export runs while requests are timed), `wrk` at one connection posting the reviews in turn, then
the spans of each POST /v1/classify read back from the server's log. A request's trace has a
step per stage (qserve/serve/infra/tracing.py): receive (middleware entry until its texts are
queued: auth, body, JSON, validation), queue wait (until the inference thread starts tokenizing:
the batcher and the hop to that thread), tokenize, inference, then the hop back (inference end
until the request's coroutine has its answer: the thread -> event loop wake-up, the batch's
bookkeeping) and respond (the answer, the JSON, the bytes written). Outside the spans: wrk's
latency minus the server span (the kernel, uvicorn's parsing before the middleware, the client).
Tracing adds its own small cost to each request (timestamps, building the spans at the end), so
this table says where the time goes, not what the untraced server's p50 is (the main table does).
"""

from __future__ import annotations

import json
import statistics
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks.harness import Server, code_env, run_wrk

STEPS = (
    "receive",
    "queue wait",
    "tokenize",
    "inference",
    "hop back",
    "respond",
    "server span",
    "outside the spans",
    "wrk p50",
)
ROUTE = "POST /v1/classify"
HOLD = {
    "OTEL_TRACES_EXPORTER": "console",
    "OTEL_SERVICE_NAME": "qserve-steps",
    # every span waits in the processor's queue until shutdown: no export thread runs while timing
    "OTEL_BSP_SCHEDULE_DELAY": "3600000",
    "OTEL_BSP_MAX_QUEUE_SIZE": "1000000",
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "1000000",
}
WARM = 40
"""Traces dropped from the front: the first requests of a fresh server (caches, allocator, lazy imports)."""


def _ns(iso: str) -> int:
    t = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    return int(t.timestamp()) * 1_000_000_000 + t.microsecond * 1000


def spans(log_text: str) -> list[dict[str, Any]]:
    """Every span the console exporter printed (pretty JSON objects among the server's log lines)."""
    dec, out, i = json.JSONDecoder(), [], 0
    while True:
        i = log_text.find("{\n", i)
        if i < 0:
            return out
        try:
            obj, end = dec.raw_decode(log_text, i)
        except json.JSONDecodeError:
            i += 2
            continue
        if isinstance(obj, dict) and "context" in obj and "start_time" in obj:
            out.append(obj)
        i = end


def per_request(found: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Microseconds of each step of each traced request to ROUTE, in the order the requests started."""
    traces: dict[str, dict[str, Any]] = {}
    for s in found:
        t = traces.setdefault(s["context"]["trace_id"], {})
        t[s["name"]] = (_ns(s["start_time"]), _ns(s["end_time"]))
    rows = []
    for t in sorted(traces.values(), key=lambda t: min(v[0] for v in t.values())):
        need = (ROUTE, "receive", "queue wait", "tokenize", "inference", "respond")
        if not all(k in t for k in need):
            continue
        us = {k: (t[k][1] - t[k][0]) / 1e3 for k in need}
        us["hop back"] = (t["respond"][0] - t["inference"][1]) / 1e3
        us["server span"] = us.pop(ROUTE)
        rows.append(us)
    return rows


def steps(code_root: Path, variant: Path, lua: Path, workdir: Path, args: Any) -> dict[str, Any]:
    """One traced server of the code at `code_root`, wrk at one client for args.duration s: the median
    microseconds of every step (STEPS), and how many requests they are the median of."""
    log = workdir / f"steps-{variant.name}.log"
    flags = [str(variant), "--long-text", args.long_text, "--log-level", args.log_level]
    if args.threads:
        flags += ["--threads", str(args.threads)]
    srv = Server(flags, code_root, log, tag="traced server", env={**code_env(code_root), **HOLD})
    try:
        srv.wait_ready(240)
        wrk = run_wrk(args.wrk, srv.url, lua, 1, args.duration)
    finally:
        srv.stop()  # shutdown exports the held spans into the log
    rows = per_request(spans(log.read_text(encoding="utf-8", errors="replace")))[WARM:]
    if not rows:
        raise RuntimeError(f"no {ROUTE} traces in {log}")
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    med["wrk p50"] = wrk["p50_us"]
    med["outside the spans"] = med["wrk p50"] - med["server span"]
    return {"requests": len(rows), "us": {k: med[k] for k in STEPS}}


def render(variants: list[dict[str, Any]]) -> list[str]:
    rows = [(v["name"], v["steps"]) for v in variants if v.get("steps")]
    if not rows:
        return []
    L = [
        "",
        "Where a request's time goes at one client: the median microseconds of each step of the server's own "
        "trace (this checkout, tracing on with every span held until shutdown; benchmarks/serve_overhead/steps.py "
        "says what each step covers). Everything but tokenize and inference is the serving overhead; tracing's own "
        "cost is in it too.",
        "",
        "| variant | requests | " + " | ".join(STEPS) + " |",
        "|---|---:|" + "---:|" * len(STEPS),
    ]
    for name, s in rows:
        L.append(f"| {name} | {s['requests']} | " + " | ".join(f"{s['us'][k]:,.0f}" for k in STEPS) + " |")
    return L
