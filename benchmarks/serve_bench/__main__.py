"""Serving benchmark: what dynamic batching buys, and what the HTTP layer costs.

    python -m benchmarks.serve_bench models/minilm-imdb-variants/onnx-int8 \\
        --bench-report benchmarks/reports/<run>/report.json --duration 15

Steps, all in one run on one machine:
1. the model's own batch-1 latency: runtime.predict([text]) in this process on the
   same texts the load tool sends (and, if --bench-report is given, the b1 numbers
   `qserve bench` recorded for this variant, quoted next to it);
   plus the batching ceiling: texts/s through runtime.predict at b1 vs at the server's
   max batch size, no HTTP (what batching can buy at most on this model and machine);
2. `qserve serve` in a child process with --max-batch-size 1 (no batching), then
   with the default batching; each gets `qserve loadtest` at concurrency 1 and 32
   (every answer checked against a sequential first pass);
3. benchmarks/reports/serve/serve_report.{json,md}: p50 at concurrency 1 vs the
   model's b1 p50 (= serving overhead) and throughput at concurrency 32, batched vs
   unbatched (ratio). The server runs in its own process so the client's Python
   does not share its GIL; both still share the machine's cores.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import ROOT, Server, batch_totals, write_report
from benchmarks.serve_bench import engines
from qserve import QserveError
from qserve.devices import cpu_info, cpu_label
from qserve.files import now_iso, refuse_existing
from qserve.loadtest import default_texts, run_loadtest
from qserve.provenance import provenance
from qserve.runtime import RuntimeOptions, load_runtime
from qserve.serve.infra.config import BATCHING, device_kind

log = logging.getLogger("serve_bench")


def model_b1_direct(
    variant: Path, device: str, threads: int | None, texts: list[str], budget_s: float
) -> dict[str, Any]:
    rt = load_runtime(variant, device, RuntimeOptions(threads=threads))
    for t in texts[:10]:  # warm-up
        rt.predict([t])
    samples: list[float] = []
    start = time.perf_counter()
    while len(samples) < 50 or (time.perf_counter() - start < budget_s and len(samples) < 5000):
        t = texts[len(samples) % len(texts)]
        t0 = time.perf_counter()
        rt.predict([t])
        samples.append((time.perf_counter() - t0) * 1e3)
    a = np.asarray(samples)
    info = {
        "name": rt.name,
        "model_name": rt.manifest.model_name,
        "backend": rt.manifest.backend,
        "max_length": rt.max_length,
        "row_by_row": rt.row_by_row,
        "row_workers": rt.row_workers,
    }
    rt.close()
    return {
        "variant": info,
        "p50_ms": float(np.percentile(a, 50)),
        "p99_ms": float(np.percentile(a, 99)),
        "mean_ms": float(a.mean()),
        "calls": len(samples),
    }


def model_ceiling(
    variant: Path, device: str, threads: int | None, texts: list[str], batch: int, rounds: int = 6, round_s: float = 1.5
) -> dict[str, Any]:
    """The model's own throughput with no HTTP at all: in-process texts/s at b1 and at `batch`.

    Same texts, same runtime.predict path as the server (tokenization and padding included);
    the two batch sizes alternate in short rounds so drift on a shared machine hits both.
    No server can answer more texts per second than the model computes at its largest
    batch, so texts/s at `batch` over the unbatched server's req/s bounds the batching ratio.
    """
    rt = load_runtime(variant, device, RuntimeOptions(threads=threads))
    plans = {1: [[t] for t in texts], batch: [texts[i : i + batch] for i in range(0, len(texts), batch)]}
    done = {b: [0, 0.0] for b in plans}
    for chunks in plans.values():  # warm-up both shapes
        rt.predict(chunks[0])
    for _ in range(rounds):
        for b, chunks in plans.items():
            start = time.perf_counter()
            while time.perf_counter() - start < round_s:
                for c in chunks:
                    rt.predict(c)
                    done[b][0] += len(c)
            done[b][1] += time.perf_counter() - start
    rt.close()
    rate = {b: n / s for b, (n, s) in done.items()}
    return {
        "batch": batch,
        "texts_per_s_b1": rate[1],
        "texts_per_s_batched": rate[batch],
        "ratio": rate[batch] / rate[1],
        "seconds_each": rounds * round_s,
    }


def model_b1_from_report(path: Path, name: str, variant: Path) -> dict[str, Any]:
    """b1 latencies `qserve bench` recorded for this variant (matched by name or directory)."""
    report = json.loads(path.read_text(encoding="utf-8"))
    variants = report.get("variants", [])
    same_dir = [v for v in variants if v.get("dir") and Path(v["dir"]).resolve() == variant.resolve()]
    for v in same_dir or [v for v in variants if v.get("name") == name]:
        seq = (report.get("headline") or {}).get("seq")
        fixed = next(
            (r for r in v.get("fixed") or [] if r.get("batch") == 1 and r.get("seq") == seq and "p50" in r), None
        )
        real = next((r for r in v.get("real_text") or [] if r.get("batch") == 1 and "p50" in r), None)
        return {
            "path": str(path),
            "variant": v.get("name"),
            "fixed_b1_p50_ms": fixed["p50"] if fixed else None,
            "fixed_seq": seq,
            "real_text_b1_p50_ms": real["p50"] if real else None,
            "real_text_mean_padded_len": real.get("mean_padded_len") if real else None,
        }
    return {"path": str(path), "error": f"no variant named {name!r} in the report"}


def run_server(args: argparse.Namespace, max_batch_size: int, texts: list[str], workdir: Path) -> dict[str, Any]:
    flags = [
        str(args.variant_dir),
        "--max-batch-size",
        str(max_batch_size),
        "--device",
        args.device,
        "--log-level",
        "warning",
    ]
    if args.threads:
        flags += ["--threads", str(args.threads)]
    if args.max_wait_ms is not None:
        flags += ["--max-wait-ms", str(args.max_wait_ms)]
    srv = Server(flags, ROOT, workdir / f"server-b{max_batch_size}.log")
    try:
        url = srv.wait_ready(180).url
        marks: dict[tuple[str, int], tuple[float, float]] = {}
        report = run_loadtest(
            url,
            [args.concurrency_low, args.concurrency_high],
            args.duration,
            texts=texts,
            max_requests=args.max_requests,
            on_level=lambda when, c: marks.__setitem__((when, c), batch_totals(url)),
        )
        for lv in report["levels"]:
            c = lv["concurrency"]
            (n0, s0), (n1, s1) = marks[("start", c)], marks[("end", c)]
            lv["server_forwards"] = int(n1 - n0)
            lv["mean_batch_size"] = (s1 - s0) / (n1 - n0) if n1 > n0 else None
        report["max_batch_size"] = max_batch_size
        return report
    finally:
        srv.stop()


def _machine(env: dict[str, Any]) -> str:
    return f"{cpu_label(env['cpu'])}, {env['machine']}" if env.get("cpu") else env["machine"]


def render_md(rep: dict[str, Any]) -> str:
    s, v, st = rep["summary"], rep["variant"], rep["settings"]

    def f(x: Any, nd: int = 2) -> str:
        return "–" if x is None else f"{x:,.{nd}f}"

    br = rep["model_b1"].get("bench_report") or {}
    ce = rep.get("model_ceiling") or {}
    L = [
        f"# Serving benchmark: {v['name']} ({v['model_name']})",
        "",
        f"Created {rep['created']} on {_machine(rep['environment'])} ({rep['environment']['cpu_count']} logical "
        f"CPUs, Python {rep['environment']['python']}). Server: `qserve serve` in a child process, "
        f"threads={st['threads'] or 'library default'}, device={st['device']}; client: `qserve loadtest`, "
        f"{st['duration_s']:.0f} s per level, {st['texts']} short review sentences, every answer checked against "
        "a sequential first pass. Client and server share the machine's cores.",
        "",
        "## Headline",
        "",
        "| | value |",
        "|---|---:|",
        f"| model b1 p50, runtime.predict in-process (ms) | {f(s['model_b1_p50_ms'])} |",
        f"| served p50 at concurrency 1, batching on (ms) | {f(s['p50_c1_batched_ms'])} |",
        f"| served p50 at concurrency 1, batch size 1 (ms) | {f(s['p50_c1_unbatched_ms'])} |",
        f"| HTTP + queue overhead at c1 (ms) | {f(s['overhead_c1_ms'])} |",
        f"| throughput at concurrency {st['concurrency_high']}, batching on (req/s) | {f(s['rps_high_batched'], 1)} |",
        f"| throughput at concurrency {st['concurrency_high']}, batch size 1 (req/s) | "
        f"{f(s['rps_high_unbatched'], 1)} |",
        f"| batching speed-up at concurrency {st['concurrency_high']} | **{f(s['throughput_ratio'])}x** |",
        f"| mean texts per forward at c{st['concurrency_high']}, batching on | {f(s['mean_batch_high_batched'])} |",
        f"| model alone, in-process, no HTTP: texts/s at b1 | {f(ce.get('texts_per_s_b1'), 1)} |",
        f"| model alone, in-process, no HTTP: texts/s at b{ce.get('batch')} | {f(ce.get('texts_per_s_batched'), 1)} |",
        f"| highest speed-up this run allowed (model's b{ce.get('batch')} texts/s over the unbatched server's "
        f"req/s) | {f(s.get('ratio_bound'))}x |",
        f"| errors / lost / mismatched answers (all runs) | {s['errors']} / {s['lost']} / {s['mismatched']} |",
        "",
    ]
    if v.get("row_by_row"):
        workers = v.get("row_workers", 1)
        side = (
            f"; a batch's rows run {workers} at a time, each whole on one thread (a lone short row keeps two "
            "intra-op threads only partly busy), while a batch of one keeps every intra-op thread"
            if workers > 1
            else ""
        )
        L += [
            f"{v['name']}'s graph scales activations per batch, so the runtime runs every batch row by row "
            f"(one text, one answer){side}. Batching amortizes the per-request hand-off"
            + (" and lets rows run side by side." if workers > 1 else ", not the forward."),
            "",
        ]
    if br and "error" not in br:
        L += [
            f"`qserve bench` for the same variant ({br['path']}): b1 p50 {f(br.get('fixed_b1_p50_ms'))} ms at "
            f"fixed seq {br.get('fixed_seq')}, {f(br.get('real_text_b1_p50_ms'))} ms on real test texts (mean "
            f"padded length {f(br.get('real_text_mean_padded_len'), 0)} tokens; these sentences are shorter).",
            "",
        ]
    elif br:
        L += [f"bench report {br['path']}: {br['error']}", ""]
    L += [
        "## Per run",
        "",
        "| server | concurrency | requests | p50 ms | p99 ms | req/s | texts/forward | errors "
        "| label differs from the sequential pass | max |Δscore| |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key in ("unbatched", "batched"):
        run = rep["runs"][key]
        for lv in run["levels"]:
            L.append(
                f"| max batch {run['max_batch_size']} | {lv['concurrency']} | {lv['requests']} | "
                f"{f(lv['p50_ms'])} | {f(lv['p99_ms'])} | {f(lv['throughput_rps'], 1)} | "
                f"{f(lv.get('mean_batch_size'))} | {lv['errors']} | {lv['mismatched']} | "
                f"{f(lv.get('max_score_diff'), 4)} |"
            )
    if v.get("name", "").startswith("onnx-int8") and s["mismatched"]:
        L += [
            "",
            "Why answers can differ only when batched: onnx-int8 quantizes activations dynamically with one "
            "scale per input tensor, i.e. per batch, so a text's scores move slightly with its batchmates "
            "(and their padding). A text near p = 0.5 can then flip label. The unbatched server answers exactly "
            "as the sequential pass, as do fp32/bf16 variants batched (their rows are computed independently, "
            "up to float rounding; the serve tests check 64 concurrent clients on fp32 with 0 mismatches). "
            "Nothing is lost or swapped: each client gets its own text's result.",
        ]
    L += [
        "",
        "Overhead = served p50 at concurrency 1 (batching on) minus the model's own b1 p50: JSON, HTTP, "
        "the queue hop and the thread hand-off. At concurrency "
        f"{st['concurrency_high']} the unbatched server runs one forward per request, so its throughput is "
        "1 / (b1 latency + overhead); the batched one amortizes each forward over many requests.",
        "",
        "The model-alone rows run the same texts through runtime.predict in this process, one at a time and "
        f"{ce.get('batch')} at a time, alternating in short rounds, with no HTTP at all. No server can answer "
        f"more texts per second than its model computes at batch {ce.get('batch')}, so that rate over the "
        "unbatched server's throughput is the most batching could have bought in this run. The unbatched "
        "server itself runs below the model's own b1 rate: with one forward per request its inference threads, "
        "event loop and the load client contend for the same two cores.",
        "",
    ]
    return "\n".join(L)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks.serve_bench", description=__doc__.split("\n")[0])
    p.add_argument("variant_dir", type=Path)
    p.add_argument("--bench-report", type=Path, help="a `qserve bench` report.json holding this variant")
    p.add_argument("--duration", type=float, default=15.0, help="seconds per concurrency level (default 15)")
    p.add_argument("--concurrency-low", type=int, default=1)
    p.add_argument("--concurrency-high", type=int, default=32)
    p.add_argument("--max-requests", type=int, default=100_000, help="request cap per level")
    p.add_argument("--threads", type=int, default=None, help="intra-op threads for model and servers")
    p.add_argument("--device", default="cpu")
    p.add_argument("--max-wait-ms", type=float, default=None, help="batched server's max wait (default: serve's)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "reports" / "serve")
    p.add_argument("--force", action="store_true", help="replace an existing serve_report.json")
    p.add_argument(
        "--engine",
        choices=["uvicorn", "ray"],
        default="uvicorn",
        help="ray: uvicorn vs Ray Serve replicas side by side (benchmarks.serve_bench.engines)",
    )
    p.add_argument("--replicas", default="1,2", help="with --engine ray: Ray replica counts to compare")
    p.add_argument("--rounds", type=int, default=3, help="with --engine ray: interleaved rounds per cell")
    p.add_argument("--reviews", type=int, default=256, help="with --engine ray: real test reviews sent")
    args = p.parse_args(argv)
    if args.engine == "ray":
        return run_engines(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    sized = BATCHING[device_kind(args.device)]  # the batcher `qserve serve` sizes for this device by default

    try:
        refuse_existing(args.out / "serve_report.json", args.force)
        texts = default_texts()
        log.info("measuring the model's own b1 latency in-process")
        direct = model_b1_direct(args.variant_dir, args.device, args.threads, texts, budget_s=min(10.0, args.duration))
        model_b1: dict[str, Any] = {"direct": {k: direct[k] for k in ("p50_ms", "p99_ms", "mean_ms", "calls")}}
        log.info("measuring the model's own batching ceiling in-process (b1 vs b%d)", sized.max_batch_size)
        ceiling = model_ceiling(args.variant_dir, args.device, args.threads, texts, sized.max_batch_size)
        if args.bench_report:
            model_b1["bench_report"] = model_b1_from_report(
                args.bench_report, direct["variant"]["name"], args.variant_dir
            )
        runs = {}
        with tempfile.TemporaryDirectory(prefix="serve-bench-") as tmp:
            for key, mbs in (("unbatched", 1), ("batched", sized.max_batch_size)):
                log.info(
                    "server with --max-batch-size %d: loadtest at %d and %d clients, %.0f s each",
                    mbs,
                    args.concurrency_low,
                    args.concurrency_high,
                    args.duration,
                )
                runs[key] = run_server(args, mbs, texts, Path(tmp))
    except QserveError as e:
        print(f"serve_bench: error: {e}", file=sys.stderr)
        return 2

    def level(key: str, c: int) -> dict[str, Any]:
        return next(lv for lv in runs[key]["levels"] if lv["concurrency"] == c)

    lo_b, hi_b = level("batched", args.concurrency_low), level("batched", args.concurrency_high)
    lo_u, hi_u = level("unbatched", args.concurrency_low), level("unbatched", args.concurrency_high)
    all_levels = [lv for r in runs.values() for lv in r["levels"]]
    summary = {
        "model_b1_p50_ms": direct["p50_ms"],
        "p50_c1_batched_ms": lo_b["p50_ms"],
        "p50_c1_unbatched_ms": lo_u["p50_ms"],
        "overhead_c1_ms": (lo_b["p50_ms"] - direct["p50_ms"]) if lo_b["p50_ms"] is not None else None,
        "rps_high_batched": hi_b["throughput_rps"],
        "rps_high_unbatched": hi_u["throughput_rps"],
        "throughput_ratio": hi_b["throughput_rps"] / hi_u["throughput_rps"] if hi_u["throughput_rps"] else None,
        "mean_batch_high_batched": hi_b.get("mean_batch_size"),
        # The batched server cannot outrun its model: this is the highest ratio this run allowed.
        "ratio_bound": ceiling["texts_per_s_batched"] / hi_u["throughput_rps"] if hi_u["throughput_rps"] else None,
        "errors": sum(lv["errors"] for lv in all_levels),
        "lost": sum(lv["lost"] for lv in all_levels),
        "mismatched": sum(lv["mismatched"] for lv in all_levels),
    }
    rep = {
        "created": now_iso(),
        "variant": {**direct["variant"], "dir": str(args.variant_dir)},
        "environment": {
            "machine": platform.platform(),
            "cpu": cpu_info(),
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
        },
        "settings": {
            "duration_s": args.duration,
            "concurrency_low": args.concurrency_low,
            "concurrency_high": args.concurrency_high,
            "threads": args.threads,
            "device": args.device,
            "max_wait_ms": args.max_wait_ms if args.max_wait_ms is not None else sized.max_wait_ms,
            "batched_max_batch_size": sized.max_batch_size,
            "texts": len(texts),
        },
        "model_b1": model_b1,
        "model_ceiling": ceiling,
        "summary": summary,
        "runs": runs,
        "provenance": provenance(),
    }
    write_report(args.out, rep, render_md(rep), stem="serve_report")
    return 0 if not (summary["errors"] or summary["lost"] or summary["mismatched"]) else 1


def run_engines(args: argparse.Namespace) -> int:
    """--engine ray: uvicorn vs Ray Serve replicas, interleaved in one run (see engines.py)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out = (
        args.out
        if args.out != ROOT / "benchmarks" / "reports" / "serve"
        else ROOT / "benchmarks" / "reports" / "serve-ray"
    )
    try:
        replicas = [int(x) for x in args.replicas.split(",") if x.strip()]
        rep = engines.run(args.variant_dir, replicas, args.duration, args.rounds, args.reviews, out, args.force)
    except (QserveError, ValueError) as e:
        print(f"serve_bench: error: {e}", file=sys.stderr)
        return 2
    print(engines.render_md(rep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
