"""What each training precision needs: the device checks, the optimizer, and how memory is counted.

    python -m pytest tests/unit/test_train_precision.py -q -k "bf16 or precision"

train.py runs the fine-tune; this module holds the per-precision choices it makes, so the
precision study (study.py) and the tests read the same ones.
"""

from __future__ import annotations

import logging
from typing import Any

from qserve import QserveError

log = logging.getLogger(__name__)

PRECISIONS = ("32-true", "16-mixed", "bf16-mixed", "bf16-true")
# How bf16-true lands AdamW updates on bf16 weights. An update below half a bf16 ulp of its
# weight (2^-9 relative) rounds away in a plain `p.add_(u)`, so small early steps are lost.
BF16_UPDATES = ("compensated", "plain")
MATMUL_PRECISIONS = ("highest", "high", "medium")


def build_optimizer(groups: list[dict[str, Any]], precision: str, bf16_update: str, lr: float):
    """AdamW for `precision`; bf16-true gets one whose small updates still land on bf16 weights.

    torch's AdamW on bf16 parameters computes and stores in bf16, and `p - lr * m / sqrt(v)`
    rounds to the nearest bf16: with lr 1e-4 most updates are below half an ulp and vanish.
    Kahan summation keeps that rounding error in a bf16 buffer and adds it back next step
    (2 bytes more per parameter than plain bf16 AdamW, half of fp32 AdamW's 8).
    torch-optimi's AdamW rather than torchao's stochastic-rounding one: both keep the
    accuracy, but torchao's is a private class (`_AdamW`) that torch.compiles each parameter
    shape at the first step (a C++ compiler at run time, ~40 s here).
    """
    import torch

    if precision != "bf16-true" or bf16_update == "plain":
        return torch.optim.AdamW(groups, lr=lr)
    from optimi import AdamW

    # torch's AdamW defaults (optimi's own are betas (0.9, 0.99), eps 1e-6), so only how the
    # update lands differs from the other precisions' optimizer. foreach=False: on CPU the
    # per-tensor loop measured faster than the foreach path (no triton here).
    return AdamW(groups, lr=lr, betas=(0.9, 0.999), eps=1e-8, kahan_sum=True, foreach=False)


def optimizer_state_bytes(optimizer) -> int:
    """Bytes of the optimizer's per-parameter tensors (moments, Kahan buffers; not the weights).

    0-d tensors (torch's per-parameter step counters) are left out: bookkeeping, not state
    that grows with the model.
    """
    import torch

    inner = getattr(optimizer, "optimizer", optimizer)  # Fabric wraps the optimizer
    return sum(v.numel() * v.element_size() for st in inner.state.values() for v in st.values()
               if isinstance(v, torch.Tensor) and v.dim() > 0)


def check_precision(precision: str, device: str) -> None:
    """Refuse precisions the device cannot run well; warn (not silently) when bf16 is emulated."""
    from qserve.devices import cpu_supports_bf16

    if device == "cpu":
        if precision == "16-mixed":
            raise QserveError("--precision 16-mixed is not supported on CPU (fp16 autocast has no fast CPU "
                              "path; Fabric would silently switch to bf16); use bf16-mixed or 32-true")
        if precision.startswith("bf16") and not cpu_supports_bf16():
            log.warning("--precision %s on a CPU without avx512_bf16/AMX: bf16 is emulated and slow; "
                        "32-true is likely faster here", precision)
    elif precision.startswith("bf16"):
        import torch

        if not torch.cuda.is_bf16_supported():
            raise QserveError(f"--precision {precision}: this GPU ({torch.cuda.get_device_name()}) has no bf16 "
                              "support; use 16-mixed or 32-true")


def peak_memory(device: str, rss_peak: int) -> dict[str, Any]:
    """Peak memory as the precision study reports it: reserved CUDA memory, or the sampled process RSS."""
    import resource

    if device.startswith("cuda"):
        import torch

        return {"peak_memory_bytes": int(torch.cuda.max_memory_reserved()),
                "peak_memory_kind": "torch.cuda.max_memory_reserved",
                "peak_allocated_bytes": int(torch.cuda.max_memory_allocated())}
    return {"peak_memory_bytes": rss_peak, "peak_memory_kind": "process RSS (psutil, sampled every step)",
            "peak_rss_os_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
