"""End to end on the tiny fixture: one real bench run with a good, a tampered and a crashing variant.

    python -m pytest tests/e2e/test_bench_e2e.py -q

One run (four child processes: the floor and three variants, tiny shapes, tiny
budgets) feeds every test here; no timing is asserted, only that each measurement
exists, is well-formed and that failures stay isolated.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from qserve import QserveError
from qserve.bench.config import BenchConfig
from qserve.bench.measure import FAULT_ENV

STAT_KEYS = {"count", "mean", "p50", "p90", "p95", "p99", "stdev", "min", "max"}


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    from conftest import bench_variant

    from qserve.bench.runner import run_bench

    root = tmp_path_factory.mktemp("bench")
    good = bench_variant(root, max_eval_samples=16)
    tampered = root / "tampered"
    shutil.copytree(good, tampered)
    weights = tampered / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-8:] = bytes(8)  # same size, different bytes: only the sha256 check can catch it
    weights.write_bytes(bytes(data))
    crashy = root / "crashy"
    shutil.copytree(good, crashy)

    cfg = BenchConfig(
        batch_sizes=[1, 2],
        seq_lens=[8, 16],
        threads=1,
        out=root / "report",
        time_budget_s=0.05,
        warmup=1,
        min_iters=3,
        max_iters=20,
        real_text_samples=4,
        floor_budget_s=0.02,
        invariance_samples=12,
    )
    old = os.environ.get(FAULT_ENV)
    os.environ[FAULT_ENV] = "crashy:abort"  # the child of `crashy` calls os.abort() after loading
    try:
        report = run_bench([good, tampered, crashy], cfg)
    finally:
        if old is None:
            os.environ.pop(FAULT_ENV, None)
        else:
            os.environ[FAULT_ENV] = old
    return report, root / "report", cfg


def test_writes_exactly_the_report_files(bench_run):
    _, out, _ = bench_run
    assert sorted(p.name for p in out.iterdir()) == [
        "accuracy_vs_size.png",
        "decision.png",
        "latency_vs_batch.png",
        "report.csv",
        "report.html",
        "report.json",
        "report.md",
    ]
    assert json.loads((out / "report.json").read_text())["format"] == "qserve-bench/1"


def test_report_schema_for_the_good_variant(bench_run):
    report, _, cfg = bench_run
    assert {
        "format",
        "created",
        "run",
        "config",
        "environment",
        "headline",
        "model",
        "floor",
        "variants",
        "agreement_reference",
        "speedup_reference",
    } <= set(report)
    env = report["environment"]
    assert env["threads"] == 1 and env["cpu"]["model"] and "torch" in env["versions"]
    assert env["child"]["torch_threads"] == 1  # the thread count reached the child
    v = report["variants"][0]
    assert v["name"] == "torch-fp32" and v["status"] == "ok"
    assert v["disk_bytes"] > 0 and v["load_s"] > 0 and v["memory"]["peak_rss_mb"] > 0
    assert v["memory"]["peak_rss_mb"] >= v["memory"]["rss_after_load_mb"] > 0
    shapes = {(r["batch"], r["seq"]) for r in v["fixed"]}
    assert shapes == {(1, 8), (1, 16), (2, 8), (2, 16)}
    for r in v["fixed"]:
        assert STAT_KEYS <= set(r) and r["count"] >= cfg.min_iters and r["throughput"] > 0
        assert r["min"] <= r["p50"] <= r["p90"] <= r["p95"] <= r["p99"] <= r["max"]
    assert [r["batch"] for r in v["real_text"]] == [1, 2]
    assert all(r["texts"] >= 3 and r["mean_padded_len"] > 2 for r in v["real_text"])
    acc = v["accuracy"]
    assert acc["n"] == 16 and acc["dataset"] == "imdb-embedded" and 0 <= acc["accuracy"] <= 1
    assert v["agreement"] == 1.0 and v["speedup_vs_torch_fp32"] == 1.0  # it is its own reference
    assert report["floor"]["flops_per_sequence"]["16"]["total"] > 0
    assert report["floor"]["peaks"]["fp32"]["gflops"] > 0
    assert v["floor"]["peak"] == "fp32" and v["floor"]["p50_over_floor"] > 0
    assert "predictions" not in json.dumps(report)


def test_crashes_are_isolated(bench_run):
    report, out, _ = bench_run
    by_dir = {Path(v["dir"]).name: v for v in report["variants"]}
    tampered, crashy = by_dir["tampered"], by_dir["crashy"]
    assert tampered["status"] == "failed" and tampered["stage"] == "load"
    assert "sha256" in tampered["error"]
    assert crashy["status"] == "failed" and crashy["returncode"] < 0
    assert "SIGABRT" in crashy["failure"]
    assert by_dir["torch-fp32"]["status"] == "ok"  # the good one still produced results
    md = (out / "report.md").read_text()
    assert "## Failures" in md and "SIGABRT" in md and "does not match its sha256" in md


def test_rerender_gives_the_same_md(bench_run):
    """The real run's report.json, read back by `qserve report`'s loader, renders the same md. What `qserve report`
    adds (writing the files and re-drawing the plots, seconds of matplotlib) runs as the real CLI in
    tests/unit/test_bench_report.py and tests/e2e/test_browser.py."""
    from qserve.bench.report import render_md
    from qserve.benchreport import load_report

    _, out, _ = bench_run
    report, _ = load_report(out)
    assert render_md(report) == (out / "report.md").read_text()


def test_refuses_to_overwrite_a_report(bench_run):
    from qserve.bench.runner import run_bench

    report, out, cfg = bench_run
    with pytest.raises(QserveError, match="--force"):
        run_bench([Path(report["variants"][0]["dir"])], BenchConfig(out=out, batch_sizes=[1], seq_lens=[8]))


def test_cli_flag_errors_name_the_flag(capsys):
    from qserve.cli import main

    assert main(["bench", "/nonexistent-variant", "--batch-sizes", "1,x"]) == 2
    assert "--batch-sizes" in capsys.readouterr().err
    assert main(["bench", "/nonexistent-variant"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_batch_invariance_column(bench_run):
    """Each text scored alone and in mixed batches of 8 and 32 (12 test texts: one batch of 12 at '32')."""
    import csv

    report, out, _ = bench_run
    good = next(v for v in report["variants"] if v["status"] == "ok")
    inv = good["invariance"]
    assert inv["texts"] == 12 and set(inv["by_batch"]) == {"8", "32"} and inv["scored"] == 24
    assert inv["max_abs_dprob"] <= 1e-5 and inv["flips"] == 0 and inv["row_by_row"] is False
    lens = inv["token_lengths"]
    assert lens["min"] < lens["max"]  # varied length: padding really happens in the mixed batches
    md = (out / "report.md").read_text()
    assert (
        "## Batch invariance (one text, one answer)" in md and "batch invariance: max \\|Δprob\\| / label flips" in md
    )
    rows = list(csv.DictReader((out / "report.csv").open()))
    assert {r["invariance_flips"] for r in rows if r["variant"] == good["name"]} == {"0"}
