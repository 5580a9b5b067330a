"""What one resumable training checkpoint costs, on the embedded default model (22.7M parameters).

    python -m benchmarks.studies.checkpoint_cost --saves 5      # writes benchmarks/reports/checkpoint_cost/

Builds exactly what `qserve train` checkpoints for each precision (model, AdamW with its state after
one step, or torch-optimi's Kahan AdamW on bf16 weights for bf16-true, the LR scheduler, RNG states,
the data generator, progress) and writes it with qserve.training.resume.save (fabric.save to a temp file, fsync,
rename) --saves times into a scratch dir beside --out. Reports per precision: the file's size, the median
wall seconds and process CPU seconds per checkpoint, and its share of training time at the default
interval (one checkpoint per ~300 s of training: share = t / (300 + t)). Goal: under 2%.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness import ROOT, write_report
from qserve.devices import cpu_label
from qserve.files import now_iso
from qserve.modeling import load_for_training
from qserve.provenance import provenance
from qserve.training import resume
from qserve.training.precision import build_optimizer


def measure(precision: str, saves: int, scratch: Path, model_name: str = "default") -> dict:
    import torch
    from lightning_fabric import Fabric

    fabric = Fabric(accelerator="cpu", devices=1, precision=precision)
    model, _, _ = load_for_training(model_name, ["negative", "positive"])
    params = sum(p.numel() for p in model.parameters())
    optimizer = build_optimizer([{"params": list(model.parameters())}], precision, "compensated", 1e-4)
    model, optimizer = fabric.setup(model, optimizer)
    for p in model.parameters():  # one step, so the moments (and Kahan buffers) exist as in training
        p.grad = torch.full_like(p, 1e-3)
    optimizer.step()
    sched = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    gen = torch.Generator().manual_seed(0)
    state = {
        "model": model,
        "optimizer": optimizer,
        "scheduler": sched,
        "progress": {**resume.Progress(step_times=[0.5] * 1000).__dict__},
        "epoch_generator": gen.get_state(),
        "rng": resume.rng_states(),
        "config": {"precision": precision},
    }
    walls, cpus = [], []
    for n in range(1, saves + 1):
        c0, w0 = time.process_time(), time.perf_counter()
        resume.save(fabric, scratch, state, n)
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    wall = statistics.median(walls)
    return {
        "precision": precision,
        "parameters": params,
        "bytes": (scratch / resume.CHECKPOINT).stat().st_size,
        "wall_s_median": round(wall, 3),
        "wall_s_all": [round(w, 3) for w in walls],
        "cpu_s_median": round(statistics.median(cpus), 3),
        "share_at_default_interval": round(wall / (resume.DEFAULT_INTERVAL_S + wall), 5),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--saves", type=int, default=5)
    p.add_argument("--precision", action="append", help="default: 32-true, bf16-mixed, bf16-true")
    p.add_argument("--model", default="default", help="default: the embedded model (a checkpoint dir to smoke-test)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "reports" / "checkpoint_cost")
    args = p.parse_args(argv)

    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for precision in args.precision or ["32-true", "bf16-mixed", "bf16-true"]:
        scratch = Path(tempfile.mkdtemp(prefix=".checkpoint-cost-", dir=args.out))
        try:
            rows.append(measure(precision, args.saves, scratch, args.model))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        print(rows[-1], flush=True)
    rep = {
        "created": now_iso(),
        "cpu": cpu_label(),
        "model": args.model,
        "saves": args.saves,
        "runs": rows,
        "provenance": provenance(),
    }
    lines = [
        "| precision | checkpoint (MB) | wall s / checkpoint | CPU s / checkpoint | share at ~300 s interval |",
        "|---|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['precision']} | {r['bytes'] / 1e6:.0f} | {r['wall_s_median']:.2f} | {r['cpu_s_median']:.2f} | "
        f"{100 * r['share_at_default_interval']:.2f}% |"
        for r in rows
    ]
    write_report(args.out, rep, "\n".join(lines) + "\n", "checkpoint_cost")
    return 0


if __name__ == "__main__":
    sys.exit(main())
