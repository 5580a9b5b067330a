"""OpenVINO vs ONNX Runtime vs torch, side by side in ONE process, rounds interleaved.

    python -m benchmarks.studies.openvino_compare models/minilm-l6-distilbert-imdb/checkpoint \\
        --out benchmarks/reports/openvino/embedded-default
    python -m benchmarks.studies.openvino_compare --distilbert-base \\
        --out benchmarks/reports/openvino/distilbert-base-dims

Loads ov-int8, ov-bf16, ov-fp32, onnx-int8 and torch-bf16 (plus torch-fp32, the agreement
reference) through `load_runtime`, exactly as bench and serve do (variants missing under
--variants are exported first), then:

1. speed: R rounds; in each, every variant (order rotated round by round) runs N calls at
   b1/s128 and M calls at b32/s128 (synthetic full-length batches, qserve.bench.realtext).
   Why one process rather than `qserve bench`'s child per variant: the children run one
   after another, so a burst of the shared machine's load lands on whichever variant is
   running; interleaving short rounds in one process spreads it over all of them, and
   ratios are taken per round. Runtimes that sit idle keep their thread pools but do not
   run (each call is synchronous), so they do not compete with the one being timed.
2. agreement with torch-fp32 and accuracy on the test split (all 2,000 reviews of the
   embedded default), predict() in batches of 32 with dynamic padding, as served;
3. batch invariance: the first 256 test reviews alone (b1) vs in padded batches of 32:
   max |Δprobability| and label flips.

Writes report.json + report.md with the CPU model, its AMX/bf16 flags, the load average,
and the issue's goals for the recommended variant (fastest at b1 meeting the agreement bar):
b1 p50 <= 0.8x onnx-int8, b32 throughput >= 1.3x onnx-int8, agreement >= 99.1%.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import exporters
from benchmarks.harness import ROOT, review_split, write_report
from benchmarks.studies.distilbert_base_speed import build_checkpoint
from qserve.artifact import ModelMeta, read_model_meta
from qserve.bench.envinfo import load_avg
from qserve.bench.measure import FALLBACK_TEXT
from qserve.bench.realtext import synthetic_batch
from qserve.devices import cpu_info
from qserve.files import now_iso
from qserve.provenance import provenance
from qserve.runtime import RuntimeOptions, load_runtime
from qserve.variants import bar_for, library_versions

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ["TOKENIZERS_PARALLELISM"] = "false"

# label -> (variant name, exporter options); the label is also the directory under --variants
VARIANTS = {
    "ov-int8": ("ov-int8", {}),
    "ov-bf16": ("ov-bf16", {}),
    "ov-fp32": ("ov-fp32", {}),
    "ov-int8-bf16hint": ("ov-int8", {"inference_precision": "bf16"}),
    "onnx-int8": ("onnx-int8", {}),
    "torch-bf16": ("torch-bf16", {}),
    "torch-fp32": ("torch-fp32", {}),
}
BASELINE = "onnx-int8"
REFERENCE = "torch-fp32"


def ensure_variants(ckpt: Path, root: Path, labels: list[str]) -> dict[str, Path]:
    out = {}
    for label in labels:
        name, opts = VARIANTS[label]
        dest = root / label
        if not (dest / "manifest.json").is_file():
            print(f"exporting {label} -> {dest}", flush=True)
            exporters.export(ckpt, name, dest, force=True, options=opts)
        out[label] = dest
    return out


def time_rounds(runtimes: dict[str, Any], labels: list[str], rounds: int, n1: int, n32: int, seq: int):
    any_rt = next(iter(runtimes.values()))
    b1, b32 = synthetic_batch(any_rt, 1, seq, FALLBACK_TEXT), synthetic_batch(any_rt, 32, seq, FALLBACK_TEXT)
    for label in labels:  # warm-up, including each shape's first-call compilation
        for _ in range(2):
            runtimes[label].forward(b1)
        runtimes[label].forward(b32)
    calls: dict[str, dict[str, list[float]]] = {lb: {"b1": [], "b32": []} for lb in labels}
    per_round: list[dict[str, dict[str, float]]] = []
    for r in range(rounds):
        order = labels[r % len(labels) :] + labels[: r % len(labels)]
        this: dict[str, dict[str, float]] = {}
        for label in order:
            rt = runtimes[label]
            t1 = []
            for _ in range(n1):
                t0 = time.perf_counter()
                rt.forward(b1)
                t1.append((time.perf_counter() - t0) * 1e3)
            t32 = []
            for _ in range(n32):
                t0 = time.perf_counter()
                rt.forward(b32)
                t32.append((time.perf_counter() - t0) * 1e3)
            calls[label]["b1"] += t1
            calls[label]["b32"] += t32
            this[label] = {"b1_p50": statistics.median(t1), "b32_seq_s": 32e3 / statistics.median(t32)}
        per_round.append(this)
        print(
            f"round {r + 1}/{rounds}: "
            + ", ".join(f"{lb} {v['b1_p50']:.2f} ms / {v['b32_seq_s']:.0f} seq/s" for lb, v in this.items()),
            flush=True,
        )
    return calls, per_round


def speed_summary(calls, per_round, labels) -> dict[str, dict[str, Any]]:
    out = {}
    for label in labels:
        b1, b32 = np.asarray(calls[label]["b1"]), np.asarray(calls[label]["b32"])
        rec = {
            "b1_p50_ms": float(np.percentile(b1, 50)),
            "b1_p90_ms": float(np.percentile(b1, 90)),
            "b1_min_ms": float(b1.min()),
            "b1_calls": int(b1.size),
            "b32_p50_ms": float(np.percentile(b32, 50)),
            "b32_seq_s": float(32e3 / np.percentile(b32, 50)),
            "b32_calls": int(b32.size),
        }
        if BASELINE in calls and label != BASELINE:
            lat = [r[label]["b1_p50"] / r[BASELINE]["b1_p50"] for r in per_round]
            thr = [r[label]["b32_seq_s"] / r[BASELINE]["b32_seq_s"] for r in per_round]
            rec.update(
                {
                    "b1_p50_vs_baseline": rec["b1_p50_ms"] / out_or(calls, BASELINE, "b1"),
                    "b32_vs_baseline": rec["b32_seq_s"] / (32e3 / out_or(calls, BASELINE, "b32")),
                    "b1_ratio_per_round": [round(x, 3) for x in lat],
                    "b32_ratio_per_round": [round(x, 3) for x in thr],
                    "b1_ratio_median_round": statistics.median(lat),
                    "b32_ratio_median_round": statistics.median(thr),
                }
            )
        out[label] = rec
    return out


def out_or(calls, label, key) -> float:
    return statistics.median(calls[label][key])


def quality(runtimes, labels, texts, gold, invariance_n: int) -> dict[str, dict[str, Any]]:
    probs = {}
    for label in labels + ([REFERENCE] if REFERENCE not in labels else []):
        rt = runtimes[label]
        probs[label] = np.concatenate([rt.predict(texts[i : i + 32]) for i in range(0, len(texts), 32)])
        print(f"predicted {len(texts)} texts with {label}", flush=True)
    ref = probs[REFERENCE].argmax(-1)
    out = {}
    for label in labels:
        p = probs[label]
        rec: dict[str, Any] = {
            "n": len(texts),
            "agreement": float((p.argmax(-1) == ref).mean()),
            "disagreements": int((p.argmax(-1) != ref).sum()),
        }
        if gold is not None:
            rec["accuracy"] = float((p.argmax(-1) == np.asarray(gold)).mean())
        if invariance_n:
            alone = np.concatenate([runtimes[label].predict([t]) for t in texts[:invariance_n]])
            batched = p[:invariance_n]
            rec["invariance"] = {
                "n": invariance_n,
                "max_abs_dprob": float(np.abs(alone - batched).max()),
                "label_flips": int((alone.argmax(-1) != batched.argmax(-1)).sum()),
            }
        out[label] = rec
    return out


def goals(report: dict[str, Any]) -> dict[str, Any]:
    speed, qual = report["speed"], report.get("quality") or {}
    cands = []
    for label, s in speed.items():
        name = VARIANTS[label][0]
        bits = {"int8": 8, "bf16": 16, "fp32": 32}[name.split("-")[1]]
        agr = (qual.get(label) or {}).get("agreement")
        if agr is not None and agr >= bar_for(bits):
            cands.append((s["b1_p50_ms"], label))
    if not cands:
        return {"recommended": None, "why": "no agreement measured (speed only)" if not qual else "none meets the bar"}
    label = min(cands)[1]
    checks = []
    # the fastest label here, and ov-int8 (what the pipeline can recommend: the bf16-hint label is an option)
    for lb in dict.fromkeys([label, "ov-int8"]):
        if lb in speed and lb in qual:
            checks += _checks(lb, speed, qual)
    return {"recommended": label, "checks": checks}


def _checks(label: str, speed: dict[str, Any], qual: dict[str, Any]) -> list[dict[str, Any]]:
    s = dict(speed[label])
    if label == BASELINE:
        s.update({"b1_p50_vs_baseline": 1.0, "b32_vs_baseline": 1.0})
    agr = qual[label]["agreement"]
    return [
        {
            "name": f"{label} b1/s128 p50 / {BASELINE}",
            "value": s.get("b1_p50_vs_baseline"),
            "target": "<= 0.8",
            "passed": s.get("b1_p50_vs_baseline") is not None and s["b1_p50_vs_baseline"] <= 0.8,
        },
        {
            "name": f"{label} b32/s128 throughput / {BASELINE}",
            "value": s.get("b32_vs_baseline"),
            "target": ">= 1.3",
            "passed": s.get("b32_vs_baseline") is not None and s["b32_vs_baseline"] >= 1.3,
        },
        {
            "name": f"{label} agreement with {REFERENCE} ({qual[label]['n']} test reviews)",
            "value": agr,
            "target": ">= 0.991",
            "passed": agr >= 0.991,
        },
    ]


def render(report: dict[str, Any]) -> str:
    env, cfg = report["environment"], report["config"]
    cpu = env["cpu"]
    amx = [f for f in cpu["flags"] if f.startswith("amx")]
    L = [
        f"# OpenVINO vs ONNX Runtime vs torch: {report['model']}",
        "",
        f"Created {report['created']} by `benchmarks/studies/openvino_compare.py`. CPU: **{cpu['model']}**, "
        f"{cpu['cores']} logical cores, **AMX {'yes (' + ', '.join(amx) + ')' if amx else 'no'}**; flags: "
        f"{', '.join(cpu['flags'])}. {cfg['threads']} threads. **This machine is shared** with other jobs "
        f"(load average {env['load_avg_start']} at start, {env['load_avg_end']} at end), so only ratios measured "
        f"side by side here mean anything.",
        "",
        f"Speed: one process, every variant loaded through `load_runtime`; {cfg['rounds']} rounds, the order rotated "
        f"each round, {cfg['n1']} calls at b1/s{cfg['seq']} and {cfg['n32']} at b32/s{cfg['seq']} per variant per "
        "round (synthetic full-length batches). Ratios are against onnx-int8: of the pooled p50 and, in brackets, "
        "the median of the per-round ratios.",
        "",
    ]
    if report.get("random_weights"):
        L += ["**Random weights at DistilBERT-base dims: speed only** (agreement would be meaningless).", ""]
    qual = report.get("quality") or {}
    head = ["variant", f"p50 b1/s{cfg['seq']} (ms)", "vs onnx-int8", f"b32/s{cfg['seq']} (seq/s)", "vs onnx-int8"]
    if qual:
        n = next(iter(qual.values()))["n"]
        head += [f"agreement vs torch-fp32 ({n:,})", "accuracy", "b1 vs b32: max |Δp| (flips, 256 texts)"]
    rows = []
    for label, s in report["speed"].items():
        r = [
            label,
            f"{s['b1_p50_ms']:.2f}",
            f"{s['b1_p50_vs_baseline']:.2f}× ({s['b1_ratio_median_round']:.2f}×)" if "b1_p50_vs_baseline" in s else "1",
            f"{s['b32_seq_s']:.1f}",
            f"{s['b32_vs_baseline']:.2f}× ({s['b32_ratio_median_round']:.2f}×)" if "b32_vs_baseline" in s else "1",
        ]
        if qual:
            q = qual.get(label) or {}
            inv = q.get("invariance") or {}
            r += [
                f"{q['agreement']:.2%}" if q else "–",
                f"{q['accuracy']:.2%}" if q.get("accuracy") is not None else "–",
                f"{inv['max_abs_dprob']:.1e} ({inv['label_flips']})" if inv else "–",
            ]
        rows.append(r)
    L += ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    L += ["| " + " | ".join(r) + " |" for r in rows] + [""]
    g = report.get("goals") or {}
    if g.get("checks"):
        L += [
            f"## Goals (fastest here meeting the agreement bar: {g['recommended']}; and ov-int8, the pipeline's "
            "recommendation)",
            "",
            "| check | measured | target | result |",
            "|---|---:|---|---|",
        ]
        for c in g["checks"]:
            L.append(
                f"| {c['name']} | {c['value']:.3f} | {c['target']} | {'**pass**' if c['passed'] else '**FAIL**'} |"
            )
        L.append("")
    elif g:
        L += [f"Recommended: {g.get('recommended')} ({g.get('why')}).", ""]
    L += [
        "`ov-int8-bf16hint` is ov-int8 compiled with the bf16 inference-precision hint (its non-quantized ops "
        "in bf16; exporter option `inference_precision=bf16`). Per-round ratios, every call's statistics and the "
        "versions are in report.json.",
        "",
    ]
    return "\n".join(L)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", nargs="?", type=Path, help="checkpoint dir (default with --distilbert-base: built)")
    p.add_argument(
        "--distilbert-base",
        action="store_true",
        help="random-weight DistilBERT-base dims from benchmarks/studies/distilbert_base_speed.py (speed only)",
    )
    p.add_argument("--variants", type=Path, help="where the variants are / go (default: <checkpoint>/../variants)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--labels", default="ov-int8,ov-int8-bf16hint,ov-bf16,ov-fp32,onnx-int8,torch-bf16")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--n1", type=int, default=20, help="b1 calls per variant per round")
    p.add_argument("--n32", type=int, default=3, help="b32 calls per variant per round")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--eval-samples", type=int, default=2000)
    p.add_argument("--invariance", type=int, default=256, help="texts compared alone vs batched (0 = skip)")
    p.add_argument("--render", action="store_true", help="only re-render report.md (and goals) from --out/report.json")
    args = p.parse_args(argv)
    if args.render:
        report = json.loads((args.out / "report.json").read_text(encoding="utf-8"))
        report["goals"] = goals(report)
        write_report(args.out, report, render(report), echo=False)
        return 0
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[k] = str(args.threads)

    labels = args.labels.split(",")
    unknown = [lb for lb in labels if lb not in VARIANTS]
    if unknown:
        raise SystemExit(f"--labels: unknown {unknown}; known: {', '.join(VARIANTS)}")
    env = {"cpu": cpu_info(), "load_avg_start": load_avg()}
    ckpt = args.checkpoint
    random_weights = False
    if args.distilbert_base:
        ckpt = ckpt or ROOT / "models" / "distilbert-base-dims" / "checkpoint"
        if not (ckpt / "config.json").is_file():
            build_checkpoint(ckpt)
        random_weights = True
    if ckpt is None:
        raise SystemExit("give a CHECKPOINT dir, or --distilbert-base")
    root = args.variants or ckpt.parent / "variants"
    need = labels + ([REFERENCE] if not random_weights and REFERENCE not in labels else [])
    dirs = ensure_variants(ckpt, root, need)
    runtimes = {lb: load_runtime(d, "cpu", RuntimeOptions(threads=args.threads)) for lb, d in dirs.items()}
    report: dict[str, Any] = {
        "created": now_iso(),
        "model": next(iter(runtimes.values())).manifest.model_name,
        "random_weights": random_weights,
        "checkpoint": str(ckpt),
        "variants": {lb: str(d) for lb, d in dirs.items()},
        "config": {
            k: getattr(args, k) for k in ("threads", "rounds", "n1", "n32", "seq", "eval_samples", "invariance")
        },
    }
    calls, per_round = time_rounds(runtimes, labels, args.rounds, args.n1, args.n32, args.seq)
    report["speed"] = speed_summary(calls, per_round, labels)
    report["per_round"] = per_round
    if not random_weights:
        meta = read_model_meta(ckpt) or ModelMeta()
        test = review_split(
            args.eval_samples,
            meta.dataset or "default",
            pool=args.eval_samples,
            seed=meta.seed if meta.seed is not None else 42,
        )
        texts, gold = test.texts, test.labels
        report["quality"] = quality(runtimes, labels, texts, gold, args.invariance)
        report["dataset"] = {"name": test.dataset, "test_texts": len(texts)}
    env["load_avg_end"] = load_avg()
    env["versions"] = library_versions(("torch", "onnxruntime", "openvino", "nncf", "optimum-intel", "transformers"))
    report["environment"] = env
    report["goals"] = goals(report)
    report["provenance"] = provenance()
    write_report(args.out, report, render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
