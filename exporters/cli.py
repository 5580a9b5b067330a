"""`qserve export` and `qserve variants`: the commands users type first.

    qserve export models/minilm-l6-distilbert-imdb --bits 8        # onnx-int8 on CPU, bnb-int8 on CUDA
    qserve export models/minilm-l6-distilbert-imdb --all            # every variant this device runs
    qserve variants                                                  # what exists, with size and parity
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from qserve import QserveError

# Exporter options: flag -> (option key, the variants that understand it).
OPTION_FLAGS = {
    "per_channel": ("--per-channel", {"onnx-int8"}),
    "smooth": ("--smooth", {"onnx-int8"}),
    "correct_bias": ("--correct-bias", {"onnx-int8"}),
    "clip": ("--clip", {"bnb-nf4", "bnb-fp4"}),
    "calibration_samples": ("--calibration-samples", {"onnx-int8", "bnb-nf4", "bnb-fp4", "ov-int8"}),
    "keep_fp32": ("--keep-fp32", {"onnx-int8"}),
    "inference_precision": ("--inference-precision", {"ov-int8"}),
    "activation_scales": ("--activation-scales", {"onnx-int8"}),
    "row_by_row": ("--row-by-row", {"onnx-int8"}),
    "block_size": ("--block-size", {"onnx-int4"}),
    "accuracy_level": ("--accuracy-level", {"onnx-int4"}),
    "quantize_embeddings": ("--quantize-embeddings", {"onnx-int4"}),
    "llm_int8_threshold": ("--llm-int8-threshold", {"bnb-int8"}),
    "double_quant": ("--double-quant", {"bnb-nf4", "bnb-fp4"}),
}


def default_out_root(checkpoint: Path) -> Path:
    """Variants of models/X land in models/X-variants/<name>: beside, never inside, the checkpoint
    (inside would change the checkpoint's own hash recorded in every manifest)."""
    return checkpoint.parent / f"{checkpoint.name}-variants"


def options_for(name: str, args: argparse.Namespace, strict: bool) -> dict:
    opts = {}
    for key, (flag, owners) in OPTION_FLAGS.items():
        value = getattr(args, key, None)
        if value is None:
            continue
        if name in owners:
            opts[key] = value
        elif strict:
            raise QserveError(f"{flag} applies to {', '.join(sorted(owners))}, not {name}")
    return opts


def cmd_export(args: argparse.Namespace) -> int:
    from qserve.devices import resolve_device
    from qserve.variants import get_spec, resolve, supported

    checkpoint = Path(args.checkpoint)
    if not (checkpoint / "config.json").is_file():
        raise QserveError(f"CHECKPOINT {checkpoint} is not a checkpoint directory (no config.json); "
                          "pass a directory written by `qserve train` or save_pretrained")
    device = resolve_device(args.device)
    if args.long_text:
        from exporters.core import variant_policy

        variant_policy(checkpoint, args.long_text)  # a bad policy fails once, before any variant is built
    if args.all:
        if args.bits or args.backend or args.dtype or args.variant:
            raise QserveError("--all exports every supported variant; do not combine it with "
                              "--bits/--backend/--dtype/--variant")
        specs = supported(device, include_slow=args.include_slow)
    elif args.variant:
        specs = [get_spec(args.variant)]
    elif args.bits:
        specs = [resolve(args.bits, args.backend, args.dtype, device)]
    else:
        raise QserveError("say what to export: --bits {32,16,8,4} (optionally --backend/--dtype), "
                          "--variant NAME, or --all")
    root = Path(args.out) if args.out else default_out_root(checkpoint)
    # A single variant with --out names the variant dir itself; several go under it.
    single_dir = len(specs) == 1 and args.out is not None and not args.all
    failures = []
    import exporters
    from qserve.runtime.ov_probe import OpenVINOUnavailable

    for i, spec in enumerate(specs, 1):
        dest = root if single_dir else root / spec.name
        if dest.exists() and args.all and not args.force and (dest / "manifest.json").is_file():
            print(f"[{i}/{len(specs)}] {spec.name}: exists at {dest}, kept (use --force to rebuild)")
            continue
        print(f"[{i}/{len(specs)}] {spec.name}: exporting to {dest} ...", flush=True)
        t0 = time.perf_counter()
        try:
            m = exporters.export(checkpoint, spec.name, dest, force=args.force,
                                 options=options_for(spec.name, args, strict=not args.all), device=device,
                                 long_text=args.long_text)
        except OpenVINOUnavailable as e:
            if not args.all:
                raise
            # A CPU whose OpenVINO plugin crashes or lacks bf16 skips those variants; the rest go on.
            print(f"    skipped: {e}", file=sys.stderr)
            continue
        except QserveError:
            if not args.all:
                raise
            failures.append(spec.name)
            print(f"    failed: {sys.exc_info()[1]}", file=sys.stderr)
            continue
        p = m["parity"]
        size = sum(f["bytes"] for f in m["files"].values())
        print(f"    done in {time.perf_counter() - t0:.1f}s: {size / 1e6:.1f} MB, long text {m['long_text']}, "
              f"parity max|Δlogit| "
              f"{p['max_abs_logit_diff']:.3g} (tol {p['tolerance']:g}), probe agreement {p['agreement']:.0%}")
    if failures:
        print(f"failed: {', '.join(failures)}", file=sys.stderr)
        return 1
    return 0


def find_variants(paths: list[Path]) -> list[Path]:
    out = []
    for p in paths:
        if (p / "manifest.json").is_file():
            out.append(p)
        elif p.is_dir():
            out.extend(sorted(m.parent for m in p.rglob("manifest.json") if not m.parent.name.startswith(".")))
    return out


def cmd_variants(args: argparse.Namespace) -> int:
    from qserve.artifact import VariantError, verify

    rows = []
    for d in find_variants([Path(p) for p in (args.paths or ["models"])]):
        try:
            m = verify(d, check_hashes=args.verify)
            p = m.get("parity", {})
            size = sum(f["bytes"] for f in m["files"].values())
            rows.append({"path": str(d), "variant": m["spec"]["name"], "model": m.get("model_name"),
                         "size_mb": round(size / 1e6, 2), "max_abs_logit_diff": p.get("max_abs_logit_diff"),
                         "agreement": p.get("agreement"), "created": m.get("created"), "status": "ok"})
        except VariantError as e:
            rows.append({"path": str(d), "variant": "?", "status": f"invalid: {e}"})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print(f"no variants under {', '.join(args.paths or ['models'])}; create one with `qserve export`")
        return 0
    print(f"{'variant':<11} {'size MB':>8} {'max|Δ|':>8} {'agree':>6}  {'model':<32} path")
    for r in rows:
        if r["status"] != "ok":
            print(f"{'?':<11} {'':>8} {'':>8} {'':>6}  {'':<32} {r['path']}  ({r['status']})")
            continue
        print(f"{r['variant']:<11} {r['size_mb']:>8.2f} {r['max_abs_logit_diff']:>8.3g} "
              f"{r['agreement']:>6.0%}  {str(r['model']):<32} {r['path']}")
    return 0


def register(sub) -> None:
    from qserve.variants import VARIANTS

    p = sub.add_parser("export", help="turn a checkpoint into quantized / converted variants",
                       description="Export a fine-tuned checkpoint to a served-ready variant directory "
                                   "(weights + tokenizer + manifest.json). Defaults per --bits on CPU: "
                                   "32 -> onnx-fp32, 16 -> torch-bf16, 8 -> onnx-int8, 4 -> onnx-int4; "
                                   "on CUDA: 32 -> torch-fp32, 16 -> torch-fp16, 8 -> bnb-int8, 4 -> bnb-nf4.")
    p.add_argument("checkpoint", help="checkpoint directory (from `qserve train` or save_pretrained)")
    p.add_argument("--bits", type=int, choices=[32, 16, 8, 4], help="weight bits; picks the device's default backend")
    p.add_argument("--backend", choices=["torch", "bnb", "onnx", "openvino"], help="with --bits: which backend produces it")
    p.add_argument("--dtype", choices=["fp32", "fp16", "bf16", "int8", "nf4", "fp4", "int4"],
                   help="with --bits: which storage type (e.g. --bits 16 --dtype fp16)")
    p.add_argument("--variant", choices=list(VARIANTS), help="name the variant directly")
    p.add_argument("--all", action="store_true", help="every variant the device supports (existing ones kept)")
    p.add_argument("--include-slow", action="store_true",
                   help="with --all: also variants that run but only slowly here (torch-fp16 on CPU)")
    p.add_argument("--out", help="output dir (single variant: the variant dir; --all: the parent). "
                                 "Default: <checkpoint>-variants/<variant>")
    p.add_argument("--force", action="store_true", help="replace an existing variant directory")
    p.add_argument("--device", default="auto", help="auto|cpu|cuda: device for defaults and the parity check")
    p.add_argument("--long-text", metavar="POLICY",
                   help="what the variant reads of a text longer than max_length, recorded in its manifest and "
                        "served by default: head, tail, head-tail[:H] or windows[:W[:S[:mean|max]]] (default: the "
                        "checkpoint's qserve_model.json, else head)")
    p.add_argument("--per-channel", action=argparse.BooleanOptionalAction, default=None,
                   help="onnx-int8: one weight scale per output channel (default on: on the embedded default "
                        "it lifts agreement with fp32 from 96.8%% to 99.0%% for ~4%% latency)")
    p.add_argument("--smooth", action=argparse.BooleanOptionalAction, default=None,
                   help="onnx-int8: smooth activation outliers into the weights before quantizing (default on)")
    p.add_argument("--correct-bias", action=argparse.BooleanOptionalAction, default=None,
                   help="onnx-int8: take the mean int8-vs-fp32 logit shift on calibration texts out of the output "
                        "bias (default on: agreement with fp32 98.75%% -> 99.05%% on the embedded default)")
    p.add_argument("--calibration-samples", type=int,
                   help="onnx-int8, bnb-nf4/fp4, ov-int8: training texts that calibrate onnx-int8's smoothing and "
                        "bias correction, bnb's clipping (default 64), or NNCF's ov-int8 quantization (default 300)")
    p.add_argument("--keep-fp32", metavar="PATTERNS",
                   help="onnx-int8: comma-separated parts of MatMul node names to leave in fp32, e.g. "
                        "'layer.0/ffn/lin2,layer.1/ffn/lin2' (more accurate, larger, slower)")
    p.add_argument("--inference-precision", choices=["f32", "bf16"],
                   help="ov-int8: precision of the ops NNCF leaves unquantized (default f32; bf16 needs a CPU "
                        "with avx512_bf16 or AMX)")
    p.add_argument("--activation-scales", choices=["per-tensor", "per-row"],
                   help="onnx-int8: per-tensor (default: ORT dynamic quantization, one scale per batch; the runtime "
                        "runs it row by row) or per-row (each token row its own scale in the graph; rows independent "
                        "when batched, slower at batch 1; see README)")
    p.add_argument("--row-by-row", action=argparse.BooleanOptionalAction, default=None,
                   help="onnx-int8 per-tensor: the runtime runs batches row by row (default on: one text, one "
                        "answer); --no-row-by-row records that it forwards them as one batch, as before (answers "
                        "move with batchmates: for side-by-side comparison)")
    p.add_argument("--block-size", type=int, help="onnx-int4: quantization block size (default 32)")
    p.add_argument("--accuracy-level", type=int, choices=[0, 1, 2, 3, 4],
                   help="onnx-int4: MatMulNBits accuracy_level (4 = int8 compute, fastest on CPU; default 4)")
    p.add_argument("--quantize-embeddings", action=argparse.BooleanOptionalAction, default=None,
                   help="onnx-int4: also quantize the word-embedding Gather to 4 bits")
    p.add_argument("--llm-int8-threshold", type=float, help="bnb-int8: outlier threshold (default 6.0)")
    p.add_argument("--double-quant", action=argparse.BooleanOptionalAction, default=None, help="bnb-nf4/fp4: quantize the scales too")
    p.add_argument("--clip", action=argparse.BooleanOptionalAction, default=None,
                   help="bnb-nf4/fp4: clip each 64-weight block to the range that minimises its output error on "
                        "calibration texts before quantizing (default on for fp4: agreement with fp32 on the "
                        "embedded default 96.4%% -> 98.3%%; off for nf4, where it changed nothing beyond noise)")
    p.set_defaults(func=cmd_export)

    v = sub.add_parser("variants", help="list variant directories with size and parity")
    v.add_argument("paths", nargs="*", help="variant dirs or folders to search (default: models)")
    v.add_argument("--verify", action="store_true", help="also check every file's sha256 (slower)")
    v.add_argument("--json", action="store_true", help="machine-readable output")
    v.set_defaults(func=cmd_variants)
