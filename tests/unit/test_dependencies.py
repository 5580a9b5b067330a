"""The installed libraries are the set pyproject.toml pins (issue #47).

    python -m pytest tests/unit/test_dependencies.py -q

Every requirement of the core dependencies must be installed and satisfied; every requirement of an extra
that is installed (cpu, openvino, dev, ...: the extras `make install` adds) must be satisfied too, so a venv
left on an older pin fails here rather than in a test that happens to touch the library. docs/dependencies.md
says what each one is for and why its pin.
"""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement

from qserve.extras import TOOLKIT_ONLY
from qserve.variants import REGISTRY

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def _project() -> dict:
    return tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]


def _installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _unmet(requirements: list[str], required: bool) -> list[str]:
    out = []
    for line in requirements:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate():
            continue
        got = _installed(req.name)
        if got is None:
            if required:
                out.append(f"{req}: not installed")
        elif req.specifier and not req.specifier.contains(got, prereleases=True):
            out.append(f"{req}: {got} installed")
    return out


def test_core_dependencies_are_installed_at_their_pins():
    unmet = _unmet(_project()["dependencies"], required=True)
    assert not unmet, "installed versions off pyproject's pins (make clean-venv && make install): " + "; ".join(unmet)


@pytest.mark.parametrize("extra", sorted(_project()["optional-dependencies"]))
def test_installed_extras_are_at_their_pins(extra):
    unmet = _unmet(_project()["optional-dependencies"][extra], required=False)
    assert not unmet, f"extra {extra}: installed versions off pyproject's pins: " + "; ".join(unmet)


def test_the_serving_profile_installs_none_of_the_toolkit():
    """`pip install 'qserve[serve]'` (the core + the serve extra, the serve image's set) names no torch, transformers,
    bitsandbytes, Lightning or optimum: a variant's tokenizer runs on `tokenizers` (qserve/tokenization.py)."""
    project = _project()
    names = {
        Requirement(r).name.lower() for r in [*project["dependencies"], *project["optional-dependencies"]["serve"]]
    }
    toolkit = {m.replace("_", "-") for m in TOOLKIT_ONLY} | {"lightning", "optimum-intel"}  # distribution names
    assert not names & toolkit, sorted(names & toolkit)
    assert {"tokenizers", "onnxruntime", "openvino"} <= names


def test_each_backend_names_what_pyproject_declares():
    """A backend's facts about packaging hold in pyproject.toml: the extras its install commands name exist, and the
    distributions whose versions it records are each required by the core or an extra (a new backend's one edit
    outside its own files is its extra)."""
    project = _project()
    extras = set(project["optional-dependencies"])
    required = {
        Requirement(r).name.lower()
        for r in [*project["dependencies"], *sum(project["optional-dependencies"].values(), [])]
    }
    for b in REGISTRY.values():
        named = set(re.findall(r"qserve\[(\w+)\]", b.install + b.cuda_install))
        assert named <= extras, f"{b.name}: {b.install!r} names {sorted(named - extras)}, no extra of pyproject.toml"
        assert set(b.distributions) <= required, f"{b.name}: {sorted(set(b.distributions) - required)} not required"
