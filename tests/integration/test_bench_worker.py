"""The shared bench worker (`qserve bench --isolation`): CUDA variants are measured one after another in one process,
through the same run_job as a child of their own; a crash fails its variant only and the next gets a fresh worker.
Proven here on the CPU with `--isolation shared` (on a GPU, `auto` sends the CUDA variants there).

    python -m pytest tests/integration/test_bench_worker.py -q
"""

from __future__ import annotations

import os
import shutil

import pytest

from qserve.bench.measure import FAULT_ENV

ROW = ("name", "status", "device", "accuracy", "agreement")


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    """A tiny torch-fp32 variant (the reference) and two copies of it."""
    from conftest import bench_variant

    root = tmp_path_factory.mktemp("bench-worker")
    ref = bench_variant(root, max_eval_samples=16)
    dirs = [ref]
    for name in ("copy-a", "copy-b"):
        shutil.copytree(ref, root / "variants" / name)
        dirs.append(root / "variants" / name)
    return root, dirs


def _bench(root, dirs, out: str, isolation: str, fault: str | None = None):
    from qserve.bench.config import BenchConfig
    from qserve.bench.runner import run_bench

    cfg = BenchConfig(
        batch_sizes=[1],
        seq_lens=[16],
        threads=1,
        out=root / out,
        time_budget_s=0.05,
        warmup=1,
        min_iters=2,
        max_iters=5,
        real_text_samples=4,
        invariance_samples=8,
        floor=False,
        isolation=isolation,
        force=True,
    )
    if fault:
        os.environ[FAULT_ENV] = fault
    try:
        return run_bench(dirs, cfg)
    finally:
        os.environ.pop(FAULT_ENV, None)


def test_the_shared_worker_measures_what_separate_children_measure(three):
    root, dirs = three
    alone = _bench(root, dirs, "alone", "process")
    together = _bench(root, dirs, "together", "shared")

    def rows(report):  # what the variant is and how it answered; timings apart
        return [
            {
                k: ({a: b for a, b in v[k].items() if a != "seconds"} if isinstance(v.get(k), dict) else v.get(k))
                for k in ROW
            }
            | {"invariance": (v.get("invariance") or {}).get("max_abs_dprob")}
            for v in report["variants"]
        ]

    assert rows(together) == rows(alone) and {v["status"] for v in together["variants"]} == {"ok"}
    assert all("isolation" not in v for v in alone["variants"])
    assert [v["isolation"] for v in together["variants"]] == ["shared"] * 3
    # one process for all three: each later variant's imports were already paid
    first, *later = sorted(together["variants"], key=lambda v: v["stage_s"]["import"], reverse=True)
    assert all(v["import_s"] < first["import_s"] / 4 for v in later)
    md = (root / "together" / "report.md").read_text()
    assert "torch-fp32, torch-fp32 (copy-a), torch-fp32 (copy-b) ran one after another in one worker process" in md
    assert "Each variant ran in its own process" in (root / "alone" / "report.md").read_text()


@pytest.mark.parametrize(
    "mode, failure, stage",
    [("abort", "child died with signal SIGABRT", "unknown"), ("raise", "child exited with code 1", "load")],
)
def test_a_variant_that_crashes_the_worker_fails_alone_and_the_next_gets_a_fresh_one(three, mode, failure, stage):
    root, dirs = three
    report = _bench(root, dirs, f"crash-{mode}", "shared", fault=f"copy-a:{mode}")
    ref, crashed, after = report["variants"]
    assert crashed["status"] == "failed" and crashed["failure"] == failure
    # its own part of the worker's log, as a child of its own would have: a dead process writes no stage
    assert crashed["stage"] == stage and f"injected fault {mode!r} in copy-a" in crashed["log_tail"]
    assert "torch-fp32 b1/s16" not in crashed["log_tail"]
    assert ref["status"] == after["status"] == "ok"
    assert after["agreement"] == 1.0  # measured, in a worker started after the crash
    md = (root / f"crash-{mode}" / "report.md").read_text()
    assert f"- **not a candidate** (its bench failed: {failure}): {crashed['name']}." in md
    assert f"- **{crashed['name']}** (" in md  # and in the failures' section
