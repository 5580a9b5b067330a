"""Which variant the export flags name: `--bits/--backend/--dtype` and `--all`, read from the registry.

    qserve export models/minilm-imdb --bits 8                   # the device's default 8-bit variant (onnx-int8 on CPU)
    python -c "from qserve.variantflags import resolve; print(resolve(4, backend='bnb', dtype='nf4').name)"

Every fact used here is declared once, on a VariantSpec of its backend's declaration (qserve/backends/); the
tables are derived at import, which checks exactly one default per device and bits.
"""

from __future__ import annotations

from qserve import QserveError
from qserve.devices import BF16_FLAGS, INT8_FLAGS, Capabilities, capabilities
from qserve.variants import BACKENDS, DEVICES, VARIANTS, VariantSpec

DTYPES = ("fp32", "fp16", "bf16", "int8", "nf4", "fp4", "int4")
BITS = (32, 16, 8, 4)


def _defaults_for_bits() -> dict[str, dict[int, str]]:
    """device -> bits -> the variant whose spec says it is that default; exactly one per (device, bits)."""
    out: dict[str, dict[int, str]] = {}
    for dev in DEVICES:
        table: dict[int, str] = {}
        for bits in BITS:
            names = [s.name for s in VARIANTS.values() if dev in s.default_for and s.bits == bits]
            if len(names) != 1:  # a registry mistake: fail at import, not at `qserve export --bits`
                raise TypeError(f"--bits {bits} on {dev}: {len(names)} variants declare default_for ({names})")
            table[bits] = names[0]
        out[dev] = table
    return out


# `qserve export --bits N` without --backend: the measured fast path per device (VariantSpec.default_for).
DEFAULT_FOR_BITS: dict[str, dict[int, str]] = _defaults_for_bits()
# Variants `--all` skips on a device because they run but only slowly there (VariantSpec.slow_on).
SLOW_ON: dict[str, set[str]] = {dev: {s.name for s in VARIANTS.values() if dev in s.slow_on} for dev in DEVICES}


def valid_combinations() -> str:
    return ", ".join(f"--bits {s.bits} --backend {s.backend} --dtype {s.dtype} ({s.name})" for s in VARIANTS.values())


def resolve(
    bits: int, backend: str | None = None, dtype: str | None = None, device: str = "cpu", check_device: bool = True
) -> VariantSpec:
    """Pick the variant for `--bits/--backend/--dtype`; an impossible mix names the valid ones. `device` picks the
    default backend for the bits; check_device: a variant without kernels for it is an error (False: placed
    later, qserve.placement, as --device auto does)."""
    if bits not in BITS:
        raise QserveError(f"--bits must be one of {', '.join(map(str, BITS))} (got {bits})")
    if backend is not None and backend not in BACKENDS:
        raise QserveError(f"--backend must be one of {', '.join(BACKENDS)} (got {backend!r})")
    if dtype is not None and dtype not in DTYPES:
        raise QserveError(f"--dtype must be one of {', '.join(sorted(DTYPES))} (got {dtype!r})")
    if backend is None and dtype is None:
        spec = VARIANTS[DEFAULT_FOR_BITS["cuda" if device.startswith("cuda") else "cpu"][bits]]
    else:
        matches = [
            s
            for s in VARIANTS.values()
            if s.bits == bits and (backend is None or s.backend == backend) and (dtype is None or s.dtype == dtype)
        ]
        if not matches:
            raise QserveError(
                f"no variant for --bits {bits}"
                + (f" --backend {backend}" if backend else "")
                + (f" --dtype {dtype}" if dtype else "")
                + f"; valid combinations: {valid_combinations()}"
            )
        spec = matches[0]
    if check_device and device.startswith("cuda") and not spec.cuda:
        raise QserveError(
            f"{spec.name} has no CUDA kernels; on CUDA use one of: "
            + ", ".join(s.name for s in VARIANTS.values() if s.cuda)
        )
    return spec


NEEDS_TEXT = {"bf16": f"bf16 instructions ({' or '.join(BF16_FLAGS)})", "vnni": f"VNNI ({', '.join(INT8_FLAGS)})"}


def off_fast_path(spec: VariantSpec, device: str = "cpu", caps: Capabilities | None = None) -> str | None:
    """Why `spec` runs far off its fast path on this CPU (a feature its kernels need is missing), or None."""
    if device.startswith("cuda") or not spec.cpu_needs:
        return None
    caps = caps or capabilities(with_cuda=False)
    lacking = caps.missing(spec.cpu_needs)
    if not lacking:
        return None
    return (
        f"{spec.name} needs {' and '.join(NEEDS_TEXT[f] for f in lacking)} for its fast path; this CPU "
        f"({caps.cpu_class} class) has none, so it would run emulated or on a slow fallback, slower than fp32"
    )
