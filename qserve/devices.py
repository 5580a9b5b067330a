"""Device selection and the machine's capabilities, read once, shared by every stage.

    python -c "from qserve.devices import capabilities; print(capabilities().describe())"

CUDA when present, else CPU (`resolve_device`); every hardware-dependent choice reads `capabilities()`, read once per
process. `QSERVE_CPU_FLAGS` replaces the CPU's flags, `QSERVE_FORCE_CPU=1` hides the GPU (docs/training.md,
docs/gpu.md). Importing this module does not import torch; the functions that need it do.
"""

from __future__ import annotations

import functools
import os
import platform
import sys
from dataclasses import dataclass, field

from qserve import QserveError

DEVICES = ("auto", "cpu", "cuda")
# The instruction-set flags (Linux /proc/cpuinfo names) that decide qserve's fast paths.
WANTED_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_bf16", "amx_int8", "fma")
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
"""Native bf16 dot products: without one of these, bf16 matmuls are emulated in fp32 and run several times slower."""
INT8_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")
"""Native u8s8 int8 dot products (VNNI, AMX): without one, int8 GEMMs take a slower path that saturates in int16."""
FEATURES = {"bf16": BF16_FLAGS, "vnni": INT8_FLAGS}
"""What a variant's CPU fast path can need (VariantSpec.cpu_needs), and the flags that provide it."""


@dataclass(frozen=True)
class Capabilities:
    """What this machine can run fast: the one place every hardware-dependent decision reads."""

    cpu_model: str = "unknown"
    cpu_flags: frozenset[str] | None = None
    """The CPU's instruction-set flags, or None where they cannot be read (not Linux): then decisions measure."""
    flags_source: str = "/proc/cpuinfo"
    cores: int = 1
    cuda: bool = False
    cuda_name: str = ""
    cuda_bf16: bool = False
    cuda_capability: tuple[int, int] | None = None
    notes: tuple[str, ...] = field(default=())

    def has(self, feature: str) -> bool | None:
        """Whether the CPU has `feature` ("bf16" or "vnni", see FEATURES); None when its flags are unknown."""
        if self.cpu_flags is None:
            return None
        return any(f in self.cpu_flags for f in FEATURES[feature])

    @property
    def cpu_class(self) -> str:
        """amx, avx512-bf16, avx512-vnni, avx2 or other: the classes whose measured numbers qserve keeps apart."""
        flags = self.cpu_flags or frozenset()
        if "amx_bf16" in flags or "amx_int8" in flags:
            return "amx"
        if "avx512_bf16" in flags:
            return "avx512-bf16"
        if "avx512_vnni" in flags or "avx_vnni" in flags:
            return "avx512-vnni" if "avx512_vnni" in flags else "avx-vnni"
        if "avx2" in flags:
            return "avx2"
        return "unknown" if self.cpu_flags is None else "other"

    def missing(self, needs: tuple[str, ...]) -> list[str]:
        """Of the features in `needs`, those this CPU lacks (unknown flags count as present: measured later)."""
        return [f for f in needs if self.has(f) is False]

    def describe(self) -> str:
        """'AMD EPYC (avx2 class: no avx512_bf16/amx_bf16, no VNNI)': how a decision names its machine."""
        bf16, vnni = self.has("bf16"), self.has("vnni")
        if bf16 is None:
            return f"{self.cpu_model} (CPU flags unknown: {self.flags_source})"
        parts = ["bf16 " + ("yes" if bf16 else "no (no avx512_bf16/amx_bf16)"), "VNNI " + ("yes" if vnni else "no")]
        src = "" if self.flags_source == "/proc/cpuinfo" else f", flags from {self.flags_source}"
        return f"{self.cpu_model} ({self.cpu_class} class: {', '.join(parts)}{src})"


def _read_cpuinfo() -> tuple[str, frozenset[str] | None]:
    """(model, flags) of the first CPU. A VM's model name can be as generic as "AMD EPYC" for every generation,
    so the model carries the family and model numbers: reports from two CPU classes never read as one machine."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, sep, value = line.partition(":")
                if not sep:
                    if fields:
                        break  # the first CPU's block is enough
                    continue
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        return platform.processor() or "unknown", None
    model = fields.get("model name", "unknown")
    if "cpu family" in fields and "model" in fields:
        model = f"{model} (family {fields['cpu family']} model {fields['model']})"
    flags = frozenset(fields["flags"].split()) if "flags" in fields else None
    return model, flags


def _read_cuda() -> dict:
    if not cuda_available():
        return {}
    import torch

    # native bf16 only (Ampere+): torch's default also says yes where bf16 is emulated, and slow
    return {
        "cuda": True,
        "cuda_name": torch.cuda.get_device_name(),
        "cuda_bf16": bool(torch.cuda.is_bf16_supported(including_emulation=False)),
        "cuda_capability": tuple(torch.cuda.get_device_capability()),
    }


def read_capabilities(with_cuda: bool = True) -> Capabilities:
    """The machine as it is now (or as QSERVE_CPU_FLAGS says its CPU is); `capabilities()` caches this."""
    model, flags = _read_cpuinfo()
    source = "/proc/cpuinfo" if flags is not None else "unreadable"
    forced = os.environ.get("QSERVE_CPU_FLAGS")
    if forced is not None:
        flags, source = frozenset(forced.replace(",", " ").split()), "QSERVE_CPU_FLAGS"
    return Capabilities(
        cpu_model=model,
        cpu_flags=flags,
        flags_source=source,
        cores=usable_cores(),
        **(_read_cuda() if with_cuda else {}),
    )


@functools.lru_cache(maxsize=2)
def capabilities(with_cuda: bool = True) -> Capabilities:
    """This machine's capabilities, read once per process (with_cuda=False: without importing torch)."""
    return read_capabilities(with_cuda)


GPU_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd", "/dev/dxg")
"""Device files a usable GPU driver creates on Linux (NVIDIA, ROCm, WSL2): with none of them, no torch can see a
GPU, so deciding `auto` need not import torch (seconds, in a bench's parent or a CLI that only plans)."""


def cuda_available() -> bool:
    # QSERVE_FORCE_CPU lets tests (and users) take the CPU path on a GPU machine.
    if os.environ.get("QSERVE_FORCE_CPU") == "1":
        return False
    if sys.platform.startswith("linux") and not any(os.path.exists(p) for p in GPU_NODES):
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
    return bool(capabilities(with_cuda=False).has("bf16"))


def cpu_info() -> dict:
    """CPU model and the instruction-set flags that decide our fast paths (as reports record them)."""
    caps = capabilities(with_cuda=False)
    flags = caps.cpu_flags or frozenset()
    out = {
        "model": caps.cpu_model,
        "cores": os.cpu_count(),
        "flags": [f for f in WANTED_FLAGS if f in flags],
        "class": caps.cpu_class,
    }
    if caps.flags_source != "/proc/cpuinfo":
        out["flags_source"] = caps.flags_source
    return out


def cpu_label(info: dict | None = None) -> str:
    """'<model>, AMX (amx_bf16 amx_int8)' or '<model>, no AMX': how every report names its machine."""
    info = info or cpu_info()
    amx = [f for f in info.get("flags", []) if f.startswith("amx")]
    return f"{info.get('model', 'unknown')}, " + (f"AMX ({' '.join(amx)})" if amx else "no AMX")
