"""A backend is one declaration: the toy backend of tests/toy_backend/ (its declaration, exporter and runtime, three
files) is registered by QSERVE_BACKENDS alone, and `qserve export`, `bench`, `gate` and `serve` run it, each as
the real command in its own process, with no edit anywhere in qserve/ or exporters/. Its declaration copied into a
copy of qserve/backends/ makes it a built-in that every table derived from the registry lists.

    python -m pytest tests/integration/test_toy_backend.py -q
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import build_tiny_checkpoint

httpx2 = pytest.importorskip("httpx2")

TESTS = Path(__file__).resolve().parents[1]
ENV = {
    **os.environ,
    "QSERVE_BACKENDS": "toy_backend.backend:BACKEND",
    "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS), os.environ.get("PYTHONPATH", "")]),
    "QSERVE_FORCE_CPU": "1",
}


def qserve(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "qserve", *args], env=ENV, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A tiny checkpoint naming the embedded dataset, its torch-fp32 reference, and toy-fp32 exported by the CLI."""
    import exporters

    root = tmp_path_factory.mktemp("toy")
    ckpt = build_tiny_checkpoint(root / "checkpoint")
    meta = {"model_name": "tiny-distilbert", "max_length": 64, "dataset": "default", "seed": 42}
    (ckpt / "qserve_model.json").write_text(json.dumps({**meta, "max_eval_samples": 200}))
    exporters.export(ckpt, "torch-fp32", root / "variants" / "torch-fp32")
    done = qserve("export", str(ckpt), "--variant", "toy-fp32", "--note", "from the CLI")
    assert done.returncode == 0, done.stderr
    return root


def test_export_reads_the_toy_declaration(run):
    helped = qserve("export", "--help").stdout
    assert "--note TEXT" in helped and "toy-fp32: a note the exporter records" in helped
    m = json.loads((run / "variants" / "toy-fp32" / "manifest.json").read_text())
    assert m["spec"]["backend"] == "toy" and m["spec"]["options"] == {"note": "from the CLI"}
    assert m["toy"]["options"] == {"note": "from the CLI"} and m["parity"]["agreement"] == 1.0
    bad = qserve("export", str(run / "checkpoint"), "--variant", "toy-fp32", "--smooth", "--out", str(run / "x"))
    assert bad.returncode != 0 and "--smooth applies to onnx-int8, not toy-fp32" in bad.stderr


def test_bench_measures_it(run):
    out = run / "bench"
    flags = ["--batch-sizes", "1", "--seq-lens", "16", "--threads", "1", "--max-eval-samples", "20", "--no-floor"]
    fast = ["--real-text-samples", "0", "--invariance-samples", "0", "--time-budget", "0.05", "--max-iters", "5"]
    done = qserve(
        "bench", *(str(run / "variants" / n) for n in ("torch-fp32", "toy-fp32")), *flags, *fast, "--out", str(out)
    )
    assert done.returncode == 0, done.stderr
    ref, toy = json.loads((out / "report.json").read_text())["variants"]
    assert toy["status"] == "ok" and toy["spec"]["backend"] == "toy" and toy["device"] == "cpu"
    assert toy["accuracy"]["n"] == 20 and toy["agreement"] == 1.0  # the same weights as torch-fp32


def test_gate_seals_its_verdict_and_serve_answers_from_it(run):
    variant = run / "variants" / "toy-fp32"
    done = qserve("gate", str(variant), "--threads", "1", "--out", str(run / "gate"))
    assert done.returncode == 0, done.stderr
    assert json.loads((variant / "manifest.json").read_text())["gate"]["passed"] is True

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "qserve",
            "serve",
            str(variant),
            "--require-gate",
            "--port",
            str(port),
            "--threads",
            "1",
        ],
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        with httpx2.Client(base_url=f"http://127.0.0.1:{port}", timeout=30, trust_env=False) as c:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                try:
                    if c.get("/ready").status_code == 200:
                        break
                except httpx2.TransportError:
                    pass
                assert server.poll() is None, server.stderr.read().decode() if server.stderr else ""
                time.sleep(0.2)
            answer = c.post("/v1/classify", json={"inputs": ["a fine film"]})
            assert answer.status_code == 200 and answer.json()["model"] == "toy-fp32"
            assert c.get("/v1/models").json()["models"][0]["gate"]["passed"] is True
    finally:
        server.terminate()
        server.wait(timeout=30)


BUILT_IN = """
import argparse, json, sys
from dataclasses import fields
sys.path.insert(0, "tests/unit")
import test_dependencies, test_imports
from exporters import get_builder
from exporters.cli import register as export_cli
from qserve import extras, placement, variants
from qserve.bench import plots
from qserve.configflags import METADATA_KEY
from qserve.gate.config import GateConfig

test_imports.test_ruffs_banned_list_is_lazy_and_lazy_own()  # ruff's list in pyproject.toml covers its libraries
test_dependencies.test_each_backend_names_what_pyproject_declares()
test_dependencies.test_the_serving_profile_installs_none_of_the_toolkit()
sub = argparse.ArgumentParser().add_subparsers()
export_cli(sub)
print(json.dumps({
    "registry": variants.__file__, "backends": variants.BACKENDS, "variants": list(variants.VARIANTS),
    "runs": placement.plan("cpu").runs, "builder": callable(get_builder(variants.REGISTRY["toy"])),
    "references": variants.REFERENCES, "torch_threads": variants.TORCH_THREADS, "libraries": variants.LIBRARIES,
    "toolkit_only": extras.TOOLKIT_ONLY, "lazy": test_imports.LAZY, "heavy": test_imports.HEAVY,
    "colours": plots.FAMILY_COLOURS, "spare": plots.SPARE_COLOURS,
    "export": sub.choices["export"].format_help(),
    "gate": next(f.metadata[METADATA_KEY].default_text for f in fields(GateConfig) if f.name == "reference"),
}))
"""


def test_its_declaration_in_qserve_backends_makes_it_a_built_in(tmp_path):
    """A copy of the tree (qserve/, exporters/, pyproject.toml and the unit tests that check the registry against
    pyproject.toml) with one file added, qserve/backends/toy.py (the toy's declaration as it is), and no
    QSERVE_BACKENDS: every list derived from the registry names the toy, and the checks hold without another edit."""
    root = TESTS.parent
    ignore = shutil.ignore_patterns("__pycache__")
    for part in ("qserve", "exporters"):
        shutil.copytree(root / part, tmp_path / part, ignore=ignore)
    shutil.copy2(root / "pyproject.toml", tmp_path)
    (tmp_path / "tests" / "unit").mkdir(parents=True)
    for name in ("test_imports.py", "test_dependencies.py"):
        shutil.copy2(TESTS / "unit" / name, tmp_path / "tests" / "unit" / name)
    shutil.copy2(TESTS / "toy_backend" / "backend.py", tmp_path / "qserve" / "backends" / "toy.py")  # the one edit

    env = {k: v for k, v in ENV.items() if k != "QSERVE_BACKENDS"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(TESTS)])  # the toy's exporter and runtime: tests/
    done = subprocess.run(
        [sys.executable, "-c", BUILT_IN], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["registry"].startswith(str(tmp_path))
    assert got["backends"] == ["torch", "bnb", "onnx", "openvino", "toy"] and got["variants"][-1] == "toy-fp32"
    assert "toy-fp32" in got["runs"] and got["builder"]
    assert "--backend {torch,bnb,onnx,openvino,toy}" in got["export"] and "--note TEXT" in got["export"]
    assert got["references"] == ["torch-fp32", "onnx-fp32", "toy-fp32"]  # bench's and the gate's order
    assert got["gate"] == "torch-fp32, else onnx-fp32, else toy-fp32, beside the variant"  # gate --reference's help
    assert got["torch_threads"] == ["torch", "bnb", "toy"]  # the shadow leaves torch's pool alone for it too
    from qserve.extras import TOOLKIT_ONLY
    from qserve.variants import LIBRARIES

    assert "safetensors" not in {*LIBRARIES, *TOOLKIT_ONLY}  # no built-in's: the toy's alone below
    assert "safetensors" in got["libraries"] and "safetensors" in got["toolkit_only"]
    assert {"torch", "transformers", "safetensors"} <= set(got["lazy"]) & set(got["heavy"])
    assert got["colours"]["toy"] == "#56B4E9" and "#56B4E9" not in got["spare"]
