"""Precision study: the same fine-tune once per precision, each in its own process.

    qserve train --compare --max-samples 2000 --max-length 128     # -> benchmarks/reports/precision/

Same data, seed and hyper-parameters for every run; only `--precision` changes. Each
run is a child `python -m qserve.train` process, so peak memory (RSS on CPU,
max_memory_reserved on CUDA) belongs to that precision alone. CPU runs 32-true,
bf16-mixed and bf16-true (16-mixed has no CPU path); CUDA runs all four (bf16 only
where the GPU supports it). Writes precision_study.json and precision_study.md, with
the seed project's A100 figures beside ours, labelled as a reference.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import fields
from pathlib import Path
from typing import Any

from qserve import QserveError

DEFAULT_DIR = "benchmarks/reports/precision"

# The seed project's published numbers (not measured by qserve): DistilBERT-base,
# IMDb 35k train reviews, 3 epochs, batch 12, one A100.
REFERENCE = {
    "setup": "DistilBERT-base (66M), IMDb 35k train, 3 epochs, batch 12, NVIDIA A100 (seed project, not ours)",
    "runs": {
        "32-true": {"train_time_min": 21.75, "peak_memory_gb": 5.37, "test_accuracy": 0.8992},
        "16-mixed": {"train_time_min": 7.25, "peak_memory_gb": 4.31, "test_accuracy": 0.9215},
        "bf16-mixed": {"train_time_min": 7.45, "peak_memory_gb": 4.46, "test_accuracy": 0.9261},
        "bf16-true": {"train_time_min": 5.22, "peak_memory_gb": 2.87, "test_accuracy": 0.9269},
    },
}


def supported_precisions(device: str) -> list[str]:
    from qserve.train import PRECISIONS

    if device == "cpu":
        return [p for p in PRECISIONS if p != "16-mixed"]
    import torch

    return [p for p in PRECISIONS if not p.startswith("bf16") or torch.cuda.is_bf16_supported()]


def child_argv(cfg, precision: str, out: Path) -> list[str]:
    """The `python -m qserve.train` command line reproducing cfg with another precision and --out."""
    argv = [sys.executable, "-m", "qserve.train"]
    for f in fields(cfg):
        v = getattr(cfg, f.name)
        flag = "--" + f.name.replace("_", "-")
        if f.name in ("precision", "out", "force"):
            continue
        if f.name in ("max_samples", "max_eval_samples") and v is None:
            argv += [flag, "0"]  # 0 = no cap on the command line
        elif v is not None:
            argv += [flag, str(v)]
    return argv + ["--precision", precision, "--out", str(out)]


def compare(cfg, precisions: list[str] | None, out_dir) -> dict[str, Any]:
    """Run cfg once per precision (children), write precision_study.json/.md in out_dir, return the study."""
    from qserve.artifact import library_versions, now_iso, refuse_existing, write_json_atomic, write_text_atomic
    from qserve.devices import cpu_info, resolve_device
    from qserve.train import PRECISIONS, validate

    validate(cfg)
    out_dir = Path(out_dir)
    device = resolve_device(cfg.device)
    supported = supported_precisions(device)
    if precisions:
        for p in precisions:
            if p not in PRECISIONS:
                raise QserveError(f"--precision must be one of {', '.join(PRECISIONS)} (got {p!r})")
            if p not in supported:
                raise QserveError(f"--precision {p} is not supported on {device}; this device runs "
                                  f"{', '.join(supported)}")
        chosen = list(dict.fromkeys(precisions))
    else:
        chosen = supported
    refuse_existing(out_dir / "precision_study.json", cfg.force)
    runs = []
    with tempfile.TemporaryDirectory(prefix="qserve-precision-") as tmp:
        for p in chosen:
            ckpt = Path(tmp) / p
            argv = child_argv(cfg, p, ckpt)
            print(f"== precision {p}: {' '.join(argv[1:])}", file=sys.stderr, flush=True)
            env = {**os.environ, "PYTHONUNBUFFERED": "1"}
            proc = subprocess.run(argv, env=env, check=False)
            metrics_path = ckpt / "train_metrics.json"
            if proc.returncode != 0 or not metrics_path.is_file():
                runs.append({"precision": p, "ok": False, "exit_code": proc.returncode,
                             "error": "the training run failed; its output is above"})
                continue
            import json

            m = json.loads(metrics_path.read_text(encoding="utf-8"))
            runs.append({"precision": p, "ok": True, **{k: m.get(k) for k in (
                "train_time_s", "wall_time_s", "optimizer_steps", "step_time_median_s", "samples_per_s",
                "peak_memory_bytes", "peak_memory_kind", "val_accuracy", "test_accuracy", "sizes", "device",
                "model_name")}, "gpu": m.get("gpu")})
    if not any(r["ok"] for r in runs):
        raise QserveError(f"every precision run failed ({', '.join(chosen)}); see the output above")
    by = {r["precision"]: r for r in runs if r["ok"]}
    base = by.get("32-true", {}).get("step_time_median_s")
    for r in runs:
        if r["ok"] and base:
            r["step_time_vs_32_true"] = round(r["step_time_median_s"] / base, 3)
    study = {
        "device": device, "cpu": cpu_info(), "precisions": chosen, "runs": runs,
        "bf16_mixed_over_32_true_step_time": by.get("bf16-mixed", {}).get("step_time_vs_32_true"),
        "config": {f.name: getattr(cfg, f.name) for f in fields(cfg) if f.name not in ("precision", "out", "force")},
        "reference": REFERENCE, "versions": library_versions(), "created": now_iso(),
    }
    write_json_atomic(out_dir / "precision_study.json", study)
    write_text_atomic(out_dir / "precision_study.md", render_markdown(study))
    return study


def _fmt(v, spec: str, scale: float = 1.0) -> str:
    return "—" if v is None else format(v * scale, spec)


def render_markdown(study: dict[str, Any]) -> str:
    cfg = study["config"]
    ok = [r for r in study["runs"] if r["ok"]]
    sizes = ok[0]["sizes"] if ok else {}
    where = study["device"] if study["device"] == "cpu" else (ok[0].get("gpu") if ok else study["device"])
    lines = [
        "# Precision study (qserve)", "",
        f"Model `{ok[0]['model_name'] if ok else cfg['model']}` fine-tuned on `{cfg['dataset']}` "
        f"(train {sizes.get('train')}, val {sizes.get('val')}, test {sizes.get('test')}), {cfg['epochs']} epoch(s), "
        f"batch {cfg['batch_size']}, max length {cfg['max_length']}, lr {cfg['lr']}, seed {cfg['seed']}, "
        f"on {where} ({study['cpu']['model']}, {study['cpu']['cores']} cores, flags: "
        f"{' '.join(study['cpu']['flags'])}). Each precision ran in its own process.", "",
        "| precision | train time (min) | median step (s) | step time vs 32-true | samples/s | peak memory (GB) "
        "| val acc | test acc |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in study["runs"]:
        if not r["ok"]:
            lines.append(f"| {r['precision']} | failed (exit {r['exit_code']}) | | | | | | |")
            continue
        lines.append(f"| {r['precision']} | {_fmt(r['train_time_s'], '.2f', 1 / 60)} | "
                     f"{_fmt(r['step_time_median_s'], '.4f')} | {_fmt(r.get('step_time_vs_32_true'), '.2f')}x | "
                     f"{_fmt(r['samples_per_s'], '.1f')} | {_fmt(r['peak_memory_bytes'], '.2f', 1e-9)} | "
                     f"{_fmt(r['val_accuracy'], '.2%', 1)} | {_fmt(r['test_accuracy'], '.2%', 1)} |")
    ratio = study.get("bf16_mixed_over_32_true_step_time")
    kind = ok[0]["peak_memory_kind"] if ok else ""
    lines += ["", f"bf16-mixed / 32-true median step time: **{_fmt(ratio, '.2f')}x**. Peak memory is {kind}.", "",
              "## Reference: the seed project's A100 figures (not measured by qserve)", "",
              f"{study['reference']['setup']}.", "",
              "| precision | train time (min) | peak memory (GB) | test acc |", "|---|---:|---:|---:|"]
    for p, r in study["reference"]["runs"].items():
        lines.append(f"| {p} | {r['train_time_min']:.2f} | {r['peak_memory_gb']:.2f} | {r['test_accuracy']:.2%} |")
    lines += ["", "Different model, data size, epochs and hardware: compare the ratios between precisions, "
              "not the absolute numbers.", ""]
    return "\n".join(lines)
