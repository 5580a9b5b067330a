"""Pipeline naming, stage reuse, and a pipeline killed in each stage (the full run is in test_e2e_default.py).

python -m pytest tests/e2e/test_pipeline.py -q
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from qserve.training.config import run_dir


def test_run_dir_names():
    # one function names the run dir for `qserve pipeline` and `qserve train`'s default --out (RUN/checkpoint)
    assert run_dir("default", "default") == Path("models/minilm-l6-distilbert-imdb")
    assert run_dir("default", "rotten-tomatoes") == Path("models/minilm-l6-distilbert-rotten-tomatoes")
    assert run_dir("distilbert-base-uncased", "imdb") == Path("models/distilbert-base-uncased-imdb")
    assert run_dir("default", "/data/reviews.csv") == Path("models/minilm-l6-distilbert-reviews")


# -- a killed pipeline picks up where it stopped ---------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
# the toy data and the same-run check of tests/integration/test_resume.py, importable when this file runs alone
sys.path.insert(0, str(ROOT / "tests" / "integration"))
# What a report row says that does not depend on timing or paths: what the variant is and how it answers.
ROW_KEYS = ("name", "status", "spec", "model_name", "parity", "weights_bytes", "accuracy", "agreement")
# One torch thread in every child: the uninterrupted run goes on beside the killed ones, and two processes of one
# thread each share two cores, where two of two threads each spin in their barriers for a thread the other keeps
# off its core. One count in every child also sums the gradients in one order (the same weights).
CHILD_ENV = {"PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


def _tiny_pipeline(run: Path, ckpt: Path, data: Path) -> list[str]:
    return [
        "pipeline",
        "--run-dir",
        str(run),
        "--model",
        str(ckpt),
        "--dataset",
        str(data),
        "--precision",
        "32-true",
        "--max-samples",
        "160",
        "--max-length",
        "32",
        "--epochs",
        "2",
        "--batch-size",
        "16",
        "--lr",
        "5e-3",
        "--checkpoint-every",
        "5",
        "--variants",
        "torch-fp32,torch-bf16",
        "--batch-sizes",
        "1",
        "--seq-lens",
        "32",
        "--time-budget",
        "0.05",
        "--bench-eval-samples",
        "20",
        "--bench-long-text",
        "",
        "--threads",
        "1",
        "--device",
        "cpu",
    ]


def _run_in_process(argv: list[str]) -> None:
    from qserve.cli import build_parser
    from qserve.pipeline import run_pipeline

    run_pipeline(build_parser().parse_args(argv))


def _rows(run: Path) -> list[dict]:
    """The report's per-variant rows, timings and paths left out."""
    rows = json.loads((run / "report" / "report.json").read_text())["variants"]

    def untimed(v):
        # parity's max |Δlogit| of a bf16 export moves in its 7th digit between two processes (oneDNN's bf16
        # kernels are not bit-stable across runs on this CPU); 4 significant digits keep every real change
        if isinstance(v, float):
            return float(f"{v:.4g}")
        return {k: untimed(x) for k, x in v.items() if k != "seconds"} if isinstance(v, dict) else v

    return [{k: untimed(row.get(k)) for k in ROW_KEYS} for row in rows]


def _killed_when(argv: list[str], line: str, then=None, env: dict | None = None) -> str:
    """Run `qserve ...` in a child, SIGKILL it once `line` is printed (and `then()` holds); its stdout so far."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "qserve", *argv],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, **CHILD_ENV, **(env or {})},
    )
    seen = []
    try:
        for text in proc.stdout:
            seen.append(text)
            if line in text:
                # Stopped, then let run in 5 ms slices until `then()` holds: a step too short to finish
                # an export, so the kill lands while its staging dir exists. The deadline only ends a run that
                # never gets there: the bench's slices share the cores with the uninterrupted run.
                proc.send_signal(signal.SIGSTOP)
                deadline = time.monotonic() + 300
                while then is not None and not then() and time.monotonic() < deadline:
                    proc.send_signal(signal.SIGCONT)
                    time.sleep(0.005)
                    proc.send_signal(signal.SIGSTOP)
                    time.sleep(0.01)
                proc.send_signal(signal.SIGKILL)
                break
        proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL, "".join(seen)[-3000:]
    return "".join(seen)


@contextlib.contextmanager
def _beside(argv: list[str], log: Path):
    """`qserve ...` in a child while the block runs, its output in `log`; killed if the block leaves first."""
    with open(log, "w", encoding="utf-8") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "qserve", *argv],
            cwd=ROOT,
            stdout=f,
            stderr=subprocess.STDOUT,
            env={**os.environ, **CHILD_ENV},
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_pipeline_killed_in_each_stage_finishes_with_the_same_report(tiny_checkpoint, tmp_path, capsys):
    """Killed in training, in an export and in the bench (after the reference's measurement was stored), each
    re-run picks up where the last stopped; the last one's report equals an uninterrupted run's. One run of
    kills, not one per stage: each pipeline start costs its child processes' imports."""
    from test_resume import assert_same_run, toy_rows

    from qserve.training.resume import CHECKPOINT, KILL_ENV
    from qserve.verify import verify

    data = toy_rows(tmp_path / "toy.csv")
    ref, run = tmp_path / "uninterrupted", tmp_path / "run"
    argv = _tiny_pipeline(run, tiny_checkpoint, data)
    # The uninterrupted run: in a child like the killed runs (the suite's own process may have changed torch's
    # thread count, and another count sums the same gradients in another order: the weights then differ in the
    # last bits), and beside them, as it shares nothing with them but the inputs (a pipeline is mostly one
    # process at a time importing, loading or waiting on a child, which leaves the other core idle).
    with _beside(_tiny_pipeline(ref, tiny_checkpoint, data), tmp_path / "uninterrupted.log") as uninterrupted:
        # 1. killed in training, right after its first checkpoint (step 5 of 20)
        _killed_when(argv, "never printed", env={KILL_ENV: "after:1"})
        assert (run / "checkpoint" / CHECKPOINT).is_file() and not (run / "variants").exists()
        # 2. re-run: training resumes; killed while the second variant is being exported (its staging dir exists)
        staging = lambda: any((run / "variants").glob(".torch-bf16.tmp-*"))  # noqa: E731
        out = _killed_when(argv, "[2/2] torch-bf16: exporting", then=staging)
        assert "resuming at step 5 of 20" in out and "reusing" not in out
        first = verify(run / "variants" / "torch-fp32").to_json()
        assert staging() and not (run / "variants" / "torch-bf16").exists()
        # 3. re-run: training and the finished variant kept, the cut-short one exported again; killed in the
        # bench once the reference's measurement is stored and before the second variant's is
        store = run / "report" / "measured"
        measured = lambda name: sorted(store.glob(f"{name}-*.variant.json")) if store.is_dir() else []  # noqa: E731
        out = _killed_when(argv, "== [3/5]", then=lambda: bool(measured("torch-fp32")) and not measured("torch-bf16"))
        assert "reusing" in out.split("[1/2] torch-fp32")[0] and "[1/2] torch-fp32: reusing" in out
        assert "[2/2] torch-bf16: exporting" in out and not staging()
        assert measured("torch-fp32") and not measured("torch-bf16") and not (run / "report" / "report.json").exists()
        kept = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in measured("torch-fp32")}
        # 4. re-run: nothing finished is redone (the stored measurement is read back, not redone); the report
        # equals the uninterrupted run's, timings aside
        capsys.readouterr()
        _run_in_process(argv)
        out = capsys.readouterr().out
        assert out.count("reusing") == 3 and "exporting" not in out and "resuming" not in out, out
        assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in measured("torch-fp32")} == kept
        assert measured("torch-bf16")
        assert verify(run / "variants" / "torch-fp32").to_json()["created"] == first["created"]
        rows = json.loads((run / "report" / "report.json").read_text())["variants"]
        assert [(r["name"], r["status"]) for r in rows] == [("torch-fp32", "ok"), ("torch-bf16", "ok")]
        uninterrupted.wait(timeout=600)
    log = (tmp_path / "uninterrupted.log").read_text(encoding="utf-8")
    assert uninterrupted.returncode == 0 and (ref / "report" / "report.json").is_file(), log[-3000:]
    assert _rows(run) == _rows(ref)
    assert_same_run(ref / "checkpoint", run / "checkpoint")  # killed in training, resumed: the same weights
    assert sorted(p.name for p in (run / "variants").iterdir()) == ["torch-bf16", "torch-fp32"]
