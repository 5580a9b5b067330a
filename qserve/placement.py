"""Where each variant runs: one plan per run, read by export, bench, gate, serve and the reports.

    python -c "from qserve.placement import plan; print('\\n'.join(plan('cpu').lines()))"

A variant runs on the run's device when its kernels do, else on its backend's `fallback` (the CPU, marked), else not
at all, with why (docs/gpu.md). `plan(device)` decides for every variant before any work; `place(spec, device)` for
one named variant, where an explicit `--device cuda` that cannot hold is an error naming the flag.
"""

from __future__ import annotations

import importlib.util
from dataclasses import asdict, dataclass
from typing import Any

from qserve import QserveError
from qserve.devices import Capabilities, capabilities, resolve_device
from qserve.variantflags import SLOW_ON, off_fast_path
from qserve.variants import REGISTRY, VARIANTS, VariantSpec, get_spec

CPU = "cpu"


@dataclass(frozen=True)
class Placement:
    """One variant's place in a run: the device it runs on (None: not run), and why it is not the run's device."""

    variant: str
    device: str | None
    why: str = ""
    """Empty when the variant runs on the run's device; else why it runs on the CPU instead, or is skipped."""

    @property
    def skipped(self) -> bool:
        return self.device is None


@dataclass(frozen=True)
class Plan:
    """What runs where in one run: the run's device and every variant's placement, in the registry's order."""

    device: str
    placements: tuple[Placement, ...]

    def get(self, name: str) -> Placement | None:
        return next((p for p in self.placements if p.variant == name), None)

    def device_of(self, name: str) -> str:
        """The device variant `name` runs on in this run (the run's device for a variant the plan does not list)."""
        p = self.get(name)
        if p is None:
            return self.device
        if p.device is None:
            raise QserveError(f"{name} is not run here: {p.why}")
        return p.device

    @property
    def runs(self) -> list[str]:
        """The variants this run exports and measures, in order."""
        return [p.variant for p in self.placements if p.device is not None]

    @property
    def skipped(self) -> dict[str, str]:
        return {p.variant: p.why for p in self.placements if p.device is None}

    @property
    def elsewhere(self) -> dict[str, Placement]:
        """The variants that run, but not on the run's device (the CPU ones of a CUDA run), with why."""
        return {p.variant: p for p in self.placements if p.device is not None and p.device != self.device}

    def lines(self) -> list[str]:
        """What runs where, grouped by device and reason: what the pipeline prints before it trains."""
        groups: dict[tuple[str, str], list[str]] = {}
        for p in self.placements:
            groups.setdefault((p.device or "skipped", p.why), []).append(p.variant)
        return [f"{', '.join(names)}: {where}" + (f" ({why})" if why else "") for (where, why), names in groups.items()]

    def to_json(self) -> dict[str, Any]:
        return {"device": self.device, "placements": [asdict(p) for p in self.placements]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Plan:
        return cls(str(data["device"]), tuple(Placement(**p) for p in data.get("placements") or []))


def is_cuda(device: str | None) -> bool:
    return bool(device) and str(device).startswith("cuda")


def not_installed(spec: VariantSpec) -> str | None:
    """Why the backend of `spec` cannot run here because a module it imports is not installed (None: all are)."""
    backend = REGISTRY[spec.backend]
    missing = [m for m in backend.needs + backend.export_needs if importlib.util.find_spec(m) is None]
    if not missing:
        return None
    hint = f": {backend.install}" if backend.install else ""
    return f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed{hint}"


def no_cuda(spec: VariantSpec) -> str | None:
    """Why `spec` cannot run on this machine's GPU (None: it can): no CUDA kernels, or its backend's CUDA library
    build is missing here (its declaration's cuda_probe: ONNX Runtime's CUDA provider)."""
    if not spec.cuda:
        return f"{spec.name} has no CUDA kernels (a CPU-only variant)"
    probe = REGISTRY[spec.backend].cuda_probe
    return probe() if probe else None


def _cpu_rule(spec: VariantSpec, caps: Capabilities | None) -> str | None:
    """Why a variant the run puts on the CPU is skipped there (too slow on CPUs, off its fast path on this one)."""
    if spec.name in SLOW_ON[CPU]:
        return f"{spec.name} runs only slowly on a CPU (naming it, or `qserve export --include-slow`, builds it anyway)"
    return off_fast_path(spec, CPU, caps)


def plan(
    device: str = "auto", names: list[str] | None = None, caps: Capabilities | None = None, include_slow: bool = False
) -> Plan:
    """Every variant's placement for a run on `device` (auto/cpu/cuda/cuda:N; auto resolves): `names` None plans
    the registry's every variant under the CPU's rules (what `export --all` and the pipeline build), a list plans
    exactly those (asked for by name: placed, never skipped for speed). A CUDA run puts on the CPU what cannot
    run on its GPU, whatever `--device` said: a multi-variant run is never lost for one backend's provider."""
    run = resolve_device(device)
    every = names is None
    caps = caps or capabilities(with_cuda=False)
    out = []
    for name in list(VARIANTS) if every else names or []:
        spec = get_spec(name)
        missing = not_installed(spec) if every else None
        if missing:
            out.append(Placement(name, None, missing))
            continue
        where: str | None = run
        why = ""
        if is_cuda(run):
            blocked = no_cuda(spec)
            if blocked:  # where its declaration runs it when the GPU cannot (None: skipped)
                where, why = REGISTRY[spec.backend].fallback, blocked
        elif not spec.cpu:
            where, why = None, f"{name} does not run on a CPU"
        if where is None:
            out.append(Placement(name, None, why))
            continue
        if every and where == CPU and not include_slow:
            rule = _cpu_rule(spec, caps)
            if rule:
                out.append(Placement(name, None, rule))
                continue
        out.append(Placement(name, where, why))
    return Plan(run, tuple(out))


def place(spec: VariantSpec | str, device: str = "auto") -> str:
    """The device one named variant runs on when `--device` says `device`: auto is the GPU where the variant runs
    on it, else the CPU (as plan() places it); cpu is the CPU; an explicit cuda[:N] the variant cannot run on is
    an error naming --device and the values that work."""
    spec = get_spec(spec) if isinstance(spec, str) else spec
    run = resolve_device(device)
    if not is_cuda(run):
        return run
    blocked = no_cuda(spec)
    if blocked is None:
        return run
    fallback = REGISTRY[spec.backend].fallback
    if device == "auto" and fallback:
        return fallback
    raise QserveError(
        f"--device {device}: {spec.name} cannot run on CUDA here ({blocked}); use --device cpu, or "
        f"--device auto (the GPU where a variant runs on it, else the CPU)"
    )


def mark(device: str | None, run: str | None) -> str:
    """' (cpu)' after a variant's name in a table when it ran on another device than the run's, else ''."""
    if not device or not run or run == "auto" or device == run or (is_cuda(device) and is_cuda(run)):
        return ""
    return f" ({device})"
