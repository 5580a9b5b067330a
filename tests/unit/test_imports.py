"""Importing qserve and building the CLI must not start torch, onnxruntime or bitsandbytes."""

import subprocess
import sys

HEAVY = ["torch", "onnxruntime", "bitsandbytes", "transformers", "lightning_fabric", "optimum", "ray"]


def _loaded_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, check=True).stdout
    import json

    return set(json.loads(out.strip().splitlines()[-1]))


def test_import_qserve_is_light():
    mods = _loaded_after("import qserve, qserve.variants, qserve.artifact, qserve.runtime, exporters")
    assert not [m for m in HEAVY if m in mods], [m for m in HEAVY if m in mods]


def test_cli_help_is_light():
    mods = _loaded_after("from qserve.cli import build_parser\nbuild_parser().format_help()")
    assert not [m for m in HEAVY if m in mods], [m for m in HEAVY if m in mods]


def test_help_lists_every_stage():
    out = subprocess.run([sys.executable, "-m", "qserve", "--help"], capture_output=True, text=True, check=True).stdout
    for cmd in ("pipeline", "train", "export", "variants", "bench", "report", "serve", "loadtest"):
        assert cmd in out


LAZY = ("torch", "transformers", "onnxruntime", "openvino", "bitsandbytes", "lightning", "lightning_fabric",
        "optimum", "ray", "grpc", "datasets", "nncf", "matplotlib", "onnx", "onnxscript", "accelerate", "safetensors",
        "tokenizers", "huggingface_hub", "scipy", "sklearn", "pandas", "opentelemetry")
"""The libraries qserve imports inside the function that needs them: heavy to import (the ML stacks, matplotlib) or
an optional extra's (ray, grpc, openvino, bitsandbytes, opentelemetry), so `qserve --help` answers at once and a
missing backend fails only its own command. Everything else, qserve's own modules first, is imported at the top
of the module (docs/architecture.md)."""


def _modules() -> dict[str, "object"]:
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = {}
    for pkg in ("qserve", "exporters"):
        for p in (root / pkg).rglob("*.py"):
            parts = list(p.relative_to(root).with_suffix("").parts)
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = (p, ast.parse(p.read_text(encoding="utf-8")))
    return out


def test_own_modules_are_imported_at_the_top_unless_they_pull_a_lazy_library():
    """A function-level import of qserve's or the exporters' own module is kept only where that module imports a
    LAZY library at its top (itself or through its own top-level imports): the laziness is the library's."""
    import ast

    mods = _modules()

    def top_imports(tree) -> set[str]:
        names = set()
        for node in tree.body:
            for sub in ast.walk(node) if isinstance(node, (ast.If, ast.Try)) else [node]:
                if isinstance(sub, ast.Import):
                    names |= {a.name for a in sub.names}
                elif isinstance(sub, ast.ImportFrom) and sub.module and not sub.level:
                    names.add(sub.module)
                    names |= {f"{sub.module}.{a.name}" for a in sub.names}
        return names

    heavy: dict[str, bool] = {}

    def is_heavy(name: str, seen: frozenset = frozenset()) -> bool:
        if name in heavy:
            return heavy[name]
        if name.split(".")[0] in LAZY:
            return True
        if name not in mods or name in seen:
            return False
        deps = top_imports(mods[name][1])
        parents = [".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)]  # packages run first
        heavy[name] = any(is_heavy(d, seen | {name}) for d in deps | set(parents) if d != name)
        return heavy[name]

    hoistable = []
    for name, (path, tree) in mods.items():
        if path.name == "__init__.py":
            continue  # a package's lazy facade (__getattr__) is its own reason
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for sub in ast.walk(fn):
                if isinstance(sub, ast.ImportFrom) and sub.module and not sub.level and \
                        sub.module.split(".")[0] in ("qserve", "exporters"):
                    targets = [f"{sub.module}.{a.name}" if f"{sub.module}.{a.name}" in mods else sub.module
                               for a in sub.names]
                    if not any(is_heavy(t) for t in targets):
                        hoistable.append(f"{path.name}:{sub.lineno} from {sub.module} import ...")
    assert not hoistable, "import these at the top (they pull no lazy library):\n" + "\n".join(hoistable)
