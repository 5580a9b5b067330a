"""One text, one answer for onnx-int8: the candidate fixes side by side, in one run, one process.

    python -m benchmarks.studies.int8_invariance              # embedded default (models/minilm-l6-distilbert-imdb)
    python -m benchmarks.studies.int8_invariance --base-dims  # DistilBERT-base dims, random weights: speed, invariance

Candidates (all from the same checkpoint; smoothing and bias correction as the exporter's defaults):
- today's graph, batched: ORT dynamic quantization, one activation scale per batch, smoothing and bias
  correction calibrated on padded batches, run as one forward per batch (exporter option row_by_row=false);
- today's graph, row by row: the same graph, run one unpadded row at a time by the runtime (the default);
- calibrated alone: the same recipe with smoothing and bias correction calibrated on each text alone
  (exporter option calibrate_alone=true), run row by row;
- per-row scales: exporter option activation_scales=per-row (exporters.rowwise);
- MatMulNBits 8-bit, accuracy_level 4: ORT's blockwise weight-only kernel, whose int8 compute
  quantizes each row of A per block of 32 (graph only, swapped into the runtime);
- static QDQ: per-tensor activation scales calibrated on the exporter's 64 training texts (graph only).
Per candidate: b1/s128 p50 (the bench's fixed-shape input; candidates take turns round by round,
each round's median), real test reviews at b32 through predict() (texts/s, same rounds), the batch
invariance of qserve.bench.invariance (alone vs shuffled batches of 8 and 32), and agreement with
onnx-fp32 on the test split (--eval, default all 2,000). Writes report.json and report.md to --out.
A statement of what was measured, never an assertion.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import exporters
from benchmarks.harness import ROOT, review_split, write_report
from benchmarks.studies.distilbert_base_speed import build_checkpoint
from exporters.calibration import calibration_set, feed
from exporters.onnx import export_fp32, smooth_fp32
from exporters.smoothing import weight_groups
from qserve.artifact import ModelMeta, read_model_meta
from qserve.bench import invariance
from qserve.bench.envinfo import environment
from qserve.bench.measure import FALLBACK_TEXT
from qserve.bench.realtext import synthetic_batch
from qserve.provenance import provenance
from qserve.runtime import RuntimeOptions, load_runtime
from qserve.runtime.onnx_rt import disabled_optimizers, session_options

TODAY, ROWS, ALONE, PER_ROW, NBITS, QDQ = (
    "today's graph, batched",
    "today's graph, row by row (the default now)",
    "per-tensor scales calibrated on each text alone, row by row",
    "per-row scales in the graph",
    "MatMulNBits 8-bit, accuracy_level 4",
    "static QDQ, calibrated per-tensor scales",
)


def build_graph(kind: str, smoothed_fp32: Path, dst: Path, ckpt: Path) -> Path:
    """The graph-only candidates, from the smoothed fp32 graph the exporter quantizes."""
    import onnx

    if dst.is_file():
        return dst
    dst.parent.mkdir(parents=True, exist_ok=True)
    if kind == NBITS:
        from onnxruntime.quantization import QuantFormat
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

        q = MatMulNBitsQuantizer(
            onnx.load(str(smoothed_fp32)),
            bits=8,
            block_size=32,
            is_symmetric=True,
            accuracy_level=4,
            quant_format=QuantFormat.QOperator,
            op_types_to_quantize=("MatMul",),
        )
        q.process()
        q.model.save_model_to_file(str(dst), use_external_data_format=False)
        return dst
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    model = onnx.load(str(smoothed_fp32))
    names = {i.name for i in model.graph.input}
    weight_matmuls = [n.name for nodes in weight_groups(model)[1].values() for n in nodes]
    batches, _ = calibration_set(ckpt, 64)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter([feed(names, b) for b in batches])

        def get_next(self):
            return next(self.it, None)

    quantize_static(
        str(smoothed_fp32),
        str(dst),
        Reader(),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        nodes_to_quantize=weight_matmuls,
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
    )
    return dst


def smoothed_graph(ckpt: Path, dst: Path) -> Path:
    """The fp32 graph after the exporter's smoothing step (what every int8 candidate starts from)."""
    if dst.is_file():
        return dst
    dst.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        export_fp32(ckpt, Path(scratch) / "fp32")
        batches, source = calibration_set(ckpt, 64)
        smooth_fp32(Path(scratch) / "fp32" / "model.onnx", dst, batches, source, {})
    return dst


def runtimes(ckpt: Path, root: Path, threads: int, graph_only: bool) -> dict[str, Any]:
    """name -> loaded runtime, every candidate behind the same predict()/run() contract."""
    import onnxruntime as ort

    dirs = {
        "onnx-fp32": ("onnx-fp32", {}),
        "per-tensor": ("onnx-int8", {}),
        "per-tensor-batched": ("onnx-int8", {"row_by_row": False}),
        "per-tensor-alone": ("onnx-int8", {"calibrate_alone": True}),
        "per-row": ("onnx-int8", {"activation_scales": "per-row"}),
    }
    for folder, (name, options) in dirs.items():
        if not (root / folder / "manifest.json").is_file():
            logging.info("exporting %s %s", name, options)
            exporters.export(ckpt, name, root / folder, force=True, options=options)
    rts = {
        "onnx-fp32": load_runtime(root / "onnx-fp32", "cpu", RuntimeOptions(threads=threads)),
        TODAY: load_runtime(root / "per-tensor-batched", "cpu", RuntimeOptions(threads=threads)),
        ROWS: load_runtime(root / "per-tensor", "cpu", RuntimeOptions(threads=threads)),
        ALONE: load_runtime(root / "per-tensor-alone", "cpu", RuntimeOptions(threads=threads)),
        PER_ROW: load_runtime(root / "per-row", "cpu", RuntimeOptions(threads=threads)),
    }
    if graph_only:
        smoothed = smoothed_graph(ckpt, root / "graphs" / "smoothed-fp32.onnx")
        for kind, file in ((NBITS, "matmulnbits8.onnx"), (QDQ, "static-qdq.onnx")):
            graph = build_graph(kind, smoothed, root / "graphs" / file, ckpt)
            rt = load_runtime(root / "per-tensor", "cpu", RuntimeOptions(threads=threads, batch_dependent="batched"))
            rt.session = ort.InferenceSession(
                str(graph),
                session_options(ort, threads),
                providers=["CPUExecutionProvider"],
                disabled_optimizers=disabled_optimizers("cpu"),
            )
            rt.batch_invariant = True  # what the kernels promise; the invariance columns check it
            rts[kind] = rt
    return rts


def timing(rts: dict[str, Any], texts: list[str], rounds: int, calls: int) -> dict[str, Any]:
    """b1/s128 p50 and real-text b32 texts/s per candidate, candidates taking turns in every round."""
    first = next(iter(rts.values()))
    feed = synthetic_batch(first, 1, 128, " ".join(texts[:8]) or FALLBACK_TEXT)
    chunks = [texts[i : i + 32] for i in range(0, len(texts), 32)]
    for rt in rts.values():  # warm-up
        for _ in range(5):
            rt.run(feed)
        rt.predict(chunks[0])
    b1: dict[str, list[float]] = {k: [] for k in rts}
    b32: dict[str, list[float]] = {k: [] for k in rts}
    for _ in range(rounds):
        for name, rt in rts.items():
            ts = []
            for _ in range(calls):
                t0 = time.perf_counter()
                rt.run(feed)
                ts.append(time.perf_counter() - t0)
            b1[name].append(float(np.median(ts)) * 1e3)
            t0 = time.perf_counter()
            for c in chunks:
                rt.predict(c)
            b32[name].append(len(texts) / (time.perf_counter() - t0))
    base = np.array(b1[TODAY])
    return {
        name: {
            "b1_p50_ms": float(np.median(b1[name])),
            "b1_rounds_ms": b1[name],
            "b1_ratio_to_today": float(np.median(np.array(b1[name]) / base)),
            "real_b32_texts_per_s": float(np.median(b32[name])),
        }
        for name in rts
    }


def agreement(rts: dict[str, Any], texts: list[str], labels: list[int]) -> dict[str, Any]:
    preds = {}
    for name, rt in rts.items():
        preds[name] = np.concatenate([rt.predict(texts[i : i + 32]) for i in range(0, len(texts), 32)]).argmax(1)
        logging.info("agreement: %s done", name)
    ref = preds["onnx-fp32"]
    y = np.asarray(labels)
    return {
        name: {"n": len(texts), "agreement": float((p == ref).mean()), "accuracy": float((p == y).mean())}
        for name, p in preds.items()
    }


def render(r: dict[str, Any]) -> str:
    def f(x, nd=2):
        return "–" if x is None else f"{x:.{nd}f}"

    env = r["environment"]
    cpu = env.get("cpu") or {}
    L = [
        f"# onnx-int8: one text, one answer ({r['model']})",
        "",
        f"Created {r['created']} on {cpu.get('model')} ({'AMX' if 'amx_int8' in (cpu.get('flags') or []) else 'no AMX'}"
        f"; flags {', '.join(cpu.get('flags') or [])}), {r['threads']} threads, onnxruntime {r['onnxruntime']}. "
        "A shared machine: other jobs ran beside this one, so compare rows of this run only; the candidates took "
        f"turns in each of {r['rounds']} rounds ({r['calls']} b1 calls each, then {r['real_texts']} real test "
        "reviews in batches of 32 through predict()).",
        "",
        "| candidate | agreement with onnx-fp32 | accuracy | b1/s128 p50 (ms) | vs today's graph (median of "
        "per-round ratios) | real reviews, b32 (texts/s) | max abs Δprob alone vs batches of 8/32 | label flips |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    names = list(dict.fromkeys([*r["timing"], *r["invariance"], *(r.get("agreement") or {})]))
    for name in names:
        t = r["timing"].get(name) or {}
        a = (r.get("agreement") or {}).get(name) or {}
        inv = r["invariance"].get(name) or {}
        L.append(
            f"| {name} | {f(a.get('agreement', None) and a['agreement'] * 100)}{'%' if a else ''} | "
            f"{f(a.get('accuracy', None) and a['accuracy'] * 100)}{'%' if a else ''} | {f(t.get('b1_p50_ms'))} | "
            f"{f(t.get('b1_ratio_to_today'), 3)}{'x' if t else ''} | {f(t.get('real_b32_texts_per_s'), 1)} | "
            f"{f(inv.get('max_abs_dprob'), 6) if inv else '–'} | "
            f"{str(inv.get('flips')) + ' of ' + str(inv.get('scored')) if inv else '–'} |"
        )
    if r.get("agreement"):
        n = next(iter(r["agreement"].values()))["n"]
        L += [
            "",
            f"Agreement and accuracy on the first {n} reviews of the test split (predict() in batches of 32, "
            "each candidate as it runs: the batched one batched, the row-by-row one row by row).",
        ]
    inv = next(iter(r["invariance"].values()), {})
    tl = inv.get("token_lengths") or {}
    L += [
        "",
        f"Invariance: {inv.get('texts')} test reviews spread over the length range, every other one cut to its "
        f"opening words ({tl.get('min')} to "
        f"{tl.get('max')} tokens, median {tl.get('median')}), each scored alone, then in shuffled batches of "
        "8 and of 32 (short ones padded next to long ones); the largest |Δprobability| and the label flips "
        "over both. Timings: the per-round medians are in report.json. Measured: "
        + ", ".join(f"{k} {v}" for k, v in (r.get("measured") or {}).items())
        + ".",
        "",
    ]
    return "\n".join(L)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", type=Path, default=ROOT / "models" / "minilm-l6-distilbert-imdb" / "checkpoint")
    p.add_argument(
        "--base-dims",
        action="store_true",
        help="DistilBERT-base dims, random weights (studies/distilbert_base_speed.py's checkpoint): no agreement",
    )
    p.add_argument("--out", type=Path, default=None, help="default benchmarks/reports/int8-invariance/<model>")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--calls", type=int, default=20, help="b1 calls per candidate per round")
    p.add_argument("--eval", type=int, default=2000, help="test reviews for agreement (0: skip)")
    p.add_argument("--invariance-texts", type=int, default=96)
    p.add_argument(
        "--no-graph-only",
        dest="graph_only",
        action="store_false",
        help="skip the MatMulNBits and static QDQ candidates",
    )
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    import onnxruntime as ort

    if args.base_dims:
        args.checkpoint = ROOT / "models" / "distilbert-base-dims" / "checkpoint"
        if not (args.checkpoint / "config.json").is_file():
            build_checkpoint(args.checkpoint)
        args.eval = 0
    model = (read_model_meta(args.checkpoint) or ModelMeta()).model_name
    out = args.out or ROOT / "benchmarks" / "reports" / "int8-invariance" / (
        "distilbert-base-dims" if args.base_dims else "embedded-default"
    )
    rts = runtimes(args.checkpoint, args.checkpoint.parent / "int8-invariance", args.threads, args.graph_only)
    test = review_split(None, pool=2000)
    texts, labels = test.texts, test.labels
    real = texts[:128]
    now = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    # Each part can run alone (--rounds 0, --invariance-texts 0, --eval 0 skip theirs) and the parts not
    # measured now are kept from the report already in --out: the timings need the quiet machine, the
    # rest does not.
    prev = json.loads((out / "report.json").read_text(encoding="utf-8")) if (out / "report.json").is_file() else {}
    if prev.get("checkpoint") != str(args.checkpoint):
        prev = {}
    when = dict(prev.get("measured") or {})
    tm = inv = agr = None
    if args.rounds:
        logging.info("timing %d candidates, %d rounds", len(rts), args.rounds)
        tm = timing(rts, real, args.rounds, args.calls)
        when["timing"] = now
    if args.invariance_texts:
        inv_texts = invariance.select_texts(texts, args.invariance_texts)
        inv = {}
        for name, rt in rts.items():
            inv[name] = invariance.compare(rt.predict, inv_texts)
            lens = rt.tokenize(inv_texts)["attention_mask"].sum(axis=1)
            inv[name]["texts"] = len(inv_texts)
            inv[name]["token_lengths"] = {
                "min": int(lens.min()),
                "median": float(sorted(lens)[len(lens) // 2]),
                "max": int(lens.max()),
            }
            logging.info("invariance %s: %s", name, invariance.cell(inv[name]))
        when["invariance"] = now
    if args.eval:
        agr = agreement(rts, texts[: args.eval], labels[: args.eval])
        when["agreement"] = now
    report = {
        "model": model,
        "checkpoint": str(args.checkpoint),
        "threads": args.threads,
        "rounds": args.rounds if tm else prev.get("rounds"),
        "calls": args.calls if tm else prev.get("calls"),
        "real_texts": len(real),
        "timing": tm if tm is not None else prev.get("timing") or {},
        "invariance": inv if inv is not None else prev.get("invariance") or {},
        "agreement": agr if agr is not None else prev.get("agreement"),
        "measured": when,
        "onnxruntime": ort.__version__,
        "environment": environment(args.threads, "cpu"),
        "created": now,
        "provenance": provenance(),
    }
    write_report(out, report, render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
