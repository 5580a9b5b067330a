"""Imports at the top of every module, but the lazy libraries': importing qserve and building the CLI start no ML stack.

    python -m pytest tests/unit/test_imports.py -q

ruff enforces the rule in the suite (tests/unit/test_lint.py: PLC0415 with TID253's banned list in pyproject.toml);
this file says why each library on that list is lazy, requires the list to be exactly LAZY + LAZY_OWN, and checks
the rule itself on the sources, so it holds even before the tree is formatted. tests/unit/hoist_imports.py moves
what breaks it (ruff finds those imports but cannot move them).
"""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from qserve.variants import REGISTRY

ROOT = Path(__file__).resolve().parents[2]
BACKEND_LIBRARIES = tuple(
    dict.fromkeys(m.split(".")[0] for b in REGISTRY.values() for m in (*b.needs, *b.export_needs, *b.libraries))
)
"""Every backend's libraries (the registry's `needs`, `export_needs` and `libraries`): lazy, so a missing one fails
only its own backend's commands. Derived, so a new backend's are lazy from its declaration on."""
HEAVY = [*BACKEND_LIBRARIES, "lightning_fabric", "ray"]

LAZY = (
    *BACKEND_LIBRARIES,
    "lightning",
    "lightning_fabric",
    "ray",
    "grpc",
    "datasets",
    "matplotlib",
    "onnxscript",
    "safetensors",
    "tokenizers",
    "huggingface_hub",
    "scipy",
    "sklearn",
    "pandas",
    "opentelemetry",
    "pyarrow",
    "tritonclient",
    "optimi",
    "yaml",
)
"""The libraries qserve imports inside the function that needs them, so `qserve --help` answers at once and a
missing backend fails only its own command:
- a backend's (BACKEND_LIBRARIES: torch, transformers, bitsandbytes, accelerate, onnxruntime, onnx, openvino, nncf,
  optimum);
- heavy to import: the other ML stacks (tokenizers, safetensors, lightning(_fabric), onnxscript, huggingface_hub,
  scipy, sklearn, pandas), matplotlib, and optimi (torch-optimi imports torch);
- an optional extra's (pyproject.toml): ray and pyarrow (ray, predict), grpc and tritonclient (grpc, dev),
  opentelemetry's SDK (otel), datasets (hub);
- not a declared dependency: yaml (PyYAML comes with transformers; only `qserve deploy ray` writes YAML).
Everything else, qserve's own modules first, the standard library, numpy, psutil, uvicorn, httpx2, tqdm and
prometheus_client (declared dependencies, each imported in well under a second), sits at the top of the module
(docs/architecture.md)."""

LAZY_OWN = ("qserve.serve.ray_engine", "qserve.predict.ray_data", "qserve.serve.protocols.v2.grpc_service")
"""qserve's own modules that import a LAZY library as they load (Ray Serve, Ray Data, gRPC), so they are imported
inside the function that needs them too, and nowhere at a module's top."""


def _loaded_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return set(json.loads(out.strip().splitlines()[-1]))


def test_import_qserve_is_light():
    mods = _loaded_after("import qserve, qserve.variants, qserve.artifact, qserve.runtime, exporters")
    assert not [m for m in HEAVY if m in mods], [m for m in HEAVY if m in mods]


def test_cli_help_is_light():
    mods = _loaded_after("from qserve.cli import build_parser\nbuild_parser().format_help()")
    assert not [m for m in HEAVY if m in mods], [m for m in HEAVY if m in mods]


def test_a_command_builds_only_its_own_parser():
    """`qserve serve` (a container's PID 1) imports no other stage's code: seconds of every start (docs/deploy.md)."""
    mods = _loaded_after("from qserve.cli import build_parser, command_named\nbuild_parser(command_named(['serve']))")
    assert "qserve.serve.cli" in mods
    assert not [
        m
        for m in (
            "qserve.training.train",
            "qserve.training.study",
            "exporters.cli",
            "qserve.bench.cli",
            "qserve.gate.cli",
            "qserve.pipeline",
        )
        if m in mods
    ]


def test_help_lists_every_stage():
    out = subprocess.run([sys.executable, "-m", "qserve", "--help"], capture_output=True, text=True, check=True).stdout
    for cmd in ("pipeline", "train", "export", "variants", "bench", "report", "serve", "loadtest"):
        assert cmd in out


def test_ruffs_banned_list_is_lazy_and_lazy_own():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["ruff"]["lint"]
    banned = config["flake8-tidy-imports"]["banned-module-level-imports"]
    assert len(banned) == len(set(banned)) and set(banned) == {*LAZY, *LAZY_OWN}, sorted(
        {*LAZY, *LAZY_OWN} ^ set(banned)
    )
    assert {"PLC0415", "TID253"} <= set(config["select"])


@pytest.mark.parametrize("module", LAZY_OWN)
def test_each_lazy_own_module_imports_a_lazy_library(module):
    loaded = {m.split(".")[0] for m in _loaded_after(f"import {module}")}
    assert loaded & set(LAZY) - {"opentelemetry"}, f"{module} imports no LAZY library: import it at the top"


def _function_level_imports() -> list[tuple[Path, int, list[str]]]:
    out = []
    for pkg in ("qserve", "exporters", "benchmarks"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            seen: set[int] = set()
            for fn in ast.walk(tree):
                if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                for node in ast.walk(fn):
                    if id(node) in seen:
                        continue
                    seen.add(id(node))
                    if isinstance(node, ast.Import):
                        out.append((path, node.lineno, [a.name for a in node.names]))
                    elif isinstance(node, ast.ImportFrom):
                        base = "." * node.level + (node.module or "")
                        out.append((path, node.lineno, [base, *(f"{base}.{a.name}" for a in node.names)]))
    return out


def test_imports_inside_functions_are_the_lazy_libraries_only():
    """In qserve, exporters and benchmarks, an import inside a function imports a LAZY library or a LAZY_OWN module;
    anything else is imported at the top of its module, so the dependency graph is what a reader sees."""

    def lazy(name: str) -> bool:
        return name.split(".")[0] in LAZY or any(name == m or name.startswith(m + ".") for m in LAZY_OWN)

    stray = [
        f"{path.relative_to(ROOT)}:{line} imports {names[0]}"
        for path, line, names in _function_level_imports()
        if not any(lazy(n) for n in names)
    ]
    assert not stray, (
        "import these at the top of their module (python tests/unit/hoist_imports.py FILE... moves "
        "them):\n" + "\n".join(stray)
    )
