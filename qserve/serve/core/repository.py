"""Where a server's models come from: their names, the directory each one (re)loads from, and its version.

    qserve serve models/a/variants/onnx-int8 fp32=models/a/variants/torch-fp32
    qserve serve --model-repository /srv/models          # every subdirectory is a model, named by it

Names are fixed at start and unique; a load reads only its name's own directory, never a client's path, and a
model dir's recommended variant is chosen again at every load (docs/serving.md, "Names").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from qserve import QserveError
from qserve.artifact import Manifest, read_manifest
from qserve.rundir import RunDir, Served, served
from qserve.serve.infra.errors import ApiError

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
NAME_RULE = "1-128 characters of letters, digits, '.', '_' and '-', starting with a letter or digit"
VERSION_CHARS = 12


@dataclass(frozen=True)
class ModelSource:
    """A served name and the directory its load (re)reads."""

    name: str
    path: str
    """A variant dir or a `qserve pipeline` model dir, as given (under --model-repository: ROOT/name)."""


def model_version(manifest: Manifest) -> str:
    """The manifest's short hash: its recorded digest (the whole variant, files included, is sealed by it)."""
    return manifest.version[:VERSION_CHARS]


def resolve(path: str | Path) -> tuple[Path, Served | None]:
    """(the variant dir to load, why it was chosen): the dir itself, or a run dir's recommended variant."""
    run = RunDir(Path(path))
    if run.is_run_dir():
        chosen = served(run)
        return Path(chosen.dir), chosen
    if not (run.path / "manifest.json").is_file():
        raise QserveError(
            f"{path}: no manifest.json (not a variant dir) and no report/ (not a model dir); export "
            "one with `qserve export`"
        )
    return run.path, None


def check_name(name: str, where: str) -> str:
    if not NAME_RE.match(name):
        raise QserveError(f"{where}: model name {name!r} is not valid; a name is {NAME_RULE} (it appears in URLs)")
    return name


def split_entry(entry: str) -> tuple[str | None, str]:
    """'NAME=DIR' -> (NAME, DIR); a plain DIR (one that exists, even with '=' in it) -> (None, DIR)."""
    name, sep, path = entry.partition("=")
    if not sep or Path(entry).exists() or "/" in name:
        return None, entry
    return name, path


def sources_from_dirs(entries: list[str], model_name: str | None = None) -> list[ModelSource]:
    """The models `qserve serve DIR [DIR...]` names: NAME=DIR, else the variant's spec name (--model-name for
    a single DIR). Reads manifests only; a name clash is refused naming both dirs."""
    if not entries:
        raise QserveError("no model: give DIR [DIR...] (or set QSERVE_VARIANT_DIR), or --model-repository ROOT")
    if model_name and len(entries) > 1:
        raise QserveError(f"--model-name names one model, but {len(entries)} DIRs were given; name each as NAME=DIR")
    out: list[ModelSource] = []
    for entry in entries:
        name, path = split_entry(entry)
        if name and model_name:
            raise QserveError(f"{entry}: give the name once, as NAME=DIR or with --model-name, not both")
        name = name or model_name or read_manifest(resolve(path)[0]).name
        out.append(ModelSource(check_name(name, entry), path))
    _refuse_clashes(out)
    return out


def sources_from_root(root: str | Path) -> list[ModelSource]:
    """Every model under --model-repository ROOT (a subdirectory holding a variant or a model dir), by name."""
    root = Path(root)
    if not root.is_dir():
        raise QserveError(
            f"--model-repository {root} is not a directory; give a directory whose subdirectories "
            "are variant dirs or model dirs"
        )
    out = [
        ModelSource(d.name, str(d))
        for d in sorted(root.iterdir())
        if d.is_dir() and NAME_RE.match(d.name) and ((d / "manifest.json").is_file() or RunDir(d).is_run_dir())
    ]
    if not out:
        raise QserveError(
            f"--model-repository {root} holds no model: each model is a subdirectory holding a "
            "variant (manifest.json) or a `qserve pipeline` model dir"
        )
    return out


def _refuse_clashes(sources: list[ModelSource]) -> None:
    seen: dict[str, str] = {}
    for s in sources:
        if s.name in seen:
            raise QserveError(
                f"two models named {s.name!r}: {seen[s.name]} and {s.path}; name them apart with NAME=DIR"
            )
        seen[s.name] = s.path


class Repository:
    """The models a server can load by name: a fixed list (DIRs), or whatever ROOT holds now (--model-repository)."""

    def __init__(self, sources: list[ModelSource], root: str | Path | None = None):
        _refuse_clashes(sources)
        self.initial = list(sources)
        self.root = Path(root) if root is not None else None
        self._fixed = {s.name: s for s in sources}

    @classmethod
    def from_config(cls, variant_dir: str, model_name: str | None, model_repository: str | None) -> Repository:
        if model_repository:
            return cls(sources_from_root(model_repository), model_repository)
        return cls(sources_from_dirs([variant_dir] if variant_dir else [], model_name))

    def source(self, name: str) -> ModelSource:
        """Where `load` of `name` reads; 404 for a name this server cannot load (never a client's path)."""
        if self.root is None:
            if name in self._fixed:
                return self._fixed[name]
            raise ApiError(
                404,
                f"unknown model {name!r}; this server loads {', '.join(map(repr, self._fixed))} "
                "(each from the DIR it was started with)",
            )
        if not NAME_RE.match(name):
            raise ApiError(400, f"model name {name!r} is not valid; a name is {NAME_RULE}")
        path = self.root / name
        if not path.is_dir():
            raise ApiError(404, f"unknown model {name!r}: the model repository has no directory {name!r}")
        return ModelSource(name, str(path))

    def known(self) -> list[ModelSource]:
        """Every model the repository holds now (the index): the fixed list, or ROOT rescanned."""
        if self.root is None:
            return list(self.initial)
        try:
            return sources_from_root(self.root)
        except QserveError:
            return []
