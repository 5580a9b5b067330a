"""The installed libraries are the set pyproject.toml pins (issue #47).

    python -m pytest tests/unit/test_dependencies.py -q

Every requirement of the core dependencies must be installed and satisfied; every requirement of an extra
that is installed (cpu, openvino, dev, ...: the extras `make install` adds) must be satisfied too, so a venv
left on an older pin fails here rather than in a test that happens to touch the library. docs/dependencies.md
says what each one is for and why its pin.
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement

from qserve.extras import TOOLKIT_ONLY

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
