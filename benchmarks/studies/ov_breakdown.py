"""Where an OpenVINO variant's time goes on this CPU, b1/s128 and b32/s128: the plugin's per-node counters
against the floor of its compute type, and what the forward could take if its GEMMs ran at the peak.

    python -m benchmarks.studies.ov_breakdown models/minilm-l6-distilbert-imdb/variants/ov-int8 \\
        models/minilm-l6-distilbert-imdb/variants/ov-bf16 --threads 2 --out benchmarks/reports/ov-breakdown-xeon

In one process, through the compile settings qserve's runtime uses (qserve/runtime/openvino_rt.py):
1. the peak GEMM rates (qserve.bench.floor, best-of-N, as the bench's floor) -> each variant's floor;
2. per variant, the runtime's own forward() timed at b1 and b32 (a batch runs as the runtime runs it: shares
   on one single-threaded stream each), and the thread settings beside it (b1 on 1 and on --threads threads;
   b32 on one stream of --threads threads), every variant's settings taking turns in the same rounds;
3. OpenVINO's per-node counters (PERF_COUNT) of the same compiled configuration: b1 on the lone-row model,
   b32 as one share of rows on one stream of the streams model (the other stream runs the other share alike).
   Each node lands in a class by its type and kernel (exec_type: int8 AMX / VNNI / bf16 kernels are named
   there), the faster half of the profiled calls counted.
The bound: the measured forward with its GEMMs (FullyConnected, MatMul) taken at the floor's own peak rate and
every other node as measured. When that bound alone is above a target multiple of the floor, no faster GEMM
reaches the target: the other nodes have to go (fusion) first. Writes report.json and report.md to --out.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import ROOT, write_report
from qserve.bench.envinfo import environment
from qserve.bench.floor import flops_per_sequence, gemm_shapes, measure_peaks, peak_for
from qserve.bench.measure import FALLBACK_TEXT
from qserve.bench.realtext import synthetic_batch
from qserve.devices import cpu_label
from qserve.runtime import RuntimeOptions, load_runtime
from qserve.runtime.openvino_rt import MODEL_FILE, compile_config, compiled_model

SEQ = 128
INT8_GEMM = "int8 GEMMs (FullyConnected, MatMul)"
OTHER_GEMM = "bf16 / fp32 GEMMs (FullyConnected, MatMul)"
ATTENTION = "attention (the fused MatMul-Softmax-MatMul Subgraph, SDPA, Softmax)"
# (class, node types) in order; GEMMs and fused Subgraphs are told apart first (op_class).
CLASSES = (
    (ATTENTION, {"ScaledDotProductAttention", "Softmax"}),
    ("quantize (FakeQuantize)", {"FakeQuantize"}),
    ("normalization (MVN)", {"MVN", "RMS", "NormalizeL2"}),
    (
        "elementwise (Add, Multiply, MulAdd, other fused Subgraphs)",
        {
            "Eltwise",
            "Subgraph",
            "Gelu",
            "Math",
            "Multiply",
            "Add",
            "MulAdd",
            "Subtract",
            "Divide",
            "PowerStatic",
            "Power",
            "Abs",
            "Erf",
            "Tanh",
            "Exp",
            "Sqrt",
            "Maximum",
            "Minimum",
            "GreaterEqual",
        },
    ),  # transformers 5's padding mask: index comparisons
    (
        "layout and precision (Transpose, Reorder, Convert, Reshape)",
        {
            "Reorder",
            "Convert",
            "Transpose",
            "Reshape",
            "Concat",
            "Split",
            "Squeeze",
            "Unsqueeze",
            "StridedSlice",
            "Slice",
        },
    ),
    (
        "lookups and shapes (Gather, ShapeOf, ...)",
        {
            "Gather",
            "ShapeOf",
            "Broadcast",
            "Select",
            "Range",
            "Input",
            "Output",
            "Parameter",
            "Result",
            "Constant",
            "ReduceProd",
        },
    ),
)


def op_class(node_type: str, exec_type: str, node_name: str = "") -> str:
    """A node's class by its type; a GEMM's by the precision its kernel runs in (exec_type's suffix: _I8, _U8),
    a fused Subgraph's by what it was fused from (the plugin tokenizes each layer's attention into one)."""
    if node_type.startswith("FullyConnected") or node_type in ("MatMul", "Convolution"):
        return INT8_GEMM if exec_type.upper().endswith(("_I8", "_U8")) else OTHER_GEMM
    if node_type == "Subgraph" and "attention" in node_name:
        return ATTENTION
    return next((name for name, types in CLASSES if node_type in types), "other")


def collect(infos: list[Any]) -> dict[str, Any]:
    """One call's profiling info -> {(type, exec_type, class): [ms, nodes]}, total ms of executed nodes."""
    per: dict[tuple[str, str, str], list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for i in infos:
        if str(i.status).rsplit(".", 1)[-1] == "EXECUTED":  # not NOT_RUN, not OPTIMIZED_OUT
            rec = per[(i.node_type, i.exec_type, op_class(i.node_type, i.exec_type, i.node_name))]
            rec[0] += i.real_time.total_seconds() * 1e3
            rec[1] += 1
    return {"nodes": dict(per), "ms": sum(v[0] for v in per.values())}


def profile(request: Any, feed: dict, calls: int, warmup: int = 10) -> dict[str, Any]:
    """Per (node type, kernel) and per class: ms per call over the faster half of `calls` profiled calls."""
    for _ in range(warmup):
        request.infer(feed)
    runs = []
    for _ in range(calls):
        t0 = time.perf_counter()
        request.infer(feed)
        wall = (time.perf_counter() - t0) * 1e3
        runs.append((wall, collect(request.profiling_info)))
    runs.sort(key=lambda r: r[0])
    kept = runs[: len(runs) - len(runs) // 2]
    n = len(kept)
    kernels: dict[str, dict[str, Any]] = {}
    for _, call in kept:
        for (node_type, exec_type, cls), (ms, nodes) in call["nodes"].items():
            k = kernels.setdefault(
                f"{node_type} / {exec_type} / {cls}",
                {"type": node_type, "exec_type": exec_type, "ms": 0.0, "nodes": 0, "class": cls},
            )
            k["ms"] += ms / n
            k["nodes"] = int(nodes)
    classes: dict[str, dict[str, Any]] = {}
    for k in kernels.values():
        c = classes.setdefault(k["class"], {"ms": 0.0, "nodes": 0, "kernels": []})
        c["ms"] += k["ms"]
        c["nodes"] += k["nodes"]
        c["kernels"].append(f"{k['type']} / {k['exec_type']}")
    wall = sum(w for w, _ in kept) / n
    return {
        "calls": len(runs),
        "counted": n,
        "wall_ms": wall,
        "nodes_ms": sum(k["ms"] for k in kernels.values()),
        "classes": classes,
        "kernels": kernels,
    }


def bound(wall_ms: float, prof: dict[str, Any], gemm_gflop: float, peak_gflops: float) -> dict[str, float]:
    """The forward with its GEMM classes at the peak rate, every other node as measured (profile shares applied
    to the unprofiled wall time; what is outside the nodes stays as it is)."""
    # The plugin's per-node timers can add up to more than the call (a little on the real model, more on a tiny
    # one): shares of the larger.
    share = sum(prof["classes"].get(c, {"ms": 0.0})["ms"] for c in (INT8_GEMM, OTHER_GEMM)) / max(
        prof["wall_ms"], prof.get("nodes_ms", 0.0)
    )
    gemm_ms = share * wall_ms
    at_peak = gemm_gflop / peak_gflops * 1e3
    return {
        "gemm_ms": gemm_ms,
        "gemm_share": share,
        "gemm_at_peak_ms": at_peak,
        "gemm_gops": gemm_gflop / (gemm_ms / 1e3) if gemm_ms else 0.0,
        "rest_ms": wall_ms - gemm_ms,
        "bound_ms": wall_ms - gemm_ms + at_peak,
    }


def timed(fn, calls: int) -> float:
    ts = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


def turns(rt, batches: dict[int, dict], feeds: dict[int, dict], threads: int, calls: int) -> dict[str, tuple]:
    """name -> (a call, calls per turn): the runtime's own forward at b1 and b32, then the thread settings beside
    it (b1 on one thread and on `threads`, b32 on one stream of `threads`), each its own compiled model."""
    few = max(3, calls // 8)
    w = rt.row_workers
    out: dict[str, tuple] = {
        "runtime forward b1": (lambda: rt.forward(batches[1]), calls),
        f"runtime forward b32 ({w} stream{'s' * (w > 1)})": (lambda: rt.forward(batches[32]), few),
    }
    for t in sorted({1, threads}):
        req = compiled_model(rt.variant_dir, rt.manifest, rt.precision, t).create_infer_request()
        out[f"b1, one stream of {t} thread{'s' * (t > 1)}"] = ((lambda r: lambda: r.infer(feeds[1]))(req), calls)
    req = compiled_model(rt.variant_dir, rt.manifest, rt.precision, threads).create_infer_request()
    out[f"b32, one stream of {threads} threads"] = (lambda: req.infer(feeds[32]), few)
    return out


def run_variants(
    variants: list[Path], threads: int, rounds: int, calls: int, prof_calls: int, seq: int = SEQ
) -> list[dict[str, Any]]:
    """Each variant loaded as served, its settings timed with every other variant's in the same rounds (a noisy
    minute of this shared machine hits all of them), then each variant's per-node counters."""
    import openvino as ov

    loaded = []
    for variant in variants:
        rt = load_runtime(variant, "cpu", RuntimeOptions(threads=threads))
        batches = {b: synthetic_batch(rt, b, seq, FALLBACK_TEXT) for b in (1, 32)}
        feeds = {b: rt.graph_feed(x, rt.input_names, MODEL_FILE) for b, x in batches.items()}
        calls_of = turns(rt, batches, feeds, threads, calls)
        for fn, _ in calls_of.values():  # warm-up: first-call compilation of each shape
            for _ in range(3):
                fn()
        loaded.append((variant, rt, feeds, calls_of))
    per_round: list[dict[str, list[float]]] = [{k: [] for k in c} for *_, c in loaded]
    for _ in range(rounds):
        for (*_, calls_of), times in zip(loaded, per_round):
            for name, (fn, n) in calls_of.items():
                times[name].append(timed(fn, n))
    out = []
    core = ov.Core()
    for (variant, rt, feeds, calls_of), times in zip(loaded, per_round):
        model = core.read_model(str(variant / MODEL_FILE))
        lone = core.compile_model(model, "CPU", {**compile_config(rt.precision, threads), "PERF_COUNT": True})
        share = 32 // rt.row_workers
        streams = core.compile_model(
            model, "CPU", {**compile_config(rt.precision, threads, streams=rt.row_workers), "PERF_COUNT": True}
        )
        profiles = {
            "b1": profile(lone.create_infer_request(), feeds[1], prof_calls),
            "b32": profile(
                streams.create_infer_request(), {k: v[:share] for k, v in feeds[32].items()}, max(5, prof_calls // 8)
            ),
        }
        profiles["b32"]["rows"] = share
        b1_key, b32_key = list(calls_of)[:2]
        out.append(
            {
                "seq": seq,
                "variant": str(variant.relative_to(ROOT)) if variant.is_relative_to(ROOT) else str(variant),
                "name": rt.name,
                "dtype": rt.manifest.spec.dtype,
                "precision": rt.precision,
                "row_workers": rt.row_workers,
                "b1_key": b1_key,
                "b32_key": b32_key,
                "profiles": profiles,
                "timing": {k: {"p50_ms": statistics.median(v), "rounds_ms": v} for k, v in times.items()},
            }
        )
    return out


def render(r: dict[str, Any]) -> str:
    f = r["flops"]
    lines = [
        f"# OpenVINO variants: where the time goes (s{r['seq']}, {r['threads']} threads)",
        "",
        f"`benchmarks/studies/ov_breakdown.py`, created {r['created']}, openvino {r['openvino']}, "
        f"{cpu_label(r['environment'].get('cpu'))}."
        f" One sequence of {r['seq']} tokens costs {f['total'] / 1e9:.3f} GFLOP, {f['linear'] / 1e9:.3f} of it in the "
        f"linear layers (FullyConnected), {f['attention'] / 1e9:.3f} in attention. One process, variants and "
        "settings taking turns in each round (every variant's in the same rounds); each figure a median of rounds. "
        "Read ratios, not single values.",
        "",
    ]
    for v in r["variants"]:
        kind, peak = peak_for(v["dtype"], r["peaks"]) or ("?", float("nan"))
        method = r["peaks"].get(kind, {})
        floor1 = f["total"] / (peak * 1e9) * 1e3
        title = v["name"] if Path(v["variant"]).name == v["name"] else f"{v['name']} from `{v['variant']}`"
        lines += [
            f"## {title} (inference precision {v['precision']}; floor: the {kind} peak, {peak:,.1f} "
            f"GOP/s, {method.get('method', '?')}, {'x'.join(map(str, method.get('shape', [])))})",
            "",
            "| batch | forward p50 (ms) | floor (ms) | forward / floor | GEMMs: share, ms, GOP/s | GEMMs at the "
            "peak (ms) | the rest (ms) | bound: rest + GEMMs at the peak (ms) | bound / floor |",
            "|---|---:|---:|---:|---|---:|---:|---:|---:|",
        ]
        for b, key in ((1, v["b1_key"]), (32, v["b32_key"])):
            wall = v["timing"][key]["p50_ms"]
            bd = bound(wall, v["profiles"][f"b{b}"], f["linear"] * b / 1e9, peak)
            fl = floor1 * b
            lines.append(
                f"| b{b} | {wall:.2f} | {fl:.2f} | **{wall / fl:.2f}x** | {bd['gemm_share']:.0%}, "
                f"{bd['gemm_ms']:.2f}, {bd['gemm_gops']:,.0f} | {bd['gemm_at_peak_ms']:.2f} | "
                f"{bd['rest_ms']:.2f} | {bd['bound_ms']:.2f} | **{bd['bound_ms'] / fl:.2f}x** |"
            )
        lines += [
            "",
            "Thread settings, the same rounds (ms, median of rounds):",
            "",
            "| setting | p50 (ms) | rounds (ms) |",
            "|---|---:|---|",
        ]
        for name, t in v["timing"].items():
            lines.append(f"| {name} | {t['p50_ms']:.2f} | {', '.join(f'{x:.2f}' for x in t['rounds_ms'])} |")
        for b in ("b1", "b32"):
            p = v["profiles"][b]
            lines += [
                "",
                f"Per-node counters, {b} ({p.get('rows', 1)} row{'s' * (p.get('rows', 1) > 1)} on one "
                f"{'stream of the streams model' if b == 'b32' else 'lone-row request'}; faster {p['counted']} "
                f"of {p['calls']} profiled calls: {p['wall_ms']:.2f} ms a call, {p['nodes_ms']:.2f} in nodes):",
                "",
                "| class | nodes | share of the call | ms | kernels (type / exec_type) |",
                "|---|---:|---:|---:|---|",
            ]
            for name, c in sorted(p["classes"].items(), key=lambda kv: -kv[1]["ms"]):
                lines.append(
                    f"| {name} | {c['nodes']} | {c['ms'] / p['wall_ms']:.1%} | {c['ms']:.3f} | "
                    f"{', '.join(sorted(c['kernels']))} |"
                )
            outside = p["wall_ms"] - p["nodes_ms"]  # negative: the node timers overlap the call's edges
            lines.append(
                f"| outside the nodes (the call's own overhead) | – | {outside / p['wall_ms']:.1%} | "
                f"{outside:.3f} | – |"
            )
        lines.append("")
    lines += [
        "The bound keeps every node but the GEMMs as measured and gives the GEMMs the floor's own peak rate: "
        "a bound / floor above a target multiple says that no GEMM kernel can reach it while the rest of the "
        "graph (quantization, normalization, elementwise work, layout changes, attention) costs what it costs "
        "here; it has to be fused away or made cheaper first. The floor counts attention's FLOPs at the same "
        "peak, so the floor is lower than GEMMs at the peak alone.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("variants", nargs="+", type=Path, help="OpenVINO variant dirs (ov-int8, ov-bf16, ov-fp32)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=7, help="rounds, every variant's settings taking turns (default 7)")
    p.add_argument("--calls", type=int, default=80, help="b1 calls per turn (b32: an eighth, at least 3)")
    p.add_argument("--profile-calls", type=int, default=200, help="profiled b1 calls (b32: an eighth, at least 5)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/reports/ov-breakdown")
    args = p.parse_args(argv)
    for v in args.variants:
        if not (v / "openvino_model.xml").is_file():
            p.error(f"{v} is not an OpenVINO variant (no openvino_model.xml): give ov-int8, ov-bf16 or ov-fp32 dirs")
    import openvino as ov

    config = json.loads((args.variants[0] / "config.json").read_text(encoding="utf-8"))
    print("measuring peak GEMM rates", flush=True)
    peaks = measure_peaks(gemm_shapes(config, SEQ), args.threads, "cpu", model_shapes=3)
    print(f"{len(args.variants)} variants: {args.rounds} rounds, then each one's counters", flush=True)
    variants = run_variants(args.variants, args.threads, args.rounds, args.calls, args.profile_calls)
    report = {
        "threads": args.threads,
        "seq": SEQ,
        "flops": flops_per_sequence(config, SEQ),
        "peaks": peaks["peaks"],
        "model_peaks": peaks["model_peaks"],
        "variants": variants,
        "openvino": ov.__version__,
        "environment": environment(args.threads, "cpu"),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    write_report(args.out, report, render(report))  # report.json + report.md under this run's provenance
    return 0


if __name__ == "__main__":
    sys.exit(main())
