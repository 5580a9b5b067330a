"""Speed-only benchmark on DistilBERT-base dimensions with RANDOM weights (no accuracy).

    python -m benchmarks.studies.distilbert_base_speed --threads 2
    python -m benchmarks.studies.distilbert_base_speed --threads 2 --seq-lens 128 --batch-sizes 1,8   # quicker

Builds DistilBertForSequenceClassification with dim 768, 6 layers, 12 heads, FFN 3072,
vocab 30522 (66M parameters, the size of distilbert-base-uncased) from a fixed seed,
with the embedded uncased WordPiece tokenizer, and saves it as
models/distilbert-base-dims/checkpoint (model_name `distilbert-base-dims-random`: the
weights are random, so only speed, memory and size mean anything here). It exports
torch-fp32, torch-bf16, onnx-fp32, onnx-int8, onnx-int4 and bnb-int8 through
`exporters.export`, runs `qserve bench` on them (speed only, same run, same threads)
and writes benchmarks/reports/distilbert-base-dims/. Existing checkpoint and variants
are reused; --rebuild re-creates them. The report's Checks section states whether
onnx-int8 is >= 3.0x faster than torch-fp32 at b1/s128 and within 1.5x of the int8
compute floor (a statement of what was measured, never an assertion).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

import exporters
from benchmarks.harness import ROOT
from qserve.bench import BenchConfig, run_bench
from qserve.bench.config import parse_int_list
from qserve.bench.report import write_reports
from qserve.files import staged_dir, write_json_atomic
from qserve.modeling import default_tokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

MODEL_NAME = "distilbert-base-dims-random"
VARIANTS = ["torch-fp32", "torch-bf16", "onnx-fp32", "onnx-int8", "onnx-int4", "bnb-int8"]
DIMS = {
    "vocab_size": 30522,
    "dim": 768,
    "n_layers": 6,
    "n_heads": 12,
    "hidden_dim": 3072,
    "max_position_embeddings": 512,
}


def build_checkpoint(out: Path, seed: int = 0) -> Path:
    """Random-weights DistilBERT-base-dims classifier + embedded tokenizer + qserve_model.json."""
    import torch
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    tok = default_tokenizer()
    if tok.vocab_size != DIMS["vocab_size"]:
        raise SystemExit(f"the embedded tokenizer has {tok.vocab_size} tokens, expected {DIMS['vocab_size']}")
    torch.manual_seed(seed)
    cfg = DistilBertConfig(
        **DIMS, num_labels=2, id2label={0: "negative", 1: "positive"}, label2id={"negative": 0, "positive": 1}
    )
    model = DistilBertForSequenceClassification(cfg).eval()
    n = sum(p.numel() for p in model.parameters())
    logging.info("built %s: %.1fM parameters (random weights, seed %d)", MODEL_NAME, n / 1e6, seed)
    with staged_dir(out, force=True) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        write_json_atomic(
            tmp / "qserve_model.json",
            {
                "model_name": MODEL_NAME,
                "max_length": 128,
                "note": f"random weights (seed {seed}); speed only",
                "parameters": n,
            },
        )
    return out


def export_all(ckpt: Path, root: Path, names: list[str], rebuild: bool) -> tuple[list[Path], dict[str, str]]:
    dirs, failed = [], {}
    for name in names:
        dest = root / name
        if (dest / "manifest.json").is_file() and not rebuild:
            logging.info("reusing %s", dest)
            dirs.append(dest)
            continue
        try:
            exporters.export(ckpt, name, dest, force=True)
            dirs.append(dest)
        except Exception as e:  # one backend missing must not stop the others
            failed[name] = f"{type(e).__name__}: {e}"
            logging.error("export %s failed: %s", name, failed[name])
    return dirs, failed


def checks(report: dict) -> list[dict]:
    """onnx-int8 vs torch-fp32 (>= 3.0x) and vs the int8 floor (<= 1.5x) at the headline shape."""
    b, s = report["headline"]["batch"], report["headline"]["seq"]
    v = {x["name"]: x for x in report["variants"] if x["status"] == "ok"}
    int8 = v.get("onnx-int8") or {}
    floor = int8.get("floor") or {}
    speed = int8.get("speedup_vs_torch_fp32")
    ratio = floor.get("p50_over_floor") if floor.get("peak") == "int8" else None
    mratio = floor.get("model_p50_over_floor") if floor.get("model_peak") == "int8" else None
    return [
        {
            "name": f"onnx-int8 speed-up vs torch-fp32, p50 b{b}/s{s}",
            "value": speed,
            "unit": "×",
            "target": ">= 3.0×",
            "passed": None if speed is None else speed >= 3.0,
        },
        {
            "name": f"onnx-int8 p50 / int8 compute floor (machine peak), b{b}/s{s}",
            "value": ratio,
            "unit": "×",
            "target": "<= 1.5×",
            "passed": None if ratio is None else ratio <= 1.5,
        },
        {
            "name": f"onnx-int8 p50 / int8 floor at the model's GEMM shapes, b{b}/s{s}",
            "value": mratio,
            "unit": "×",
            "target": "(context)",
            "passed": None,
        },
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--models",
        type=Path,
        default=ROOT / "models" / "distilbert-base-dims",
        help="where the checkpoint and variants go (default %(default)s)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=ROOT / "benchmarks" / "reports" / "distilbert-base-dims",
        help="report directory (default %(default)s; replaced if present)",
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch-sizes", default="1,8,32")
    p.add_argument("--seq-lens", default="32,128,256")
    p.add_argument("--time-budget", type=float, default=4.0, help="seconds per shape (default %(default)s)")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated (default: all six)")
    p.add_argument("--rebuild", action="store_true", help="re-create the checkpoint and re-export every variant")
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    ckpt = args.models / "checkpoint"
    if args.rebuild or not (ckpt / "config.json").is_file():
        build_checkpoint(ckpt)
    dirs, export_failed = export_all(ckpt, args.models / "variants", args.variants.split(","), args.rebuild)
    if not dirs:
        raise SystemExit("no variant could be exported; see the errors above")
    cfg = BenchConfig(
        batch_sizes=parse_int_list(args.batch_sizes, "--batch-sizes"),
        seq_lens=parse_int_list(args.seq_lens, "--seq-lens"),
        threads=args.threads,
        device=args.device,
        out=args.out,
        accuracy=False,
        time_budget_s=args.time_budget,
        name="distilbert-base-dims",
        force=True,
    )
    report = run_bench(dirs, cfg)
    report["checks"] = checks(report)
    report["suite"] = {
        "script": "benchmarks/studies/distilbert_base_speed.py",
        "model": MODEL_NAME,
        "dims": DIMS,
        "random_weights": True,
        "export_failures": export_failed,
    }
    write_reports(report, args.out)
    for c in report["checks"]:
        print(
            f"{c['name']}: {c['value'] if c['value'] is None else round(c['value'], 2)} "
            f"(target {c['target']}) -> {c['passed']}"
        )
    print(f"report: {args.out / 'report.md'}")
    print(json.dumps({"export_failures": export_failed}) if export_failed else "all variants exported")
    return 0


if __name__ == "__main__":
    sys.exit(main())
