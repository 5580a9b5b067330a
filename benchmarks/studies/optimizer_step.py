"""The optimizer step alone, per precision's optimizer, on the embedded model's parameters.

    python -m benchmarks.studies.optimizer_step --rounds 5

What each precision's `optimizer.step()` costs with no forward or backward around it: torch AdamW on
fp32 weights (32-true and bf16-mixed keep fp32 master weights), torch AdamW on bf16 weights (plain
bf16-true), torch-optimi's Kahan-summation AdamW on bf16 weights (compensated bf16-true, the
default), each also with its foreach path. One process, the optimizers take turns round by round
(median of 5 steps per round, the median round reported). Writes optimizer_step.{json,md} to --out.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

from benchmarks.harness import ROOT, write_report
from qserve.devices import cpu_label
from qserve.files import now_iso
from qserve.modeling import load_for_training
from qserve.provenance import provenance


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "reports" / "precision")
    args = p.parse_args(argv)

    import torch
    from optimi import AdamW as KahanAdamW

    fp32, _, name = load_for_training("default", ["negative", "positive"])
    kahan = dict(lr=1e-4, betas=(0.9, 0.999), eps=1e-8, kahan_sum=True)
    makers = {
        "fp32 weights, torch AdamW (32-true, bf16-mixed)": (torch.float32, lambda g: torch.optim.AdamW(g, lr=1e-4)),
        "bf16 weights, torch AdamW (plain bf16-true)": (torch.bfloat16, lambda g: torch.optim.AdamW(g, lr=1e-4)),
        "bf16 weights, torch AdamW foreach": (torch.bfloat16, lambda g: torch.optim.AdamW(g, lr=1e-4, foreach=True)),
        "bf16 weights, optimi Kahan AdamW (compensated bf16-true)": (
            torch.bfloat16,
            lambda g: KahanAdamW(g, foreach=False, **kahan),
        ),
        "bf16 weights, optimi Kahan AdamW foreach": (torch.bfloat16, lambda g: KahanAdamW(g, foreach=True, **kahan)),
    }
    opts = {}
    for label, (dtype, make) in makers.items():
        model = copy.deepcopy(fp32).to(dtype)
        for prm in model.parameters():
            prm.grad = torch.randn_like(prm) * 1e-3
        opts[label] = make([{"params": list(model.parameters()), "weight_decay": 0.01}])
        opts[label].step()  # allocates the state: not timed
    times: dict[str, list[float]] = {k: [] for k in opts}
    for _ in range(args.rounds):
        for label, opt in opts.items():
            steps = []
            for _ in range(5):
                t0 = time.perf_counter()
                opt.step()
                steps.append(time.perf_counter() - t0)
            times[label].append(statistics.median(steps))
    n = sum(prm.numel() for prm in fp32.parameters())
    rep = {
        "created": now_iso(),
        "cpu": cpu_label(),
        "model": name,
        "parameters": n,
        "tensors": len(list(fp32.parameters())),
        "threads": torch.get_num_threads(),
        "rounds": args.rounds,
        "ms": {
            k: {"median": round(statistics.median(v) * 1e3, 2), "rounds": [round(x * 1e3, 2) for x in v]}
            for k, v in times.items()
        },
        "provenance": provenance(),
    }
    base = rep["ms"][next(iter(makers))]["median"]
    lines = [
        f"# Optimizer step alone ({name}, {n / 1e6:.1f}M parameters in {rep['tensors']} tensors)",
        "",
        f"Created {rep['created']} on {rep['cpu']}, {rep['threads']} threads, {args.rounds} rounds taking "
        "turns in one process (median of 5 steps per round; the median round shown).",
        "",
        "| optimizer | step (ms) | vs fp32 AdamW | rounds (ms) |",
        "|---|---:|---:|---|",
    ]
    for k, v in rep["ms"].items():
        lines.append(
            f"| {k} | {v['median']:.1f} | {v['median'] / base:.2f}x | {', '.join(f'{x:.1f}' for x in v['rounds'])} |"
        )
    write_report(args.out, rep, "\n".join(lines) + "\n", "optimizer_step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
