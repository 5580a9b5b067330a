"""Where onnx-int8's time goes at DistilBERT-base dims, b1/s128: kernel time by class against the int8 floor.

    python -m benchmarks.studies.int8_breakdown --threads 2  # the first run exports the four graphs it times

Uses the checkpoint and onnx-int8 / onnx-fp32 variants of benchmarks/studies/distilbert_base_speed.py
(models/distilbert-base-dims; built here the same way when missing; random weights, speed
only). In one run, one process, through the session settings qserve's runtime uses:
1. the peak GEMM rates (qserve.bench.floor, best-of-N) -> the int8 floor of the report;
2. ORT's profiler over --calls calls of the shipped onnx-int8 (the faster half counted):
   kernel time per op class and the time outside kernels, as shares of the profiled call,
   applied to the best unprofiled round (the profiler adds cost of its own);
3. other int8 graphs of the same model, timed interleaved with the shipped one round by
   round and ranked by their ratios in quiet rounds: the exporter with smoothing off, with
   optimize on (ORT's Attention fusion, then QAttention), and ORT's MultiHeadAttention
   fusion of the fp32 graph, then the exporter's own int8 step with smoothing off and on.
This shared machine has burst phases (~1.5x slower for tens of seconds): the report says
how many rounds were quiet and whether the profile met a burst.
Writes report.json and report.md to --out. A statement of what was measured, not a test.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import exporters
from benchmarks.harness import ROOT, write_markdown, write_report
from benchmarks.studies.distilbert_base_speed import build_checkpoint, export_all
from exporters.onnx import quantize_int8
from qserve.backends.onnx import OnnxOptions
from qserve.bench.envinfo import environment
from qserve.bench.floor import flops_per_sequence, gemm_shapes, measure_peaks
from qserve.bench.measure import FALLBACK_TEXT
from qserve.bench.realtext import synthetic_batch
from qserve.provenance import provenance
from qserve.runtime import RuntimeOptions, load_runtime
from qserve.runtime.onnx_rt import disabled_optimizers, session_options

# Kernel op types by what they do; anything else is "other".
CLASSES = {
    "int8 GEMMs (with activation quantization)": {
        "DynamicQuantizeMatMul",
        "MatMulIntegerToFloat",
        "MatMulInteger",
        "DynamicQuantizeLinear",
        "QGemm",
    },
    "fp32 attention MatMuls (Q·Kᵀ, P·V)": {"MatMul", "FusedMatMul"},
    "fused attention ops": {"Attention", "QAttention", "MultiHeadAttention"},
    "Softmax": {"Softmax"},
    "Gelu": {"Gelu", "BiasGelu", "FastGelu"},
    "LayerNorm": {"LayerNormalization", "SkipLayerNormalization"},
    # GreaterOrEqual, And, Range, Flatten: transformers 5 builds the padding mask from index comparisons
    "elementwise (Add, Mul, Where, ...)": {
        "Add",
        "Mul",
        "Div",
        "Sub",
        "Where",
        "Equal",
        "Cast",
        "Sqrt",
        "Relu",
        "Expand",
        "Erf",
        "GreaterOrEqual",
        "And",
    },
    "layout (Transpose, Reshape)": {"Transpose", "Reshape", "Unsqueeze", "Squeeze", "Flatten"},
    "shape arithmetic and lookups (Shape, Gather, ...)": {
        "Shape",
        "Gather",
        "Concat",
        "Slice",
        "ConstantOfShape",
        "DequantizeLinear",
        "ReduceSum",
        "Range",
    },
}
# name -> (directory under --models/breakdown, exporter options)
ALTERNATIVES = {
    "smooth off": ("smooth-off", {"smooth": False}),
    "optimize on (QAttention)": ("optimize-on", {"optimize": True}),
}
# MultiHeadAttention keeps q/k/v as separate int8 MatMuls and fuses only the attention core.
MHA = {
    "MHA fusion, smooth off": ("mha-plain", {"smooth": False, "correct_bias": False}),
    "MHA fusion + smoothing": ("mha-smooth", {}),
}


def op_class(op: str) -> str:
    return next((name for name, ops in CLASSES.items() if op in ops), "other")


def session(path: Path, threads: int, profile_dir: Path | None = None):
    import onnxruntime as ort

    so = session_options(ort, threads)
    if profile_dir is not None:
        so.enable_profiling = True
        so.profile_file_prefix = str(profile_dir / "ort")
    return ort.InferenceSession(
        str(path), so, providers=["CPUExecutionProvider"], disabled_optimizers=disabled_optimizers("cpu")
    )


def feed_for(variant: Path, batch: int, seq: int, threads: int) -> dict:
    """The bench's fixed-shape input for a speed-only suite: real token ids, full mask."""
    rt = load_runtime(variant, "cpu", RuntimeOptions(threads=threads))
    try:
        return synthetic_batch(rt, batch, seq, FALLBACK_TEXT)
    finally:
        rt.close()


def profile(sess, feed: dict, calls: int, warmup: int = 20) -> dict:
    """Kernel time per op class and outside kernels, ms per call, from ORT's own profiler.

    Only the faster half of the profiled calls is counted (each kernel event is assigned to
    the call whose time span holds it): a burst of this shared machine slows some calls,
    and averaging them in would blur every share.
    """
    for _ in range(warmup):
        sess.run(None, feed)
    for _ in range(calls):
        sess.run(None, feed)
    events = json.loads(Path(sess.end_profiling()).read_text())
    runs = sorted((e["ts"], e["dur"]) for e in events if e.get("cat") == "Session" and e.get("name") == "model_run")
    kept = {i for i, _ in sorted(enumerate(runs), key=lambda r: r[1][1])[: len(runs) - len(runs) // 2]}
    starts = [ts for ts, _ in runs]
    per_op: dict[str, float] = collections.defaultdict(float)
    nodes: collections.Counter = collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            i = bisect.bisect_right(starts, e["ts"]) - 1
            if i in kept and e["ts"] <= runs[i][0] + runs[i][1]:
                per_op[e["args"]["op_name"]] += e["dur"]
                nodes[e["args"]["op_name"]] += 1
    n = len(kept)
    wall = sum(runs[i][1] for i in kept) / n / 1e3
    ops = {op: {"ms": us / n / 1e3, "nodes": nodes[op] // n} for op, us in per_op.items()}
    classes: dict[str, dict] = {}
    for op, rec in ops.items():
        c = classes.setdefault(op_class(op), {"ms": 0.0, "nodes": 0, "ops": []})
        c["ms"] += rec["ms"]
        c["nodes"] += rec["nodes"]
        c["ops"].append(op)
    kernels = sum(r["ms"] for r in ops.values())
    classes["outside kernels (executor, allocation)"] = {"ms": max(wall - kernels, 0.0), "nodes": 0, "ops": []}
    return {"calls": len(runs), "runs": n, "profiled_ms_per_run": wall, "classes": classes, "ops": ops}


def interleaved(sessions: dict, feed: dict, rounds: int, calls: int) -> dict:
    """Median latency per graph per round, graphs taking turns, so a noisy minute hits all of them."""
    for s in sessions.values():
        for _ in range(10):
            s.run(None, feed)
    medians: dict[str, list[float]] = {k: [] for k in sessions}
    for _ in range(rounds):
        for name, s in sessions.items():
            ts = []
            for _ in range(calls):
                t0 = time.perf_counter()
                s.run(None, feed)
                ts.append(time.perf_counter() - t0)
            medians[name].append(float(np.median(ts)) * 1e3)
    ref = {k: s.run(None, feed)[0] for k, s in sessions.items()}
    base = ref[next(iter(sessions))]
    return summarize_rounds(medians, {k: float(np.abs(v - base).max()) for k, v in ref.items()})


QUIET = 1.10  # a round is quiet when the shipped graph ran within 10% of its best round


def summarize_rounds(medians: dict[str, list[float]], diffs: dict[str, float]) -> dict:
    """Per graph: median and best round, and its ratio to the first graph (the shipped one) in
    the same round, over all rounds and over the quiet ones only: bursts of this shared machine
    can slow one kind of kernel more than another, so burst rounds do not rank graphs faithfully."""
    first = np.array(next(iter(medians.values())))
    quiet = first <= QUIET * first.min()
    out = {}
    for name, m in medians.items():
        r = np.array(m) / first
        out[name] = {
            "p50_ms": float(np.median(m)),
            "best_round_ms": float(min(m)),
            "rounds_ms": list(m),
            "ratio_to_shipped": float(np.median(r)),
            "ratio_quiet": float(np.median(r[quiet])),
            "quiet_rounds": int(quiet.sum()),
            "max_abs_logit_diff": diffs[name],
        }
    return out


def build_alternatives(ckpt: Path, fp32_graph: Path, root: Path, rebuild: bool) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for name, (folder, options) in ALTERNATIVES.items():
        if rebuild or not (root / folder / "manifest.json").is_file():
            exporters.export(ckpt, "onnx-int8", root / folder, force=True, options=options)
        out[name] = root / folder / "model.onnx"
    for name, (folder, options) in MHA.items():
        out[name] = root / folder / "model.onnx"
        if rebuild or not out[name].is_file():
            mha_graph(ckpt, fp32_graph, out[name], options)
    return out


def mha_graph(ckpt: Path, fp32_graph: Path, dst: Path, options: dict) -> None:
    """ORT's MultiHeadAttention fusion of the plain fp32 graph, then the exporter's own int8 step."""
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    config = json.loads((ckpt / "config.json").read_text(encoding="utf-8"))
    fo = FusionOptions("bert")
    fo.use_multi_head_attention = True
    fo.use_raw_attention_mask(True)  # the 2-D padding mask as given, as the plain graph reads it
    for flag in ("enable_skip_layer_norm", "enable_embed_layer_norm", "enable_bias_gelu"):
        setattr(fo, flag, False)  # keep every other op as in the shipped graph
    with tempfile.TemporaryDirectory() as scratch:
        fused = Path(scratch) / "fused.onnx"
        model = optimize_model(
            str(fp32_graph),
            model_type="bert",
            num_heads=int(config["n_heads"]),
            hidden_size=int(config["dim"]),
            opt_level=0,
            use_gpu=False,
            optimization_options=fo,
        )
        if model.get_fused_operator_statistics().get("MultiHeadAttention") != int(config["n_layers"]):
            raise SystemExit(
                f"ORT fused {model.get_fused_operator_statistics()} in {fp32_graph}: "
                f"expected {config['n_layers']} MultiHeadAttention nodes"
            )
        model.save_model_to_file(str(fused))
        dst.parent.mkdir(parents=True, exist_ok=True)
        quantize_int8(fused, dst, config, OnnxOptions.resolve("onnx-int8", options), Path(scratch), ckpt)


def render(r: dict) -> str:
    """report.md: the floor, where the shipped graph's time goes, and the other graphs side by side."""
    f, peaks, t = r["flops"], r["peaks"], r["timing"]
    i8, fp = peaks["int8"], peaks["fp32"]
    floor = f["total"] / (i8["gflops"] * 1e9) * 1e3
    p50 = t["shipped onnx-int8"]["p50_ms"]
    best = t["shipped onnx-int8"]["best_round_ms"]
    prof = r["profile"]
    # Profiled shares applied to the quietest unprofiled round: the floor is a best-of-N rate,
    # and the best round is the most favourable reading of how far the GEMMs sit from it.
    scale = best / prof["profiled_ms_per_run"]
    cls = prof["classes"]
    gemm = cls.get("int8 GEMMs (with activation quantization)", {"ms": 0.0})["ms"] * scale
    gemm_floor = f["linear"] / (i8["gflops"] * 1e9) * 1e3
    attn_fp32 = f["attention"] / (fp["gflops"] * 1e9) * 1e3
    bound = gemm + attn_fp32
    env = r["environment"]
    lines = [
        f"# onnx-int8 at DistilBERT-base dims: where the time goes (b{r['batch']}/s{r['seq']}, {r['threads']} threads)",
        "",
        f"`benchmarks/studies/int8_breakdown.py`, created {r['created']}, onnxruntime {r['onnxruntime']}, "
        f"{(env.get('cpu') or {}).get('model', 'CPU')}. Model `{r['model']}`: **random weights, speed only**. "
        "Every graph below runs through the session settings of qserve's runtime (qserve/runtime/onnx_rt.py). "
        "Numbers from one run on a shared machine: read ratios, not single values.",
        "",
        "## Against the int8 floor",
        "",
        f"- One sequence costs {f['total'] / 1e9:.3f} GFLOP: linear layers {f['linear'] / 1e9:.3f}, "
        f"attention (Q·Kᵀ, P·V) {f['attention'] / 1e9:.3f}.",
        f"- Peak int8 rate measured in this run: {i8['gflops']:.1f} GOP/s ({i8['method']}, "
        f"{'×'.join(map(str, i8['shape']))}); fp32: {fp['gflops']:.1f} GFLOP/s ({fp['method']}). "
        f"**Int8 floor: {floor:.2f} ms**, the bench report's definition.",
        f"- Shipped onnx-int8, median of the interleaved rounds below: **{p50:.2f} ms = {p50 / floor:.2f}× the "
        f"floor**; its best round {best:.2f} ms = {best / floor:.2f}×.",
        f"- Its int8 GEMM kernels alone (activation quantization included), their profiled share of that best "
        f"round: {gemm:.2f} ms, "
        f"{gemm / gemm_floor:.2f}× the {gemm_floor:.2f} ms their FLOPs need at the int8 peak, "
        f"so {gemm / floor:.2f}× the whole model's floor before any other op runs.",
        f"- ORT runs the attention products in fp32 on CPU: at the fp32 peak they need {attn_fp32:.2f} ms. "
        f"GEMMs as measured plus attention at the fp32 peak, with every other op free: {bound:.2f} ms = "
        f"{bound / floor:.2f}× the floor. That is the least this graph structure could take on these kernels.",
        "",
        "## Where the shipped graph's time goes",
        "",
        f"ORT's profiler over {prof['calls']} calls, the faster {prof['runs']} of them counted "
        f"({prof['profiled_ms_per_run']:.2f} ms per profiled call; "
        f"the profiler adds its own cost, so each class's share is applied to the best unprofiled round, "
        f"{best:.2f} ms). Profiled call / best round = {prof['profiled_ms_per_run'] / best:.2f}"
        + (
            "; quiet runs here read 1.1-1.2, so this profile met a burst of the machine and its shares are blurred "
            "(the kernels slowed by the burst look bigger)."
            if prof["profiled_ms_per_run"] / best > 1.3
            else "."
        ),
        "",
        "| class | nodes per call | share | ms of the best round | op types |",
        "|---|---:|---:|---:|---|",
    ]
    total = prof["profiled_ms_per_run"]
    for name, c in sorted(cls.items(), key=lambda kv: -kv[1]["ms"]):
        lines.append(
            f"| {name} | {c['nodes']} | {c['ms'] / total:.1%} | {c['ms'] * scale:.2f} | "
            f"{', '.join(sorted(c['ops'])) or '–'} |"
        )
    rounds = len(next(iter(t.values()))["rounds_ms"])
    lines += [
        "",
        "## Other int8 graphs of the same model, timed interleaved",
        "",
        f"{rounds} rounds; in each, every graph makes {r['calls_per_turn']} calls in turn, so a noisy minute "
        "hits all of them. "
        "Ratio = median over rounds of (graph / shipped) in the same round. A round is quiet when the shipped "
        f"graph ran within {QUIET - 1:.0%} of its best round: bursts of this shared machine slow some kernels "
        "more than others, so the quiet-round ratio is the one that ranks graphs. Best round / floor = the "
        "graph's quietest round against the floor (itself a best-of-N rate).",
        "",
        "| graph | median of rounds (ms) | best round (ms) | ratio, all rounds | ratio, quiet rounds "
        "| best round / floor | max abs logit diff vs shipped |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, g in t.items():
        lines.append(
            f"| {name} | {g['p50_ms']:.2f} | {g['best_round_ms']:.2f} | {g['ratio_to_shipped']:.3f} | "
            f"{g['ratio_quiet']:.3f} | {g['best_round_ms'] / floor:.2f}× | {g['max_abs_logit_diff']:.4f} |"
        )
    q = t["shipped onnx-int8"]["quiet_rounds"]
    fastest = min(t, key=lambda k: t[k]["ratio_quiet"])
    lines += [
        "",
        f"Quiet rounds: {q} of {rounds}" + (" — few: read this table with care." if q < rounds / 3 else "."),
        "",
        f"Fastest by quiet-round ratio: {fastest} ({t[fastest]['ratio_quiet']:.3f} of the shipped graph); "
        f"its best round is {t[fastest]['best_round_ms'] / floor:.2f}× the floor.",
    ]
    lines += ["", "Graphs: " + "; ".join(f"{k}: `{v}`" for k, v in r["graphs"].items()) + ".", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", type=Path, default=ROOT / "models" / "distilbert-base-dims")
    p.add_argument(
        "--out",
        type=Path,
        default=ROOT / "benchmarks" / "reports" / "int8-breakdown",
        help="report directory (default %(default)s; its report.json/md are replaced)",
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--calls", type=int, default=200, help="profiled calls (default %(default)s)")
    p.add_argument("--rounds", type=int, default=25, help="interleaved rounds (default %(default)s)")
    p.add_argument("--turn", type=int, default=20, help="calls per graph per round (default %(default)s)")
    p.add_argument("--rebuild", action="store_true", help="re-export the alternative graphs")
    p.add_argument("--render", action="store_true", help="only re-write report.md from --out's report.json")
    args = p.parse_args(argv)
    if args.render:
        src = args.out / "report.json"
        if not src.is_file():
            raise SystemExit(
                f"--render needs {src}: run the script once without --render, or point --out at a "
                "directory holding its report.json"
            )
        report = json.loads(src.read_text(encoding="utf-8"))
        write_markdown(args.out / "report.md", render(report), report.get("provenance"))
        print(f"report: {args.out / 'report.md'}")
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    ckpt = args.models / "checkpoint"
    if not (ckpt / "config.json").is_file():
        build_checkpoint(ckpt)
    dirs, failed = export_all(ckpt, args.models / "variants", ["onnx-fp32", "onnx-int8"], False)
    if failed:
        raise SystemExit(f"export failed: {failed}")
    fp32_dir, int8_dir = dirs
    config = json.loads((ckpt / "config.json").read_text())
    batch, seq = 1, 128
    flops = flops_per_sequence(config, seq)
    logging.info("measuring peak GEMM rates")
    peaks = measure_peaks(gemm_shapes(config, batch * seq), args.threads, "cpu", model_shapes=3)
    graphs = {
        "shipped onnx-int8": int8_dir / "model.onnx",
        **build_alternatives(ckpt, fp32_dir / "model.onnx", args.models / "breakdown", args.rebuild),
    }
    feed = feed_for(int8_dir, batch, seq, args.threads)
    logging.info("interleaved timing of %d graphs, %d rounds", len(graphs), args.rounds)
    timing = interleaved({k: session(v, args.threads) for k, v in graphs.items()}, feed, args.rounds, args.turn)
    logging.info("profiling the shipped graph, %d calls", args.calls)
    with tempfile.TemporaryDirectory() as tmp:
        prof = profile(session(graphs["shipped onnx-int8"], args.threads, Path(tmp)), feed, args.calls)
    import onnxruntime as ort

    shown = {k: str(v.relative_to(ROOT)) if v.is_relative_to(ROOT) else str(v) for k, v in graphs.items()}
    report = {
        "model": "distilbert-base-dims-random",
        "batch": batch,
        "seq": seq,
        "threads": args.threads,
        "flops": flops,
        "peaks": peaks["peaks"],
        "model_peaks": peaks["model_peaks"],
        "timing": timing,
        "calls_per_turn": args.turn,
        "profile": prof,
        "graphs": shown,
        "onnxruntime": ort.__version__,
        "environment": environment(args.threads, "cpu"),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "provenance": provenance(),
    }
    write_report(args.out, report, render(report), echo=False)
    print(f"report: {args.out / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
