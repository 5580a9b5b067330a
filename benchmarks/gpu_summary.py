"""The offline GPU check's summary: every stage's outcome, versions and numbers, as JSON and as markdown.

    python -m benchmarks.gpu_tools summary WORK_DIR OUT_DIR      # the CLI (run by benchmarks/gpu_check.sh)

collect() reads the work dir, render() makes the md; gpu_tools.summary writes both with provenance.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


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
    """Everything the check produced, as one JSON-shaped dict (what gpu_tools.summary writes)."""
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
        L.append(f"| {name} | {t['precision']} | {t.get('matmul_precision') or 'default'} | "
                 f"{_f(t['train_time_s'], '.1f')} | "
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
