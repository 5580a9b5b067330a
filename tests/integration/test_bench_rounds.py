"""Interleaved rounds with real child processes: every variant loaded once in its own process and kept loaded, then
measured in turn (A B C ... A B C ...), one at a time; each latency the median over rounds with its interval (#60);
the variants that cannot win raced out after the first round (#67).

    python -m pytest tests/integration/test_bench_rounds.py -q
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def test_rounds_are_interleaved_one_variant_at_a_time_in_processes_loaded_once_and_the_slow_raced_out(tmp_path):
    from conftest import bench_variant

    from qserve.bench.config import BenchConfig
    from qserve.bench.runner import run_bench

    ref = bench_variant(tmp_path, max_eval_samples=16)
    dirs = [ref]
    for name in ("copy-a", "copy-b", "copy-c", "copy-d"):
        shutil.copytree(ref, tmp_path / "variants" / name)
        dirs.append(tmp_path / "variants" / name)
    cfg = BenchConfig(
        batch_sizes=[1],
        seq_lens=[16],
        threads=1,
        out=tmp_path / "report",
        time_budget_s=0.15,
        warmup=1,
        min_iters=3,
        max_iters=30,
        rounds=3,
        race=1.0,  # only the fastest on the screen round, the three fastest candidates and the reference go on
        stability_budget_s=0,
        real_text_samples=4,
        invariance_samples=0,
        floor=False,
        force=True,
    )
    report = run_bench(dirs, cfg)
    log = report["rounds"]["log"]
    names = [d.name for d in dirs]  # the reference first, then the copies (same size: by index)
    raced = [Path(v["dir"]).name for v in report["variants"] if v.get("raced_out")]
    on = [n for n in names if n not in raced]
    by_name = {v["name"]: Path(v["dir"]).name for v in report["variants"]}
    assert 1 <= len(raced) <= 2 and "torch-fp32" in on and by_name[report["race"]["best"]] in on
    # the screen round over every variant, then the contenders alone, in the same order
    assert [e["variant"] for e in log] == names + on * 2 and [e["round"] for e in log] == [0] * 5 + [1] * len(on) + [
        2
    ] * len(on)
    # one measuring at a time: each round starts after the previous one ended
    assert all(a["t1"] <= b["t0"] for a, b in zip(log, log[1:]))
    # each variant in a process of its own, the same one in every round (loaded once)
    pids = {n: {e["pid"] for e in log if e["variant"] == n} for n in names}
    assert all(len(p) == 1 for p in pids.values()) and len(set().union(*pids.values())) == 5
    verdicts = {r["variant"]: r["verdict"] for r in report["recommended"]["ranking"]}
    for v in report["variants"]:
        out = Path(v["dir"]).name in raced
        assert v["status"] == "ok" and (v["accuracy"] is None if out else v["accuracy"]["n"] == 16)
        for rec in [*v["fixed"], *v["real_text"]]:
            assert rec["rounds"] == len(rec["round_p50"]) == (1 if out else 3)
            lo, hi = rec["p50_ci"]
            assert lo <= rec["p50"] <= hi and rec["count"] >= (1 if out else 3)
        if out:  # slower than the fastest candidate on the screen round, measured there only, never ranked
            assert v["raced_out"]["of_best"] > 1.0 and not v.get("invariance") and verdicts[v["name"]] == "raced out"
    rec = report["recommended"]
    assert by_name[rec["variant"]] in on and by_name[rec["runner_up"]] in on
    # paired over the rounds both are ranked by: all three, unless noise split a variant's rounds in two modes
    rows = {r["variant"]: r for r in rec["ranking"]}
    shared = set(rows[rec["variant"]]["round_p50"]) & set(rows[rec["runner_up"]]["round_p50"])
    assert rec["ratio"]["rounds"] == len(shared) and (rec["ratio"]["paired"] or len(shared) < 3)
    md = (tmp_path / "report" / "report.md").read_text()
    assert "interleaved rounds" in md and rec["ratio_text"] in md
    data = json.loads((tmp_path / "report" / "report.json").read_text())
    assert data["recommended"]["ratio_text"] == rec["ratio_text"]
    assert "p50_ci_lo_ms" in (tmp_path / "report" / "report.csv").read_text().splitlines()[0]
    assert rec["ratio_text"] in (tmp_path / "report" / "report.html").read_text()
