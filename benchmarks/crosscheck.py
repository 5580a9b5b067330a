"""Cross-check qserve bench's timings against plain onnxruntime / torch loops written without qserve.

    python -m benchmarks.crosscheck                       # uses models/distilbert-base-dims/variants
    python -m benchmarks.crosscheck --variants-root DIR --threads 2 --seq 128 --batch 1

In one run: `qserve bench` (run_bench) measures torch-fp32 and onnx-int8 at b1/s128;
then, each in a fresh process with the same thread settings, a plain
`onnxruntime.InferenceSession` on the variant's model.onnx and a plain
`AutoModelForSequenceClassification` (fp32, torch.inference_mode) are timed on the
same input ids ([CLS] + the same tiled WordPiece ids + [SEP], full mask). The plain
loops run once before and once after the bench (a shared machine drifts; the two
p50s bracket it) and the ratio is qserve p50 / mean of the plain p50s: near 1.0 means
the harness adds nothing and measures what the libraries do. The whole bracket runs
--rounds times (default 5) and each variant is judged by its median round: bursts on a
shared machine last tens of seconds and land in one round, on one side.
Writes benchmarks/reports/crosscheck.md and crosscheck.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.harness import ROOT, write_report
from qserve.bench import BenchConfig, run_bench
from qserve.files import now_iso
from qserve.provenance import provenance

# The same text qserve's bench tiles when no dataset text is given (real_text_samples=0 below):
# copied, not imported, so this file shares no code path with the harness it checks.
TEXT = (
    "The film opens slowly, but the performances are strong and the story builds to an ending "
    "that feels earned. Some scenes drag, and the dialogue is uneven, yet I would watch it again."
)


def make_ids(variant_dir: Path, batch: int, seq: int):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(variant_dir)
    ids = tok(TEXT, truncation=True, max_length=128)["input_ids"]
    cls_id, sep_id, body = ids[0], ids[-1], np.asarray(ids[1:-1], dtype=np.int64)
    rows = [np.concatenate([[cls_id], body[(np.arange(seq - 2) + 7 * r) % body.size], [sep_id]]) for r in range(batch)]
    input_ids = np.asarray(rows, dtype=np.int64)
    return input_ids, np.ones_like(input_ids)


def timed(fn, warmup: int, budget_s: float, min_iters: int = 5) -> list[float]:
    for _ in range(warmup):
        fn()
    out: list[float] = []
    start = time.perf_counter()
    while len(out) < min_iters or time.perf_counter() - start < budget_s:
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def child(kind: str, variant_dir: str, threads: int, batch: int, seq: int, budget: float, warmup: int) -> dict:
    """Runs in a fresh process: the plain loop, no qserve import at all."""
    vdir = Path(variant_dir)
    input_ids, mask = make_ids(vdir, batch, seq)
    if kind == "onnx":
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        # The one graph setting qserve's CPU runtime changes (see qserve/runtime/onnx_rt.py), so both
        # loops run the same kernels and the ratio measures the harness, not the fusion.
        sess = ort.InferenceSession(
            str(vdir / "model.onnx"),
            so,
            providers=["CPUExecutionProvider"],
            disabled_optimizers=["SkipLayerNormFusion"],
        )
        names = [i.name for i in sess.get_inputs()]
        feed = {"input_ids": input_ids, "attention_mask": mask}
        feed = {n: feed[n] if n in feed else np.zeros_like(input_ids) for n in names}
        samples = timed(lambda: sess.run(None, feed), warmup, budget)
        lib = {"onnxruntime": ort.__version__}
    else:
        import torch
        from transformers import AutoModelForSequenceClassification

        torch.set_num_threads(threads)
        model = AutoModelForSequenceClassification.from_pretrained(vdir, dtype=torch.float32).eval()
        ids_t, mask_t = torch.from_numpy(input_ids), torch.from_numpy(mask)

        def run():
            with torch.inference_mode():
                return model(input_ids=ids_t, attention_mask=mask_t).logits

        samples = timed(run, warmup, budget)
        lib = {"torch": torch.__version__, "torch_threads": torch.get_num_threads()}
    return {
        "kind": kind,
        "count": len(samples),
        "p50": statistics.median(samples),
        "mean": statistics.fmean(samples),
        "min": min(samples),
        "lib": lib,
    }


def run_child(kind: str, vdir: Path, args) -> dict:
    env = dict(
        os.environ,
        OMP_NUM_THREADS=str(args.threads),
        MKL_NUM_THREADS=str(args.threads),
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        QSERVE_FORCE_CPU="1",
    )
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = Path(f.name)
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.crosscheck",
        "--child",
        kind,
        str(vdir),
        str(out),
        "--threads",
        str(args.threads),
        "--batch",
        str(args.batch),
        "--seq",
        str(args.seq),
        "--time-budget",
        str(args.time_budget),
    ]
    subprocess.run(cmd, check=True, env=env, cwd=ROOT)
    res = json.loads(out.read_text())
    out.unlink()
    return res


def render_md(data: dict) -> str:
    b, s, t = data["batch"], data["seq"], data["threads"]
    L = [
        f"# Cross-check: qserve bench vs plain library loops (b{b}/s{s}, threads={t})",
        "",
        f"Created {data['created']}. qserve numbers come from `run_bench` (child process, `load_runtime`, "
        "forward + synchronize); plain numbers from a separate fresh process per library with no qserve "
        "import: `onnxruntime.InferenceSession(model.onnx)` with intra_op_num_threads and, like qserve's CPU "
        "runtime, SkipLayerNormFusion off; and "
        "`AutoModelForSequenceClassification` fp32 under `torch.inference_mode()` with `torch.set_num_threads`. "
        "Same input ids, same thread count. Ratio = qserve p50 / mean of the two plain p50s, per round; "
        f"{data.get('rounds', 1)} rounds, each variant's median round shown and judged (a burst on this shared "
        "machine lands in one round, on one side).",
        "",
        "| variant | qserve p50 (ms) | plain p50 before / after (ms) | ratio (median round) | qserve calls | "
        "plain calls | ratio per round |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for name, row in data["rows"].items():
        L.append(
            f"| {name} | {row['qserve_p50']:.2f} | {row['plain_before']['p50']:.2f} / "
            f"{row['plain_after']['p50']:.2f} | {row['ratio']:.3f} | {row['qserve_count']} | "
            f"{row['plain_before']['count']} + {row['plain_after']['count']} | "
            f"{', '.join(f'{x:.3f}' for x in row.get('round_ratios', [row['ratio']]))} |"
        )
    sq, sp = data.get("speedup_qserve"), data.get("speedup_plain")
    if sq and sp:
        L += [
            "",
            f"onnx-int8 speed-up over torch-fp32: **{sq:.2f}×** by qserve bench, **{sp:.2f}×** by the plain loops.",
        ]
    L += ["", f"Verdict: {data['verdict']}", ""]
    return "\n".join(L)


def one_round(pairs: dict, args: argparse.Namespace, BenchConfig, run_bench) -> tuple[dict, dict]:
    """Plain loops, then qserve bench, then plain loops again: one bracketed comparison per variant."""
    before = {name: run_child(kind, d, args) for name, (kind, d) in pairs.items()}
    with tempfile.TemporaryDirectory() as tmp:
        cfg = BenchConfig(
            batch_sizes=[args.batch],
            seq_lens=[args.seq],
            threads=args.threads,
            device="cpu",
            out=Path(tmp) / "bench",
            accuracy=False,
            real_text_samples=0,
            floor=False,
            time_budget_s=args.time_budget,
            warmup=5,
            min_iters=5,
        )
        report = run_bench([d for _, d in pairs.values()], cfg)
    rows: dict = {}
    for v in report["variants"]:
        name = (v.get("spec") or {}).get("name")
        st = next((r for r in v.get("fixed") or [] if "p50" in r), None)
        if v["status"] != "ok" or st is None:
            raise SystemExit(f"qserve bench failed for {name}: {v.get('error')}")
        after = run_child(pairs[name][0], pairs[name][1], args)
        plain_p50 = (before[name]["p50"] + after["p50"]) / 2
        rows[name] = {
            "qserve_p50": st["p50"],
            "qserve_count": st["count"],
            "plain_p50": plain_p50,
            "ratio": st["p50"] / plain_p50,
            "plain_before": before[name],
            "plain_after": after,
            "qserve": {k: st[k] for k in ("count", "mean", "p50", "p90", "p99", "min")},
        }
    return report, rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants-root", type=Path, default=ROOT / "models" / "distilbert-base-dims" / "variants")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "reports")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--time-budget", type=float, default=5.0)
    p.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="bracketed rounds; the verdict uses each variant's median round ratio (default 5)",
    )
    p.add_argument("--tolerance", type=float, default=0.10, help="|ratio - 1| counted as agreement (default 0.10)")
    p.add_argument("--child", nargs=3, metavar=("KIND", "VARIANT_DIR", "OUT_JSON"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        kind, vdir, out = args.child
        res = child(kind, vdir, args.threads, args.batch, args.seq, args.time_budget, warmup=5)
        Path(out).write_text(json.dumps(res))
        return 0

    pairs = {
        "torch-fp32": ("torch", args.variants_root / "torch-fp32"),
        "onnx-int8": ("onnx", args.variants_root / "onnx-int8"),
    }
    missing = [str(d) for _, d in pairs.values() if not (d / "manifest.json").is_file()]
    if missing:
        raise SystemExit(
            f"missing variants: {', '.join(missing)}; run `python -m benchmarks.studies.distilbert_base_speed` first"
        )
    results = [one_round(pairs, args, BenchConfig, run_bench) for _ in range(args.rounds)]
    rounds = [r for _, r in results]
    rows = {}
    for name in pairs:
        per = [r[name] for r in rounds]
        # The median round: a burst on this shared machine lands in one round, on one side.
        mid = sorted(per, key=lambda r: r["ratio"])[len(per) // 2]
        rows[name] = {
            **mid,
            "ratio": statistics.median(r["ratio"] for r in per),
            "round_ratios": [r["ratio"] for r in per],
        }
    report = results[-1][0]
    ok = all(abs(r["ratio"] - 1) <= args.tolerance for r in rows.values())
    data = {
        "created": now_iso(),
        "batch": args.batch,
        "seq": args.seq,
        "threads": args.threads,
        "tolerance": args.tolerance,
        "rounds": args.rounds,
        "rows": rows,
        "speedup_qserve": rows["torch-fp32"]["qserve_p50"] / rows["onnx-int8"]["qserve_p50"],
        "speedup_plain": rows["torch-fp32"]["plain_p50"] / rows["onnx-int8"]["plain_p50"],
        "environment": report["environment"],
        "provenance": provenance(),
        "verdict": (
            f"qserve bench and the plain loops agree within ±{args.tolerance:.0%} for both variants."
            if ok
            else f"DISAGREE: at least one ratio is outside 1 ± {args.tolerance:.0%}; "
            "investigate before trusting the report."
        ),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    write_report(args.out, data, render_md(data), stem="crosscheck")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
