"""Device selection shared by every stage: CUDA when present, CPU otherwise.

    python -c "from qserve.devices import resolve_device; print(resolve_device('auto'))"

Importing this module does not import torch; the functions do.
"""

from __future__ import annotations

import os

from qserve import QserveError

DEVICES = ("auto", "cpu", "cuda")


def cuda_available() -> bool:
    # QSERVE_FORCE_CPU lets tests (and users) take the CPU path on a GPU machine.
    if os.environ.get("QSERVE_FORCE_CPU") == "1":
        return False
    import torch

    return torch.cuda.is_available()


def resolve_device(device: str = "auto") -> str:
    """'auto' -> 'cuda' if a GPU is usable else 'cpu'; 'cuda[:N]' without a GPU is an error."""
    if device == "auto":
        return "cuda" if cuda_available() else "cpu"
    if device == "cpu":
        return "cpu"
    if device == "cuda" or device.startswith("cuda:"):
        if not cuda_available():
            raise QserveError(f"--device {device} was asked for but no CUDA GPU is available; use --device cpu or auto")
        return device
    raise QserveError(f"--device must be one of {', '.join(DEVICES)} or cuda:N (got {device!r})")


def usable_cores() -> int:
    """Logical CPUs this process may run on (its affinity mask: a container's or taskset's limit)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def cpu_supports_bf16() -> bool:
    """True when the CPU has native bf16 dot products (avx512_bf16 / AMX), so bf16 is fast."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def cpu_info() -> dict:
    """CPU model and the instruction-set flags that decide our fast paths."""
    model, flags = "unknown", set[str]()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name") and model == "unknown":
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    wanted = ["avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_bf16", "amx_int8", "fma"]
    return {"model": model, "cores": os.cpu_count(), "flags": [f for f in wanted if f in flags]}


def cpu_label(info: dict | None = None) -> str:
    """'<model>, AMX (amx_bf16 amx_int8)' or '<model>, no AMX': how every report names its machine."""
    info = info or cpu_info()
    amx = [f for f in info.get("flags", []) if f.startswith("amx")]
    return f"{info.get('model', 'unknown')}, " + (f"AMX ({' '.join(amx)})" if amx else "no AMX")
