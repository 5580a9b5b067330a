"""What each training precision needs: the device checks, the optimizer, and how memory is counted.

    python -m pytest tests/unit/test_train_precision.py -q -k "bf16 or precision"

train.py runs the fine-tune; this module holds the per-precision choices it makes, so the
precision study (study.py) and the tests read the same ones.
"""

from __future__ import annotations

import logging
import resource
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from qserve import QserveError
from qserve.devices import Capabilities, capabilities

log = logging.getLogger(__name__)

PRECISIONS = ("32-true", "16-mixed", "bf16-mixed", "bf16-true")
AUTO = "auto"
PRECISION_CHOICES = (AUTO, *PRECISIONS)
"""What --precision accepts: `auto` (the precision this device runs fast, `choose_precision`) or one of PRECISIONS."""
# Where the CPU's flags are unknown, bf16-mixed is chosen only when it measures at least this much faster.
UNKNOWN_SPEEDUP = 1.1
PROBE_SHAPE = (512, 384, 1536)
"""The probe's block: 512 token rows (a quarter of a 16 x 128 batch) through the default encoder's FFN
(384 -> 1536 -> 384), forward and backward: the GEMMs a fine-tune step is made of, at a cost of milliseconds where
bf16 is native and about a second where it is emulated."""


@dataclass(frozen=True)
class PrecisionChoice:
    """The training precision a run uses, what was asked for, and why: recorded in train_metrics.json and reports."""

    precision: str
    asked: str
    reason: str
    probe: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def line(self) -> str:
        """`precision: 32-true (this CPU has no bf16 instructions: bf16-mixed measured <the probe's ratio> slower)`"""
        return f"precision: {self.precision} ({self.reason})"


def probe_bf16(repeats: int = 5) -> dict[str, Any]:
    """Time one fine-tune block (PROBE_SHAPE's FFN, forward + backward) in fp32 and under bf16 autocast, alternating
    `repeats` rounds, best of each, so load on the machine hits both alike."""
    import torch

    rows, dim, hidden = PROBE_SHAPE
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(rows, dim, generator=gen)
    w1 = (torch.randn(hidden, dim, generator=gen) * dim**-0.5).requires_grad_()
    w2 = (torch.randn(dim, hidden, generator=gen) * hidden**-0.5).requires_grad_()

    def step(autocast: bool) -> float:
        t = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            y = torch.nn.functional.linear(torch.nn.functional.gelu(torch.nn.functional.linear(x, w1)), w2)
        y.float().square().mean().backward()
        w1.grad = w2.grad = None
        return time.perf_counter() - t

    kinds = (("fp32_s", False), ("bf16_mixed_s", True))
    for _, autocast in kinds:
        step(autocast)
    best = {name: float("inf") for name, _ in kinds}
    for _ in range(repeats):
        for name, autocast in kinds:
            best[name] = min(best[name], step(autocast))
    return {
        **{k: round(v, 5) for k, v in best.items()},
        "slowdown": round(best["bf16_mixed_s"] / best["fp32_s"], 3),
        "block": f"{rows}x{dim} -> {hidden} -> {dim}, forward + backward, best of {repeats}",
        "threads": torch.get_num_threads(),
    }


def _measured(m: dict[str, Any]) -> str:
    r = m["slowdown"]
    return f"bf16-mixed measured {r:.1f}x slower" if r >= 1 else f"bf16-mixed measured {1 / r:.1f}x faster"


_DISAGREES = (
    " (the probe disagrees with the instruction set: a probe of seconds on a busy machine can, so the "
    "instruction set decides; --precision overrides)"
)


def choose_precision(
    asked: str, device: str, caps: Capabilities | None = None, probe: Callable[[], dict[str, Any]] = probe_bf16
) -> PrecisionChoice:
    """The training precision for `asked` on `device`: an explicit one as it is; `auto` by the device.

    CUDA: bf16-mixed, or 16-mixed without bf16 (one GPU's run measures instead: autotune). CPU: bf16-mixed with AMX or
    avx512_bf16, else 32-true; `probe_bf16` gives the reason, and decides where the flags cannot be read."""
    if asked != AUTO:
        if asked not in PRECISIONS:
            raise QserveError(f"--precision must be one of {', '.join(PRECISION_CHOICES)} (got {asked!r})")
        return PrecisionChoice(asked, asked, "asked for with --precision")
    caps = caps or capabilities(with_cuda=device.startswith("cuda"))
    if device.startswith("cuda"):  # unmeasured: a single-GPU run measures (training/autotune.py), DDP takes this
        sm = f"sm_{caps.cuda_capability[0]}{caps.cuda_capability[1]}" if caps.cuda_capability else "?"
        if caps.cuda_bf16:
            return PrecisionChoice(
                "bf16-mixed", AUTO, f"this GPU ({caps.cuda_name}, {sm}) runs bf16 natively (not measured)"
            )
        return PrecisionChoice(
            "16-mixed",
            AUTO,
            f"this GPU ({caps.cuda_name}, {sm}) has no bf16: fp16 autocast with loss scaling (not measured)",
        )
    bf16 = caps.has("bf16")
    m = probe()
    if bf16 is False:
        return PrecisionChoice(
            "32-true",
            AUTO,
            f"this CPU has no bf16 instructions: {_measured(m)}" + (_DISAGREES if m["slowdown"] < 1 else ""),
            m,
        )
    if bf16 is True:
        flag = next(f for f in ("amx_bf16", "avx512_bf16") if caps.cpu_flags and f in caps.cpu_flags)
        return PrecisionChoice(
            "bf16-mixed", AUTO, f"this CPU has {flag}: {_measured(m)}" + (_DISAGREES if m["slowdown"] > 1 else ""), m
        )
    if m["slowdown"] <= 1 / UNKNOWN_SPEEDUP:
        return PrecisionChoice("bf16-mixed", AUTO, f"this CPU's flags are unknown: {_measured(m)}", m)
    return PrecisionChoice("32-true", AUTO, f"this CPU's flags are unknown: {_measured(m)}", m)


# How bf16-true lands AdamW updates on bf16 weights (a plain `p.add_(u)` rounds away updates below half an ulp).
BF16_UPDATES = ("compensated", "plain")
MATMUL_PRECISIONS = ("highest", "high", "medium")


def build_optimizer(groups: list[dict[str, Any]], precision: str, bf16_update: str, lr: float, fused: bool = False):
    """AdamW for `precision`: fused on CUDA (a small model's step is launch-bound); bf16-true gets torch-optimi's AdamW
    with Kahan summation, so small updates still land (docs/training.md)."""
    import torch

    if precision != "bf16-true":
        return torch.optim.AdamW(groups, lr=lr, fused=True) if fused else torch.optim.AdamW(groups, lr=lr)
    if bf16_update == "plain":
        return torch.optim.AdamW(groups, lr=lr)
    from optimi import AdamW

    # torch's AdamW defaults (not optimi's), so only how the update lands differs; foreach=False measured faster on CPU
    return AdamW(groups, lr=lr, betas=(0.9, 0.999), eps=1e-8, kahan_sum=True, foreach=False)


def optimizer_state_bytes(optimizer) -> int:
    """Bytes of the optimizer's per-parameter tensors (moments, Kahan buffers; not weights, not 0-d step counters)."""
    import torch

    inner = getattr(optimizer, "optimizer", optimizer)  # Fabric wraps the optimizer
    return sum(
        v.numel() * v.element_size()
        for st in inner.state.values()
        for v in st.values()
        if isinstance(v, torch.Tensor) and v.dim() > 0
    )


def check_precision(precision: str, device: str) -> None:
    """Refuse precisions the device cannot run well; warn (not silently) when bf16 is emulated."""
    if device == "cpu":
        if precision == "16-mixed":
            raise QserveError(
                "--precision 16-mixed is not supported on CPU (fp16 autocast has no fast CPU "
                "path; Fabric would silently switch to bf16); use bf16-mixed or 32-true"
            )
        if precision.startswith("bf16") and capabilities(with_cuda=False).has("bf16") is False:
            log.warning(
                "--precision %s on a CPU without avx512_bf16/AMX: bf16 is emulated and slow (several times "
                "slower than 32-true); training in %s as asked (--precision auto chooses 32-true here)",
                precision,
                precision,
            )
    elif precision.startswith("bf16"):
        import torch

        if not torch.cuda.is_bf16_supported():
            raise QserveError(
                f"--precision {precision}: this GPU ({torch.cuda.get_device_name()}) has no bf16 "
                "support; use 16-mixed or 32-true"
            )


def peak_memory(device: str, rss_peak: int) -> dict[str, Any]:
    """Peak memory as the precision study reports it: reserved CUDA memory, or the sampled process RSS."""
    if device.startswith("cuda"):
        import torch

        return {
            "peak_memory_bytes": int(torch.cuda.max_memory_reserved()),
            "peak_memory_kind": "torch.cuda.max_memory_reserved",
            "peak_allocated_bytes": int(torch.cuda.max_memory_allocated()),
        }
    return {
        "peak_memory_bytes": rss_peak,
        "peak_memory_kind": "process RSS (psutil, sampled every step)",
        "peak_rss_os_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }
