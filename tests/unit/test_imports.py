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
