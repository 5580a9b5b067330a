"""What a backend declares: its variants, typed options, exporter and runtime, what it needs, where it falls back.

    python -c "from qserve.variants import REGISTRY; print(REGISTRY['onnx'])"

Each module of this package declares one backend as `BACKEND = Backend(...)` (torch.py, bnb.py, onnx.py, ...);
qserve.variants finds them all, adds those `QSERVE_BACKENDS` names, and derives every other table from them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from qserve import QserveError
from qserve.exportoption import Option, OptionValue, option, options_of

STORED = ("name", "backend", "bits", "dtype", "cpu", "cuda", "options")
"""The fields a manifest's `spec` records (to_json); the rest of a VariantSpec is policy, read from here."""
DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class VariantSpec:
    """Everything about one variant, declared once: the backend that runs it, how its weights are stored, the
    parity it must keep, where it is the default, where it is too slow for `--all`, what it cannot build."""

    name: str
    backend: str
    bits: int
    dtype: str
    cpu: bool = True
    cuda: bool = True
    """Whether the variant runs on CPU / CUDA at all (speed is the benchmark's business)."""
    options: dict[str, Any] = field(default_factory=dict)
    tolerance: float = 0.0
    """Max |Δlogit| against the fp32 checkpoint on the probes before the export warns; one value per dtype."""
    default_for: tuple[str, ...] = ()
    """The devices on which `qserve export --bits N` without --backend picks this variant: its bits' fast path."""
    slow_on: tuple[str, ...] = ()
    """The devices on which `--all` skips it: it runs there, but only slowly."""
    cpu_needs: tuple[str, ...] = ()
    """CPU features its fast path needs (qserve.devices.FEATURES: "bf16", "vnni"); without one, the plan skips it."""
    unsupported: dict[str, str] = field(default_factory=dict)
    """Architecture (config.json model_type) -> why the variant cannot be built for it; checked before any work."""
    reference: int = 0  # an fp32 variant's rank as the reference agreement is measured against (1 first; 0: none)

    def to_json(self) -> dict[str, Any]:
        """What the manifest records as `spec` (the stored fields only, so manifests keep their bytes)."""
        return {k: v for k, v in asdict(self).items() if k in STORED}


@dataclass(frozen=True)
class BackendOptions:
    """A backend's exporter options for one variant, each field one `Option` (qserve/exportoption.py), validated
    once (`resolve`); a field the variant does not understand stays None; `to_json` is the manifest's record."""

    variant: str

    @classmethod
    def defaults(cls, name: str) -> dict[str, OptionValue]:
        """The options variant `name` understands, with their defaults, in declaration order."""
        return {o.key: o.defaults[name] for o in options_of(cls) if name in o.defaults}

    @classmethod
    def merge(cls, name: str, given: dict[str, Any]) -> dict[str, Any]:
        """`given` over variant `name`'s defaults; an unknown key is an error naming the allowed ones."""
        allowed = cls.defaults(name)
        unknown = sorted(set(given) - set(allowed))
        if unknown:
            listed = ", ".join(f"{k} (default {v!r})" for k, v in allowed.items()) or "none"
            raise QserveError(f"unknown option(s) {', '.join(map(repr, unknown))} for {name}; allowed: {listed}")
        return {**allowed, **given}

    @classmethod
    def resolve(cls: type[OptionsT], name: str, given: dict[str, Any] | None = None) -> OptionsT:
        """`given` over variant `name`'s defaults, each value checked against its Option, then `_check`."""
        given = dict(given or {})
        declared = {o.key: o for o in options_of(cls)}
        out = cls(variant=name, **{k: declared[k].validate(name, v) for k, v in cls.merge(name, given).items()})
        out._check(given)
        return out

    def _check(self, given: dict[str, Any]) -> None:
        """The backend's rules across options (one option excluding another); `given`: what the user set."""

    def to_json(self) -> dict[str, OptionValue]:
        """The options the variant understands, in declaration order: what the manifest records."""
        return {k: getattr(self, k) for k in self.defaults(self.variant)}


OptionsT = TypeVar("OptionsT", bound=BackendOptions)


@dataclass(frozen=True)
class Backend:
    """One way to store and run a model, declared once. The exporter and runtime are "module:attr" strings, imported
    only when one of its variants is exported or loaded, so the core never imports exporters/ or a heavy library."""

    name: str
    exporter: str
    """"module:function" that writes a variant: (ExportContext, out_dir, spec, options) -> its manifest records."""
    runtime: str
    """"module:Class", a qserve.runtime.base.Runtime subclass built as (variant_dir, manifest, device, options)."""
    variants: tuple[VariantSpec, ...]
    options_type: type[BackendOptions] = BackendOptions
    """The backend's typed options: each `option(...)` field one exporter option (and `qserve export` flag)."""
    libraries: tuple[str, ...] = ()
    """What a bench child imports before its memory baseline, so 'model memory' and the load time leave them out."""
    needs: tuple[str, ...] = ()
    """Optional libraries (import names) its runtime imports: missing, `require` says `install`, the plan skips it."""
    export_needs: tuple[str, ...] = ()
    """What its exporter imports beyond `needs` (a serving install lacks them: they come with the toolkit)."""
    install: str = ""
    cuda_install: str = ""
    """The commands that install `needs`, and their CUDA build where that is another package."""
    cuda_probe: Callable[[], str | None] | None = None
    """Why its CUDA path cannot start on this machine (None: it can), for a backend whose CUDA kernels come from a
    build of their own (ONNX Runtime's CUDA provider); None: torch's CUDA is enough."""
    fallback: str | None = "cpu"
    """Where its variants run when the run's device cannot hold them (None: they are skipped)."""
    layers: str | None = None
    """"module:Class", an exporters.layers.Layers that puts its quantized layers back to fp32 on a loaded variant
    (the repair's ranking and search; its keep_fp32 option exports the result); None: not repairable."""
    distributions: tuple[str, ...] = ()  # whose versions a manifest or report records (qserve.variants.LIBRARIES)
    serving: bool = False  # whether a serving install (qserve[serve], the serve image) has its `needs`
    colour: str = ""  # its variants' colour in the report's charts ("": a spare one)
    torch_threads: bool = False  # its runtime computes on torch's process-wide intra-op pool
    order: int = 100  # its place in every list (flags, tables, `--all`); then by name

    @property
    def options(self) -> tuple[Option, ...]:
        """The backend's exporter options, read from its options type's declarations (exportoption.options_of)."""
        return options_of(self.options_type)


def calibration_samples(defaults: dict[str, OptionValue], purpose: str, calibrates: str) -> Any:
    """The calibration_samples option of a calibrating backend: 1 to 1024 training texts; `purpose` its flag's help,
    `calibrates` what its error says they calibrate."""
    return option(
        defaults,
        f"training texts that calibrate {purpose}",
        allowed="an integer from 1 to 1024",
        note=f"training texts that calibrate {calibrates}",
        check=lambda v: 1 <= v <= 1024,
    )


def keep_fp32(defaults: dict[str, OptionValue], names: str, example: str) -> Any:
    """The keep_fp32 option of a quantizing backend: the layers it leaves unquantized, by `names` (what the repair
    writes: exporters/layers.py), e.g. `example`."""
    return option(
        defaults,
        f"comma-separated {names} to leave in fp32, e.g. '{example}' (more accurate, larger, slower; "
        "`qserve export --repair` chooses them)",
        metavar="NAMES",
        allowed=f"a comma-separated string of {names}, e.g. '{example}'",
    )


def listed(value: str | None) -> list[str]:
    """The names a keep_fp32 value lists (comma-separated; blanks dropped)."""
    return [k.strip() for k in (value or "").split(",") if k.strip()]
