"""`qserve bench --long-text`: accuracy, agreement and texts/s per policy, and the two policies named."""

from __future__ import annotations

import json

import pytest

from qserve.bench.policies import choose


def _hits(n: int, right: int) -> list[int]:
    return [1] * right + [0] * (n - right)


def test_choose_keeps_the_variants_own_policy_unless_another_is_separated_from_it():
    n = 1000
    recs = [
        {"asked": "head", "policy": "head", "accuracy": 0.826, "texts_per_s": 100.0, "hits": _hits(n, 826)},
        {"asked": "tail", "policy": "tail", "accuracy": 0.830, "texts_per_s": 99.0, "hits": _hits(n, 830)},
        {"asked": "head-tail", "policy": "head-tail:64", "accuracy": 0.828, "texts_per_s": 98.0},
        {"asked": "windows", "policy": "windows:128:96:mean", "accuracy": 0.878, "texts_per_s": 33.0},
    ]
    recs[2]["hits"] = _hits(n, 828)
    recs[3]["hits"] = _hits(n, 878)
    # tail is 0.4 points more accurate than the own head-tail:64 on the same texts: a tie, so the own is kept
    picked = choose(recs, "head-tail:64")
    assert picked["fast"]["policy"] == "head-tail:64" and picked["changed"] is False and picked["own"] == "head-tail:64"
    tie = picked["against_own"]["tail"]
    assert tie["lo"] <= 0 <= tie["hi"] and tie["n"] == n
    assert picked["best"]["policy"] == "windows:128:96:mean"  # the most accurate, but below half head's speed
    # windows at half head's speed is separated from the own (+5 points, the interval above 0): it is chosen
    recs[3]["texts_per_s"] = 50.0
    picked = choose(recs, "head-tail:64")
    assert picked["fast"]["policy"] == "windows:128:96:mean" and picked["changed"] is True
    assert picked["against_own"]["windows:128:96:mean"]["lo"] > 0
    # without per-text hits (or on other texts) nothing can be separated: the own policy stays
    bare = [{k: v for k, v in r.items() if k != "hits"} for r in recs]
    assert choose(bare, "head-tail:64")["fast"]["policy"] == "head-tail:64"
    assert choose(bare)["fast"]["policy"] == "head"  # the own unknown: head, the baseline
    assert choose([r for r in recs if r["asked"] != "head"]) is None  # no baseline, no speed rule


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    from conftest import bench_variant

    from qserve.bench.config import BenchConfig
    from qserve.bench.runner import run_bench

    root = tmp_path_factory.mktemp("bench-lt")
    variant = bench_variant(root, max_eval_samples=24)
    cfg = BenchConfig(
        batch_sizes=[1],
        seq_lens=[16],
        threads=1,
        out=root / "report",
        time_budget_s=0.05,
        warmup=1,
        min_iters=2,
        max_iters=5,
        real_text_samples=0,
        invariance_samples=0,
        floor=False,
        long_text=["head-tail", "windows"],
    )
    return run_bench([variant], cfg), root


def test_bench_reports_each_policy_on_real_test_texts(bench_run):
    report, root = bench_run
    v = report["variants"][0]
    assert v["status"] == "ok" and v["long_text"] == "head"
    recs = {r["policy"]: r for r in v["long_text_policies"]}
    assert list(recs) == ["head", "head-tail:32", "windows:64:48:mean"]  # head always, as the baseline
    for r in recs.values():
        assert r["n"] == 24 and 0 <= r["accuracy"] <= 1 and r["texts_per_s"] > 0 and r["agreement"] == 1.0
        assert "predictions" not in r
    assert recs["head"]["accuracy"] == v["accuracy"]["accuracy"]  # the same run under the variant's own policy
    assert recs["windows:64:48:mean"]["mean_windows"] > 1 and recs["head"]["mean_windows"] == 1
    assert recs["head"]["truncated"] > recs["windows:64:48:mean"]["truncated"]  # most reviews exceed 64 tokens
    assert all(len(r["hits"]) == 24 for r in recs.values())  # per text: what the paired comparison reads
    lt = report["long_text"]
    assert lt["variant"] == "torch-fp32" and lt["fast"]["policy"] in recs and lt["best"]["policy"] in recs
    assert lt["own"] == "head" and set(lt["against_own"]) == set(recs) - {"head"}
    md = (root / "report" / "report.md").read_text()
    assert "## Long texts: policies compared" in md and f"Long-text policy chosen: {lt['fast']['policy']}" in md


def test_serving_a_model_dir_picks_the_reports_fast_policy(bench_run):
    import shutil

    from qserve.rundir import RunDir, served

    report, root = bench_run
    shutil.copytree(root / "report", root / "model" / "report")
    shutil.copytree(root / "variants", root / "model" / "variants")
    data = json.loads((root / "model" / "report" / "report.json").read_text())
    data["recommended"] = {"variant": "torch-fp32", "dir": str(root / "variants" / "torch-fp32"), "why": "test"}
    (root / "model" / "report" / "report.json").write_text(json.dumps(data))
    selection = served(RunDir(root / "model"))
    assert selection.dir == str(root / "model" / "variants" / "torch-fp32")
    assert str(selection.long_text) == report["long_text"]["fast"]["policy"]
