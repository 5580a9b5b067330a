"""Serving engines side by side: uvicorn vs Ray Serve (1 replica x 2 threads, 2 replicas x 1 thread).

    flock /work/cpu.lock python -m benchmarks.serve_bench models/minilm-imdb-variants/onnx-int8 \\
        --engine ray --replicas 1,2 --duration 10 --rounds 3

Reached through benchmarks.serve_bench's `--engine ray`. In one run, on real test reviews
(the embedded IMDb test split), it measures throughput and client p50/p99 at
concurrency 1 and 32 with 1 text and 32 texts per request, for:
  - uvicorn: `qserve serve` in a child process, --threads = all cores;
  - ray-1: one replica of the same app with --threads = all cores;
  - ray-2: two replicas with 1 thread each (cores / 2);
  - the proxy hop alone: a trivial FastAPI app (no model) under uvicorn and as a
    one-replica Ray Serve ingress deployment, same client.
All engines are up at once (Ray: one local instance, one app per route prefix, the
apps' CPU reservations are logical) and the measurement cells are interleaved round
by round, so background load on the shared machine hits every engine alike.
Every answer is compared with the in-process runtime's answer for that text.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import statistics
import time
from pathlib import Path
from typing import Any

import psutil

from benchmarks.harness import ROOT, Server, free_port, in_turn, machine, reviews, wait_ready, write_report
from benchmarks.serve_bench.trivial_app import trivial_app
from qserve.files import now_iso, refuse_existing
from qserve.loadtest import Conn, _percentiles
from qserve.provenance import provenance
from qserve.runtime import RuntimeOptions, load_runtime
from qserve.serve.infra.deploy import Scaling

log = logging.getLogger("serve_engines")
CELLS = [(1, 1), (32, 1), (1, 32), (32, 32)]  # (concurrency, texts per request)
ROLES = [
    "client (bench process)",
    "uvicorn engine",
    "trivial uvicorn",
    "ray proxy",
    "ray replica ray1",
    "ray replica ray2",
    "ray replica trivial",
    "ray system (gcs, raylet, controller, agents)",
]


def _trivial_ray_deployment() -> Any:
    from ray import serve

    @serve.ingress(trivial_app)
    class Trivial:
        pass

    from qserve.serve.ray_engine import logging_config

    return serve.deployment(
        Trivial,
        name="Trivial",
        num_replicas=1,
        max_ongoing_requests=64,
        ray_actor_options={"num_cpus": 0},
        logging_config=logging_config("warning"),
    )


# -- where the CPU goes: process CPU seconds by role, read before and after each cell ---------------
def cpu_by_role(named: dict[int, str]) -> dict[str, float]:
    """user+system CPU seconds so far of every process that takes part, grouped by role.

    named: pid -> role for the child servers; Ray processes are told apart by their titles."""
    out: dict[str, float] = {}
    me = os.getpid()
    for p in psutil.process_iter(["pid", "cmdline", "cpu_times"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
            t = p.info["cpu_times"]
        except (psutil.Error, TypeError):
            continue
        if t is None:
            continue
        if p.info["pid"] == me:
            role = "client (bench process)"
        elif p.info["pid"] in named:
            role = named[p.info["pid"]]
        elif "ProxyActor" in cmd:
            role = "ray proxy"
        elif "ServeReplica:" in cmd:
            role = "ray replica " + cmd.split("ServeReplica:", 1)[1].split(":", 1)[0]
        elif any(
            k in cmd
            for k in (
                "ServeController",
                "gcs_server",
                "raylet",
                "ray/_private",
                "ray/dashboard",
                "ray::",
                "default_worker",
            )
        ):
            role = "ray system (gcs, raylet, controller, agents)"
        else:
            continue
        out[role] = out.get(role, 0.0) + t.user + t.system
    return out


# -- load generation ---------------------------------------------------------------------------
async def _cell(
    url: str,
    bodies: list[tuple[bytes, list[str]]],
    expect: dict[str, list[float]] | None,
    concurrency: int,
    duration_s: float,
    labels: list[str] | None,
) -> dict[str, Any]:
    lat: list[float] = []
    n = {"sent": 0, "ok": 0, "texts": 0, "errors": 0, "lost": 0}
    kinds: dict[str, int] = {}
    max_diff = [0.0]
    end = time.perf_counter() + duration_s

    async def worker(w: int) -> None:
        conn = Conn(url, {}, 300.0)
        i = w
        while time.perf_counter() < end:
            body, texts = bodies[i % len(bodies)]
            i += concurrency
            n["sent"] += 1
            t0 = time.perf_counter()
            try:
                status, data = await conn.post(body)
            except Exception as e:  # noqa: BLE001 - counted
                n["lost"] += 1
                kinds[type(e).__name__] = kinds.get(type(e).__name__, 0) + 1
                await conn.close()
                continue
            if status != 200:
                n["errors"] += 1
                kinds[f"HTTP {status}"] = kinds.get(f"HTTP {status}", 0) + 1
                continue
            lat.append(time.perf_counter() - t0)
            n["ok"] += 1
            n["texts"] += len(texts)
            if expect is not None:
                for t, preds in zip(texts, json.loads(data)["predictions"]):
                    got = {p["label"]: p["score"] for p in preds}
                    max_diff[0] = max(max_diff[0], max(abs(got[lb] - v) for lb, v in zip(labels, expect[t])))
        await conn.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    elapsed = time.perf_counter() - t0
    return {
        "requests": n["sent"],
        "ok": n["ok"],
        "errors": n["errors"],
        "lost": n["lost"],
        "error_kinds": kinds,
        "elapsed_s": elapsed,
        "rps": n["ok"] / elapsed,
        "texts_per_s": n["texts"] / elapsed,
        "max_score_diff": max_diff[0] if expect is not None else None,
        **_percentiles(lat),
    }


def _bodies(texts: list[str], per_request: int) -> list[tuple[bytes, list[str]]]:
    if per_request == 1:
        return [(json.dumps({"inputs": t}).encode(), [t]) for t in texts]
    out = []
    for i in range(0, len(texts), per_request):
        chunk = (texts + texts)[i : i + per_request]
        out.append((json.dumps({"inputs": chunk}).encode(), chunk))
    return out


def run(
    variant: Path, replicas: list[int], duration_s: float, rounds: int, n_texts: int, out: Path, force: bool = False
) -> dict[str, Any]:
    import ray
    from ray import serve

    from qserve.serve.ray_engine import application, logging_config

    refuse_existing(out / "report.json", force)
    cores = os.cpu_count() or 1
    texts = reviews(n_texts, pool=max(n_texts, 200))
    log.info("reference answers: %d test reviews through the in-process runtime, one at a time", len(texts))
    rt = load_runtime(variant, "cpu", RuntimeOptions(threads=cores))
    expect = {t: [float(x) for x in rt.predict([t])[0]] for t in dict.fromkeys(texts)}
    labels, name, model_name = list(rt.labels), rt.name, rt.manifest.model_name
    rt.close()
    settings = {"max_queue": 4096, "max_body_bytes": 1 << 22}
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    procs: list[Server] = []
    urls: dict[str, str] = {}
    try:
        procs.append(
            Server(
                [
                    str(variant),
                    "--device",
                    "cpu",
                    "--threads",
                    str(cores),
                    "--max-queue",
                    "4096",
                    "--max-body-bytes",
                    str(1 << 22),
                    "--log-level",
                    "warning",
                ],
                ROOT,
                logs / "uvicorn.log",
                tag="uvicorn engine",
            )
        )
        urls["uvicorn"] = procs[0].url
        procs.append(
            Server(
                ["--log-level", "warning"],
                ROOT,
                logs / "trivial-uvicorn.log",
                tag="trivial uvicorn",
                app="benchmarks.serve_bench.trivial_app:trivial_app",
            )
        )
        urls["trivial-uvicorn"] = procs[1].url
        # One local Ray; every app reserves its CPUs logically, only the measured one is busy.
        need = sum(cores for _ in replicas)
        ray.init(num_cpus=need, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
        rport = free_port()
        # As the uvicorn child runs with --log-level warning: no access-log line per request on either side.
        serve.start(http_options={"host": "127.0.0.1", "port": rport}, logging_config=logging_config("warning"))
        for r in replicas:
            threads = max(1, cores // r)
            serve.run(
                application(
                    {"variant_dir": str(variant.resolve()), "device": "cpu", "threads": threads, **settings},
                    Scaling(r, num_cpus=float(threads)),
                    log_level="warning",
                ),
                name=f"ray{r}",
                route_prefix=f"/ray{r}",
            )
            urls[f"ray-{r}"] = f"http://127.0.0.1:{rport}/ray{r}"
        serve.run(_trivial_ray_deployment().bind(), name="trivial", route_prefix="/trivial")
        urls["trivial-ray"] = f"http://127.0.0.1:{rport}/trivial"
        for srv in procs:
            srv.wait_ready()
        for key, url in urls.items():  # the trivial Ray app has no /ready: its first request waits instead
            if key.startswith("ray-"):
                wait_ready(url)
        engines = ["uvicorn"] + [f"ray-{r}" for r in replicas]
        named = {procs[0].proc.pid: "uvicorn engine", procs[1].proc.pid: "trivial uvicorn"}
        bodies = {k: _bodies(texts, k) for k in (1, 32)}
        results: dict[str, dict[str, list]] = {}
        for rnd in range(rounds):
            for c, k in CELLS:
                # 32 texts per request at c32 is ~1,000 texts per wave: give it time for several waves.
                d = duration_s * (3 if c * k > 256 else 1)
                for eng in in_turn(engines, rnd):
                    cpu0 = cpu_by_role(named)
                    res = asyncio.run(_cell(f"{urls[eng]}/v1/classify", bodies[k], expect, c, d, labels))
                    cpu1 = cpu_by_role(named)
                    res["cpu_s"] = {r: cpu1[r] - cpu0.get(r, 0.0) for r in cpu1 if cpu1[r] - cpu0.get(r, 0.0) > 0.005}
                    results.setdefault(eng, {}).setdefault(f"c{c}-t{k}", []).append(res)
                    log.info(
                        "round %d %s c%d x %d texts: %.1f req/s, %.1f texts/s, p50 %.1f ms, p99 %.1f ms, "
                        "errors %d lost %d",
                        rnd + 1,
                        eng,
                        c,
                        k,
                        res["rps"],
                        res["texts_per_s"],
                        res["p50_ms"] or -1,
                        res["p99_ms"] or -1,
                        res["errors"],
                        res["lost"],
                    )
            for c in (1, 32):
                for eng in ("trivial-uvicorn", "trivial-ray"):
                    cpu0 = cpu_by_role(named)
                    res = asyncio.run(_cell(f"{urls[eng]}/v1/classify", bodies[1], None, c, duration_s / 2, None))
                    cpu1 = cpu_by_role(named)
                    res["cpu_s"] = {r: cpu1[r] - cpu0.get(r, 0.0) for r in cpu1 if cpu1[r] - cpu0.get(r, 0.0) > 0.005}
                    results.setdefault(eng, {}).setdefault(f"c{c}-t1", []).append(res)
                    log.info(
                        "round %d %s c%d: %.1f req/s p50 %.2f ms", rnd + 1, eng, c, res["rps"], res["p50_ms"] or -1
                    )
    finally:
        for srv in procs:
            srv.stop()
        if ray.is_initialized():
            serve.shutdown()
            ray.shutdown()
    rep = {
        "created": now_iso(),
        "machine": machine(),
        "variant": {"name": name, "model_name": model_name, "dir": str(variant)},
        "settings": {
            "duration_s": duration_s,
            "rounds": rounds,
            "texts": len(texts),
            "cells": CELLS,
            "server_settings": settings,
            "replicas": replicas,
            "ray": ray.__version__,
        },
        "results": results,
        "summary": summarize(results, replicas),
        "provenance": provenance(),
    }
    write_report(out, rep, render_md(rep), echo=False)
    return rep


def _agg(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Pool the rounds: throughput = total over total time; p50/p99 = median of the rounds' values."""
    el = sum(r["elapsed_s"] for r in runs)
    return {
        "rps": sum(r["ok"] for r in runs) / el,
        "texts_per_s": sum(r["texts_per_s"] * r["elapsed_s"] for r in runs) / el,
        "p50_ms": statistics.median(r["p50_ms"] for r in runs if r["p50_ms"] is not None),
        "p99_ms": statistics.median(r["p99_ms"] for r in runs if r["p99_ms"] is not None),
        "rps_rounds": [r["rps"] for r in runs],
        "requests": sum(r["requests"] for r in runs),
        "errors": sum(r["errors"] for r in runs),
        "lost": sum(r["lost"] for r in runs),
        "max_score_diff": max((r["max_score_diff"] or 0.0) for r in runs),
        # CPU milliseconds per answered request, by process role, pooled over the rounds
        "cpu_ms_per_request": {
            role: 1e3 * sum(r.get("cpu_s", {}).get(role, 0.0) for r in runs) / max(1, sum(r["ok"] for r in runs))
            for role in sorted({k for r in runs for k in r.get("cpu_s", {})})
        },
    }


def summarize(results: dict[str, dict[str, list]], replicas: list[int]) -> dict[str, Any]:
    agg = {eng: {cell: _agg(runs) for cell, runs in cells.items()} for eng, cells in results.items()}
    s: dict[str, Any] = {"cells": agg}
    for r in replicas:
        for cell in ("c32-t1", "c32-t32", "c1-t1", "c1-t32"):
            s[f"ray{r}_over_uvicorn_{cell}"] = (
                agg[f"ray-{r}"][cell]["texts_per_s"] / agg["uvicorn"][cell]["texts_per_s"]
            )
    for c in ("c1-t1", "c32-t1"):
        tu, tr = agg["trivial-uvicorn"][c], agg["trivial-ray"][c]
        s[f"trivial_{c}"] = {
            "uvicorn_rps": tu["rps"],
            "ray_rps": tr["rps"],
            "ratio": tr["rps"] / tu["rps"],
            # CPU-seconds per request on this 2-core box when both are saturated at c32
            "ms_per_request_uvicorn": 1e3 / tu["rps"],
            "ms_per_request_ray": 1e3 / tr["rps"],
        }
    return s


def render_md(rep: dict[str, Any]) -> str:
    s, m, st = rep["summary"], rep["machine"], rep["settings"]
    agg = s["cells"]

    def f(x: Any, nd: int = 1) -> str:
        return "–" if x is None else f"{x:,.{nd}f}"

    L = [
        f"# Serving engines side by side: {rep['variant']['name']} ({rep['variant']['model_name']})",
        "",
        f"Created {rep['created']} on {m['cpu']} ({m['cores']} logical CPUs, AMX: "
        f"{'yes, ' + ' '.join(m['amx_flags']) if m['amx'] else 'no'}), Ray {st['ray']}. The machine was shared "
        f"with other jobs; every cell ran {st['rounds']} times, interleaved round by round (engine order reversed "
        f"every other round), {st['duration_s']:.0f} s per cell ({3 * st['duration_s']:.0f} s for c32 x 32 texts). "
        f"Texts: {st['texts']} real IMDb test reviews (embedded default's test split). Client: one asyncio "
        "process with keep-alive connections (qserve loadtest's Conn) on the same cores. Every answer was "
        "compared with the in-process runtime's answer for that text.",
        "",
        "| engine | conc | texts/req | req/s | texts/s | p50 ms | p99 ms | vs uvicorn (texts/s) | errors | lost "
        "| max abs score diff |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c, k in CELLS:
        cell = f"c{c}-t{k}"
        base = agg["uvicorn"][cell]["texts_per_s"]
        for eng in ["uvicorn"] + [f"ray-{r}" for r in st["replicas"]]:
            a = agg[eng][cell]
            L.append(
                f"| {eng} | {c} | {k} | {f(a['rps'])} | {f(a['texts_per_s'])} | {f(a['p50_ms'])} | "
                f"{f(a['p99_ms'])} | {a['texts_per_s'] / base:.2f} | {a['errors']} | {a['lost']} | "
                f"{a['max_score_diff']:.1e} |"
            )
    L += [
        "",
        "Engines: uvicorn = `qserve serve` (one process, --threads "
        f"{m['cores']}); ray-1 = one replica with --threads {m['cores']}; ray-2 = two replicas, 1 thread each; "
        "Ray's proxy in front of both Ray rows.",
        "",
        "## The proxy hop alone (trivial app, no model)",
        "",
        "| conc | uvicorn req/s | Ray Serve req/s | Ray / uvicorn | ms of the 2 cores per request: uvicorn | Ray |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for c in ("c1-t1", "c32-t1"):
        t = s[f"trivial_{c}"]
        L.append(
            f"| {c[1:].split('-')[0]} | {f(t['uvicorn_rps'])} | {f(t['ray_rps'])} | {t['ratio']:.2f} | "
            f"{1e3 / t['uvicorn_rps']:.2f} | {1e3 / t['ray_rps']:.2f} |"
        )
    L += [
        "",
        "## CPU per request, by process (ms of CPU per answered request, psutil, pooled over rounds)",
        "",
        "| engine | cell | " + " | ".join(ROLES) + " | total |",
        "|---|---|" + "---:|" * (len(ROLES) + 1),
    ]
    for eng, cells in agg.items():
        for cell, a in cells.items():
            cpu = a.get("cpu_ms_per_request") or {}
            row = [cpu.get(r, 0.0) for r in ROLES]
            L.append(f"| {eng} | {cell} | " + " | ".join(f"{x:.2f}" for x in row) + f" | {sum(cpu.values()):.2f} |")
    L += ["", "## Where Ray's share goes, and sizing", ""] + [f"- {line}" for line in explain(rep)]
    return "\n".join(L) + "\n"


def explain(rep: dict[str, Any]) -> list[str]:
    """The proxy-hop arithmetic and the per-replica numbers a reader sizes a cluster from."""
    s, agg = rep["summary"], rep["summary"]["cells"]
    t32 = s["trivial_c32-t1"]
    hop_ms = t32["ms_per_request_ray"] - t32["ms_per_request_uvicorn"]
    out = [
        f"Proxy hop: with no model, Ray Serve spends {t32['ms_per_request_ray']:.2f} ms of the machine's "
        f"{rep['machine']['cores']} cores per request at c32 against {t32['ms_per_request_uvicorn']:.2f} ms for "
        f"plain uvicorn: {hop_ms:.2f} ms extra per request (HTTP proxy actor, request pickling, the actor call "
        "to the replica, the replica's own ASGI pass, Ray's router and metrics), paid per request, not per text."
    ]
    for cell, k in (("c32-t1", 1), ("c32-t32", 32)):
        u = agg["uvicorn"][cell]["rps"]
        pred = 1.0 / (1.0 / u + hop_ms / 1e3)
        got = agg["ray-1"][cell]["rps"]
        out.append(
            f"{k} text(s)/request at c32: uvicorn {u:.1f} req/s = {1e3 / u:.2f} ms per request; adding the "
            f"hop predicts {pred:.1f} req/s for Ray with 1 replica ({pred / u:.0%} of uvicorn); measured "
            f"{got:.1f} req/s ({got / u:.0%})."
        )
    for r in rep["settings"]["replicas"]:
        for cell in ("c32-t1", "c32-t32"):
            a = agg[f"ray-{r}"][cell]
            out.append(
                f"Per replica, ray-{r} ({rep['machine']['cores'] // r} core(s) each), {cell}: "
                f"{a['rps'] / r:.1f} req/s = {a['texts_per_s'] / r:.1f} texts/s per replica at p99 "
                f"{a['p99_ms']:.0f} ms."
            )
    a = agg["ray-2"]["c32-t1"] if "ray-2" in agg else agg["ray-1"]["c32-t1"]
    out.append(
        "Sizing rule: replicas = ceil(target req/s / per-replica req/s), with the per-replica rate "
        "measured at a load whose p99 fits the budget (here c32 per machine gives p99 "
        f"{a['p99_ms']:.0f} ms for 1 text/request; a tighter budget means fewer requests in flight per "
        "replica, by Little's law in-flight = rate x latency, so a lower rate per replica)."
    )
    return out
