"""End to end on the embedded default, through the real CLI: pipeline -> serve -> classify.

    python -m pytest tests/e2e/test_e2e_default.py -q      # ~2-3 min on 2 cores

A short pipeline (800 IMDb reviews at 32 tokens, three variants, one bench shape)
proves the whole main job runs from the PyPI-embedded model and data with no hub,
that its release gate scores the bench's own texts and the recommendation is a gated
variant (or the reference), that re-running reuses finished stages, and that the
exported onnx-int8 variant serves the same answers over HTTP as the runtime gives in-process.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO)}
# 500 val / test reviews (not 2,000) keep the training stage short. The long-text pass runs with head alone (not
# four policies): the main job still runs it and reports it, while windows, which scores each review as several
# pieces, was the costliest step of the reference's bench and no test here reads it; the policies' own comparison is
# tests/integration/test_bench_long_text.py's. 32 tokens, not 64: 137 -> 102 s for the pipeline
# on the AMX Xeon, test accuracy 0.728 -> 0.720, onnx-int8 agreement 99.5% -> 100% (one run each)
# onnx-fp32 agrees with the reference on every text, so the gate has a candidate even where this briefly trained
# model's int8 misses its bar
ARGS = [
    "--max-samples",
    "800",
    "--max-eval-samples",
    "500",
    "--max-length",
    "32",
    "--variants",
    "torch-fp32,onnx-fp32,onnx-int8",
    "--bench-eval-samples",
    "200",
    "--bench-long-text",
    "head",
    "--batch-sizes",
    "1,8",
    "--seq-lens",
    "32",
    "--threads",
    "2",
]


def qserve(*argv: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "qserve", *argv], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("e2e") / "run"
    res = qserve("pipeline", "--run-dir", str(run), *ARGS)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert f"report: {run / 'report' / 'report.md'}" in res.stdout
    return run


def test_pipeline_outputs(run_dir):
    metrics = json.loads((run_dir / "checkpoint" / "train_metrics.json").read_text())
    from qserve.devices import cpu_supports_bf16

    # --precision auto (the default): bf16-mixed where bf16 is native, 32-true elsewhere; said and recorded
    want = "bf16-mixed" if cpu_supports_bf16() else "32-true"
    choice = metrics["precision_choice"]
    assert metrics["precision"] == choice["precision"] == want and choice["asked"] == "auto"
    assert metrics["device"] == "cpu" and "measured" in choice["reason"]
    assert metrics["time_budget"]["cut"] is False  # the pipeline's budget never binds on this short recipe
    assert metrics["sizes"] == {"train": 800, "val": 500, "test": 500}  # --max-samples, --max-eval-samples
    # 800 reviews at 32 tokens learn well past chance; the full default (README) reaches > 82%
    assert metrics["test_accuracy"] > 0.6, metrics["test_accuracy"]
    meta = json.loads((run_dir / "checkpoint" / "qserve_model.json").read_text())
    assert meta["model_name"].startswith("minilm-l6-distilbert") and "distilbert-base" not in meta["model_name"]
    report = json.loads((run_dir / "report" / "report.json").read_text())
    rows = {v["name"]: v for v in report["variants"]}
    repaired = [r for r in report["repair"]["rows"] if r["dir"]]  # onnx-int8, where it could win and failed
    assert set(rows) == {"torch-fp32", "onnx-fp32", "onnx-int8"} | {f"{r['variant']}-repaired" for r in repaired}
    assert all(v["status"] == "ok" for v in rows.values())
    # This briefly trained model leaves many reviews near p=0.5, where int8 noise flips a few
    # (93.5% measured); the fully trained default agrees >= 99% (benchmarks/reports).
    int8 = rows["onnx-int8"]
    assert int8["agreement"] >= 0.9, int8["agreement"]
    assert abs(int8["accuracy"]["accuracy"] - rows["torch-fp32"]["accuracy"]["accuracy"]) <= 0.03
    for p in ("report.md", "report.csv", "latency_vs_batch.png", "accuracy_vs_size.png"):
        assert (run_dir / "report" / p).stat().st_size > 0
    md = (run_dir / "report" / "report.md").read_text()
    assert "onnx-int8" in md and "Compute floor" in md
    stages = report["pipeline"]["stage_s"]  # the run that measured the report keeps its stage times
    assert set(stages) == {"train", "export", "bench", "gate", "repair", "total"}
    assert stages["total"] >= stages["bench"] > 0
    # the release gate: candidates faster than the reference that meet their bar, on the 200 texts the bench scored
    gate, rec = report["gate"], report["recommended"]
    assert "## Release gate" in md
    if gate["rows"]:
        results = json.loads((run_dir / "report" / "gate" / "gate.json").read_text())["results"]
        assert all(r["gate"]["sequential"]["looks"][0]["n"] == 200 for r in results)  # more where undecided
        assert [r["variant"] for r in gate["rows"]] == [r["variant"] for r in results]
        passed = [r["variant"] for r in results if r["gate"]["passed"]]
        assert rec["variant"] in passed or rec["variant"] == "torch-fp32"
        assert rows[rec["variant"]].get("gate", {}).get("passed", rec["variant"] == "torch-fp32")
    else:  # nothing faster than the reference met its bar: the reference is recommended, and the report says why
        assert gate["why"].startswith("no variant faster than the reference") and rec["variant"] == "torch-fp32"
    for r in repaired:  # its bench row carries what was kept and its search; its gate ran on the test texts
        row = rows[f"{r['variant']}-repaired"]
        assert row["repair"]["of"] == r["variant"] and row["repair"]["trace"][0]["kept"] == []
        assert row["gate"]["decision"] == r["gate"] and row["status"] == "ok"
    assert "## Pipeline stages" in md
    assert f"Training precision: **{want}** (asked: `auto`): {choice['reason']}." in md
    assert report["pipeline"]["training"]["precision_choice"] == choice


# The re-runs go through the same CLI entry in this process (the fixture's run is the real `qserve pipeline`
# process): a re-run that reuses every stage starts no child, so a fresh interpreter's imports were most of its time.
def test_rerun_reuses_every_stage(run_dir, capsys):
    from qserve.cli import main

    before = (run_dir / "report" / "report.json").read_bytes()
    capsys.readouterr()
    assert main(["pipeline", "--run-dir", str(run_dir), *ARGS]) == 0
    out = capsys.readouterr().out
    assert out.count("reusing") == 7, out  # checkpoint, 3 variants, report, gate, repair
    assert (run_dir / "report" / "report.json").read_bytes() == before


def test_rerun_with_other_config_refuses_without_force(run_dir, capsys):
    from qserve.cli import main

    capsys.readouterr()
    assert main(["pipeline", "--run-dir", str(run_dir), *[a if a != "800" else "900" for a in ARGS]]) == 2
    assert "trained with another config; pass --force" in capsys.readouterr().err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_the_exported_int8_variant(run_dir):
    import httpx2

    from qserve.runtime import load_runtime

    variant = run_dir / "variants" / "onnx-int8"
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "qserve",
            "serve",
            str(variant),
            "--port",
            str(port),
            "--threads",
            "1",
            "--log-level",
            "warning",
        ],
        cwd=REPO,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if httpx2.get(f"{url}/ready", timeout=2).status_code == 200:
                    break
            except httpx2.TransportError:
                pass
            assert time.monotonic() < deadline, "server never became ready"
            time.sleep(0.25)
        texts = [
            "A beautiful, moving film. The best I have seen this year.",
            "Dreadful acting and a plot full of holes; a waste of two hours.",
        ]
        r = httpx2.post(f"{url}/v1/classify", json={"inputs": texts}, timeout=30)
        assert r.status_code == 200, r.text
        body = r.json()
        rt = load_runtime(variant, device="cpu")
        probs = rt.predict(texts)
        for i, ranked in enumerate(body["predictions"]):
            best = max(range(len(rt.labels)), key=lambda k: probs[i][k])
            assert ranked[0]["label"] == rt.labels[best]
            assert abs(ranked[0]["score"] - float(probs[i][best])) < 1e-4
    finally:
        proc.terminate()
        proc.wait(timeout=60)
