"""The backend registry: every way qserve can store and run a model, one declaration each (qserve/backends/).

    qserve export models/minilm-imdb --bits 8      # -> onnx-int8 on CPU

`REGISTRY`: every module of qserve/backends/ (its `BACKEND`) and those `QSERVE_BACKENDS` names ("module:attr",
comma-separated: a plug-in, tests/toy_backend/). The flags, options, plan, install hints, references, recorded
versions, builders and runtimes all read it; exporters and runtimes are bound by "module:attr" strings.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from dataclasses import replace
from importlib import metadata
from typing import Any

from qserve import QserveError, backends
from qserve.backends import DEVICES, STORED, Backend, BackendOptions, VariantSpec
from qserve.exportoption import Option

__all__ = ["DEVICES", "STORED", "Backend", "BackendOptions", "VariantSpec"]

AGREEMENT_BAR = {4: 0.97, 8: 0.99, 16: 0.99, 32: 0.99}
"""The bench's point bar on agreement with fp32, by bits: a variant below it is not a candidate (docs/bench.md)."""


def bar_for(bits: int | None) -> float:
    return AGREEMENT_BAR.get(int(bits or 8), AGREEMENT_BAR[8])


PLUGINS = "QSERVE_BACKENDS"
"""The environment variable naming backend declarations outside qserve ("module:attr", comma-separated)."""


def load_target(target: str, backend: Backend | None = None) -> Any:
    """Import a "module:attr" string; a module that cannot be imported fails this backend only."""
    module, _, attr = target.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except ImportError as e:
        if backend is None:
            raise QserveError(f"{PLUGINS}: importing {module} failed ({e})") from e
        names = ", ".join(s.name for s in backend.variants)
        hint = f"; {backend.install}" if backend.install else ""
        raise QserveError(
            f"the {backend.name} backend ({names}) is unavailable: importing {module} failed ({e}){hint}"
        ) from e


# every module of qserve/backends/ declares one (a new module is all a new built-in takes), then the plug-ins
_OWN = [importlib.import_module(m.name).BACKEND for m in pkgutil.iter_modules(backends.__path__, "qserve.backends.")]
_PLUGGED = [load_target(t.strip()) for t in os.environ.get(PLUGINS, "").split(",") if t.strip()]
REGISTRY: dict[str, Backend] = {b.name: b for b in [*sorted(_OWN, key=lambda b: (b.order, b.name)), *_PLUGGED]}
VARIANTS: dict[str, VariantSpec] = {s.name: s for b in REGISTRY.values() for s in b.variants}
BACKENDS = tuple(REGISTRY)
# the fp32 variants agreement is measured against (bench and gate), first found wins: VariantSpec.reference
REFERENCES = tuple(s.name for s in sorted(VARIANTS.values(), key=lambda s: s.reference) if s.reference)
# the backends whose runtimes share torch's process-wide intra-op pool (Backend.torch_threads)
TORCH_THREADS = tuple(b.name for b in REGISTRY.values() if b.torch_threads)
# the distributions whose versions an artifact or report records: the backends', the tokenizer's, training's, ours
LIBRARIES = (*dict.fromkeys(d for b in REGISTRY.values() for d in b.distributions), "tokenizers", "lightning-fabric")
LIBRARIES += ("qserve",)


def library_versions(names: tuple[str, ...] = LIBRARIES) -> dict[str, str]:
    found = {n: next(iter(metadata.distributions(name=n)), None) for n in names}  # None: not installed
    return {n: d.version for n, d in found.items() if d is not None}


# Parity tolerance by dtype (VariantSpec.tolerance), what exporters.core checks against.
TOLERANCE: dict[str, float] = {}
for _s in VARIANTS.values():
    if TOLERANCE.setdefault(_s.dtype, _s.tolerance) != _s.tolerance:
        raise TypeError(f"{_s.name}: tolerance {_s.tolerance} differs from the other {_s.dtype} variants'")


class UnsupportedVariant(QserveError):
    """The variant cannot be built here: not for this checkpoint's architecture (VariantSpec.unsupported), or its
    backend's library cannot run on this machine (runtime.ov_probe.OpenVINOUnavailable)."""


def get_spec(name: str) -> VariantSpec:
    try:
        return VARIANTS[name]
    except KeyError:
        raise QserveError(f"unknown variant {name!r}; known variants: {', '.join(VARIANTS)}") from None


def spec_of(data: dict[str, Any]) -> VariantSpec:
    """A manifest's `spec` back as the variant: its stored fields over the registry's declaration (the policy
    fields: tolerance, default_for, slow_on, unsupported), or those alone for a name not declared."""
    declared = VARIANTS.get(data.get("name", ""))
    return replace(declared, **data) if declared is not None else VariantSpec(**data)


def backend_of(name: str) -> Backend:
    """The registry entry that builds and runs variant `name`."""
    return REGISTRY[get_spec(name).backend]


def flag_options() -> dict[str, list[Option]]:
    """Every option that has a `qserve export` flag, by key (backends may share a key, e.g. calibration_samples)."""
    out: dict[str, list[Option]] = {}
    for b in REGISTRY.values():
        for o in b.options:
            if o.help:
                out.setdefault(o.key, []).append(o)
    for key, opts in out.items():
        if len({(o.kind, o.choices) for o in opts}) > 1:  # one flag, one parser: a registry mistake
            raise TypeError(f"backends declare option {key!r} with different types or choices")
    return out
