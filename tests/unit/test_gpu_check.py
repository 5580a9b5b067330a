"""benchmarks/gpu/check.sh keeps its budgets: proven on the CPU with the real script, real bash, real Python children.

    python -m pytest tests/unit/test_gpu_check.py -q

The rehearsal (QSERVE_GPU_CHECK_DRY=rehearse) runs call B's own stage list, each stage sleeping its estimated GPU
time in steps and writing its report after each, every time scaled down (QSERVE_GPU_CHECK_SCALE) so the call's
5 minutes take seconds; the graphs stage is made to overrun (QSERVE_GPU_CHECK_OVERRUN) and is killed at its limit.
No GPU and no ML library is needed: what is measured is the script's plumbing and its clock.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.gpu import stage as gpu_stage

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu" / "check.sh"
SCALE = 0.15  # call B's 300 s in 45 s: its 15% reserve then covers the summary's Python start-ups


def _run(tmp: Path, call: str, **env: str) -> tuple[subprocess.CompletedProcess, float]:
    (tmp / "wheels").mkdir(exist_ok=True)  # no carried wheels: the install stage says so and is skipped
    base = {k: v for k, v in os.environ.items() if not k.startswith("QSERVE_")}
    full = {
        **base,
        "PYTHON": sys.executable,
        "QSERVE_GPU_CHECK_DRY": "rehearse",
        "QSERVE_GPU_CHECK_STATE": str(tmp / "state"),
        "QSERVE_WHEEL_DIR": str(tmp / "wheels"),
        **env,
    }
    t0 = time.monotonic()
    r = subprocess.run(["bash", str(SCRIPT), call, str(tmp / "out")], capture_output=True, text=True, env=full)
    return r, time.monotonic() - t0


def _stages(tmp: Path, call: str) -> dict[str, list[str]]:
    rows = (tmp / "state" / f"call-{call}" / "stages.tsv").read_text().splitlines()
    return {r.split("\t")[0]: r.split("\t") for r in rows}


def test_a_stage_killed_at_its_limit_keeps_its_steps_and_the_call_ends_in_time(tmp_path):
    r, took = _run(tmp_path, "B", QSERVE_GPU_CHECK_SCALE=str(SCALE), QSERVE_GPU_CHECK_OVERRUN="graphs")
    assert r.returncode == 1, r.stdout + r.stderr  # one stage not ok: the graphs stage was killed
    assert took <= 300 * SCALE, f"call B took {took:.1f} s of its {300 * SCALE:g} s"
    st = _stages(tmp_path, "B")
    assert st["install"][1] == "skipped" and "no " in st["install"][4]
    # the graphs stage, killed at its limit, kept the steps it finished, and said so
    g = st["graphs"]
    assert g[1] == "timeout" and g[2] == "124" and "killed at its" in g[4] and "kept: step 1" in g[4], g
    assert float(g[3]) < float(g[5]) + 1.5  # killed at its limit, not later
    rep = json.loads((tmp_path / "state" / "call-B" / "graphs" / "report.json").read_text())
    assert rep["done"] is False and rep["steps"] and rep["steps"][0]["step"] == "step 1"
    # the stages after it ran to the end
    for name in ("preflight", "prep", "floor", "study"):
        assert st[name][1] == "ok", st[name]
    # the call's files: at most 8, the summary naming every stage
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert len(files) <= 8 and {"summary.md", "gpu_check.json", "logs_tail.txt", "gpu_check_files.tar.gz"} <= set(
        files
    ), files
    md = (tmp_path / "out" / "summary.md").read_text()
    assert "| graphs | timeout | 124 |" in md and "| study | ok | 0 |" in md
    assert "==> logs/main.log" in (tmp_path / "out" / "logs_tail.txt").read_text()


def test_the_preflight_stops_the_call_at_once_saying_what_is_missing(tmp_path):
    r, took = _run(tmp_path, "A", QSERVE_GPU_CHECK_NEED="json,no_such_module_qserve")
    assert r.returncode == 3, r.stdout + r.stderr
    assert took < 30  # stopped at once, not after the call's 5 minutes of stages
    st = _stages(tmp_path, "A")
    assert st["preflight"][1] == "failed" and "1 missing" in st["preflight"][4]
    assert st["pipeline"][1] == st["serve"][1] == "skipped"
    pre = json.loads((tmp_path / "state" / "call-A" / "preflight.json").read_text())
    assert list(pre["missing"]) == ["no_such_module_qserve"]
    md = (tmp_path / "out" / "summary.md").read_text()
    assert "preflight:" in md and "no_such_module_qserve" in md


def test_a_python_that_does_not_run_is_said_and_a_file_written(tmp_path):
    r, _ = _run(tmp_path, "B", PYTHON=str(tmp_path / "no-python"))
    assert r.returncode == 3 and "does not run" in (tmp_path / "out" / "summary.md").read_text()


def test_the_verdict_tells_a_missed_target_from_a_crash(tmp_path):
    rep = gpu_stage.StageReport(tmp_path / "serve", "serve")
    rep.start("loadtest c1")
    rep.done("loadtest c1", p50_ms=3.0)
    rep.check("served c1 p50 ms", 3.0, "<=", 2.0)
    rep.check("served lost", 0, "<=", 0)
    assert rep.finish() == 1
    log = tmp_path / "serve.log"
    log.write_text("starting\nTraceback ...\nValueError: boom\n")
    status, note = gpu_stage.verdict(tmp_path, "serve", 1, "35", log, None)
    assert status == "ran, 1 targets missed" and "served c1 p50 ms 3 (target <= 2)" in note
    rep.start("loadtest c32")  # a crash in the next step: failed, naming the step and the log's last line
    status, note = gpu_stage.verdict(tmp_path, "serve", 1, "35", log, None)
    assert status == "failed" and "in loadtest c32" in note and "ValueError: boom" in note
    status, note = gpu_stage.verdict(tmp_path, "serve", 124, "35", log, None)
    assert status == "timeout" and "killed at its 35 s limit in loadtest c32; kept: loadtest c1" == note


def test_the_pipeline_is_held_to_its_gpu_bars_from_its_run_dir(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoint").mkdir(parents=True)
    (run / "report").mkdir()
    (run / "checkpoint" / "train_metrics.json").write_text(
        json.dumps({"samples_per_s": 1000.0, "test_accuracy": 0.92, "config": {"max_length": 512}})
    )
    (run / "report" / "report.json").write_text(
        json.dumps(
            {
                "pipeline": {"stage_s": {"total": 280.0}},
                "recommended": {"variant": "torch-bf16"},
                "variants": [{"name": "torch-bf16", "fixed": [{"batch": 1, "seq": 128, "p50": 0.9}]}],
            }
        )
    )
    log = tmp_path / "pipeline.log"
    log.write_text("done\n")
    status, note = gpu_stage.verdict(tmp_path, "pipeline", 0, "180", log, run, targets=True)
    assert status == "ran, 2 targets missed", note  # 512,000 tokens/s and 0.9 ms; b32 not measured: no verdict
    assert "training tokens/s 5.12e+05 (target >= 640000)" in note and "p50 ms 0.9 (target <= 0.6)" in note
    assert gpu_stage.verdict(tmp_path, "pipeline", 0, "180", log, run) == ("ok", "kept: train, report")
