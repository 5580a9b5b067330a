"""Imports flow one way: the import-linter contracts in pyproject.toml hold, and break when they should.

    python -m pytest tests/unit/test_layers.py -q

Imports inside functions count like top-level ones (grimp reads every import statement),
so a lazy import cannot smuggle a cycle or an upward dependency past the check. The benchmarks
package is the top layer: it imports qserve and exporters, nothing imports it (tests aside).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10: import-linter brings tomli
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
LINT = [sys.executable, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()"]


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}  # the packages under root, not an installed copy
    return subprocess.run([*LINT, "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=300)


def test_contracts_hold():
    r = lint_imports(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout


def test_every_top_level_module_has_a_layer():
    """A new module must be placed in the layers, or nothing would hold its imports."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    layers = next(c for c in config["contracts"] if c["type"] == "layers")["layers"]
    named = {m.strip().strip("()") for layer in layers for m in layer.replace("|", ":").split(":")}
    found = {f"qserve.{p.stem}" for p in (ROOT / "qserve").glob("*.py") if p.stem != "__init__"}
    found |= {f"qserve.{p.parent.name}" for p in (ROOT / "qserve").glob("*/__init__.py")}
    assert found - named == set(), f"add these to the layers contract in pyproject.toml: {sorted(found - named)}"
    assert "exporters" in named


def _copy_tree(dst: Path) -> Path:
    for name in ("qserve", "exporters", "benchmarks"):
        shutil.copytree(ROOT / name, dst / name, ignore=shutil.ignore_patterns("__pycache__", "reports"))
    shutil.copy2(ROOT / "pyproject.toml", dst / "pyproject.toml")
    return dst


def _append(path: Path, code: str) -> None:
    path.write_text(path.read_text(encoding="utf-8") + "\n\n" + code, encoding="utf-8")


def test_a_cycle_an_upward_import_and_a_stray_exporters_import_break_the_contracts(tmp_path):
    root = _copy_tree(tmp_path)
    # each one inside a function: the lazy imports the contracts must see too
    _append(
        root / "qserve" / "bench" / "stats.py",
        "def _cycle():\n    from qserve.bench.recommend import recommend\n    return recommend\n",
    )
    _append(
        root / "qserve" / "variants.py",
        "def _upward():\n    from qserve.runtime import load_runtime\n    return load_runtime\n",
    )
    _append(root / "qserve" / "training" / "study.py", "def _stray():\n    import exporters\n    return exporters\n")
    _append(root / "qserve" / "devices.py", "def _bench():\n    from benchmarks import harness\n    return harness\n")
    r = lint_imports(root)
    out = r.stdout
    assert r.returncode == 1, out + r.stderr
    assert "No cycles are allowed in qserve.bench." in out
    assert ".stats -> .recommend" in out or ".recommend -> .stats" in out
    assert "qserve.variants is not allowed to import qserve.runtime" in out
    assert "qserve.variants -> qserve.runtime (l." in out
    assert "Only qserve.cli, qserve.pipeline, qserve.repair and benchmarks import exporters BROKEN" in out
    assert "qserve.training.study" in out.split("Only qserve.cli, qserve.pipeline")[-1]
    assert "qserve.devices is not allowed to import benchmarks" in out  # the benchmarks are the top layer


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_module_imports_itself_back():
    """Stricter than acyclic_siblings, which compares siblings only: no cycle between any two
    modules at all, a package and its own modules included (exporters <-> exporters.core was one)."""
    import grimp

    g = grimp.build_graph("qserve", "exporters", "benchmarks", cache_dir=None)
    graph = {m: set(g.find_modules_directly_imported_by(m)) for m in g.modules}
    assert "benchmarks.harness" in graph["benchmarks.serve_bench.engines"]  # the scripts' imports are seen
    assert _cycles(graph) == []
