"""The bench in minutes: policies compared only where they decide something, a cheap honest accuracy pass,
resume after a kill, stage times, and pictures of what is ranked (issue 30).

    python -m pytest tests/integration/test_bench_fast.py -q
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path

import pytest

from qserve.bench.measure import FAULT_ENV

REPORTS = Path(__file__).resolve().parents[2] / "benchmarks" / "reports"


@pytest.fixture(scope="module")
def fast_run(tmp_path_factory):
    """Three variants of one tiny checkpoint (the reference and two copies), policies compared, a store; the
    first run's third variant crashes (a kill mid-bench), the second run resumes."""
    from conftest import bench_variant

    from qserve.bench.config import BenchConfig
    from qserve.bench.runner import run_bench

    root = tmp_path_factory.mktemp("bench-fast")
    ref = bench_variant(root, max_eval_samples=24)
    dirs = [ref]
    for name in ("copy-a", "copy-b"):
        shutil.copytree(ref, root / "variants" / name)
        dirs.append(root / "variants" / name)

    def cfg(out: str):
        return BenchConfig(
            batch_sizes=[1],
            seq_lens=[16],
            threads=1,
            out=root / out,
            time_budget_s=0.05,
            warmup=1,
            min_iters=2,
            max_iters=5,
            # no extra rounds for numbers that disagree between rounds (at these budgets they always do): nothing
            # here reads rounds; test_bench_e2e.py runs them with real children and test_bench_rounds.py checks them
            stability_budget_s=0,
            real_text_samples=4,
            invariance_samples=0,
            floor=False,
            long_text=["windows"],
            force=True,
        )

    store = root / "report" / "measured"
    os.environ[FAULT_ENV] = "copy-b:abort"
    try:
        first = run_bench(dirs, cfg("report"), store=store, reuse=True)
    finally:
        os.environ.pop(FAULT_ENV, None)
    stamps = {p.name: p.stat().st_mtime_ns for p in store.glob("*.json")}
    second = run_bench(dirs, cfg("report"), store=store, reuse=True)
    return first, second, stamps, store


def test_policies_compared_only_on_the_reference_and_the_recommended(fast_run):
    _, report, _, _ = fast_run
    rec, ref = report["recommended"]["variant"], report["agreement_reference"]
    assert rec and ref == "torch-fp32"
    compared = {v["name"] for v in report["variants"] if v.get("long_text_policies")}
    assert compared == {rec, ref}
    assert report["long_text"]["variant"] == rec  # the served policy is chosen on the recommended variant
    first, _, _, store = fast_run
    passes = {p.name.rsplit("-", 1)[0] for p in store.glob("*.policies.json")}
    # the reference compares policies in its own variant child; only a recommended variant gets a policy pass
    # (each run's: the resumed run may recommend another copy, timings decide between identical ones)
    recs = {Path(r["recommended"]["dir"]).name for r in (first, report)}
    assert "torch-fp32" not in passes and passes <= recs
    assert rec == ref or Path(report["recommended"]["dir"]).name in passes
    for v in report["variants"]:
        assert v["status"] == "ok" and v["accuracy"]["policy"] == "head"  # each scored once, under its own policy
        assert v["accuracy"]["n"] == 24 and not v.get("raced_out")  # three contenders: each scores every text


def test_a_killed_bench_resumes_measuring_only_what_is_missing(fast_run):
    first, second, stamps, store = fast_run
    assert [v["status"] for v in first["variants"]] == ["ok", "ok", "failed"]
    after = {p.name: p.stat().st_mtime_ns for p in store.glob("*.json")}
    kept = [n for n in stamps if n.endswith(".variant.json")]
    assert len(kept) == 2 and all(after[n] == stamps[n] for n in kept)  # reused, not re-measured
    assert any(n.startswith("copy-b-") and n.endswith(".variant.json") for n in after)  # now measured
    timing = {
        "wall_s",
        "load_s",
        "import_s",
        "fixed",
        "real_text",
        "memory",
        "device",
        "speedup_vs_torch_fp32",
        "floor",
        "stage_s",
        "real_text_check",
    }
    for a, b in zip(first["variants"][:2], second["variants"][:2]):
        if a["name"] not in (first["recommended"]["variant"], second["recommended"]["variant"]):
            assert {k: v for k, v in a.items() if k not in timing} == {k: v for k, v in b.items() if k not in timing}
        assert a["accuracy"] == b["accuracy"] and a["agreement"] == b["agreement"]


def _full_report() -> dict:
    """A full comparison in miniature: every variant with policy records (the old bench's shape)."""

    def hits(acc: float) -> list[int]:  # nested: every text one policy gets right, the more accurate gets too
        return [1] * round(acc * 1000) + [0] * (1000 - round(acc * 1000))

    def pol(acc_tail: float, speed: float) -> list[dict]:
        return [
            {"asked": "head", "policy": "head", "accuracy": 0.82, "texts_per_s": speed, "n": 1000, "hits": hits(0.82)},
            {
                "asked": "tail",
                "policy": "tail",
                "accuracy": acc_tail,
                "texts_per_s": speed * 0.97,
                "n": 1000,
                "hits": hits(acc_tail),
            },
            {
                "asked": "windows",
                "policy": "windows:128:96:mean",
                "accuracy": 0.87,
                "texts_per_s": speed / 3.2,
                "n": 1000,
                "hits": hits(0.87),
            },
        ]

    def var(name: str, bits: int, agr: float, real: float, tail: float) -> dict:
        return {
            "name": name,
            "dir": f"/r/{name}",
            "status": "ok",
            "spec": {"name": name, "bits": bits},
            "agreement": agr,
            "fixed": [{"batch": 1, "seq": 128, "p50": real * 0.9}],
            "real_text": [{"batch": 1, "p50": real}],
            "long_text_policies": pol(tail, 1000 / real),
        }

    return {
        "headline": {"batch": 1, "seq": 128},
        "agreement_reference": "torch-fp32",
        "variants": [
            var("torch-fp32", 32, 1.0, 24.0, 0.86),
            var("onnx-int8", 8, 0.995, 14.5, 0.80),
            var("ov-int8", 8, 0.993, 9.7, 0.84),
            var("onnx-int4", 4, 0.95, 8.0, 0.90),
            var("bnb-int8", 8, 0.999, 33.0, 0.95),
        ],
    }


def test_the_choice_is_the_full_comparisons(tmp_path):
    """recommend() reads no policy record and policies.finish reads the recommended variant's: dropping every
    other variant's records (what the fast bench never measures) changes neither choice (docs/bench.md)."""
    from qserve.bench import policies
    from qserve.bench.recommend import recommend

    full = _full_report()
    full["recommended"] = recommend(full)
    policies.finish(full)
    fast = copy.deepcopy(full)
    keep = {fast["recommended"]["variant"], fast["agreement_reference"]}
    for v in fast["variants"]:
        if v["name"] not in keep:
            v["long_text_policies"] = None
    fast.pop("long_text")
    fast["recommended"] = recommend(fast)
    policies.finish(fast)
    assert full["recommended"]["variant"] == fast["recommended"]["variant"] == "ov-int8"
    assert full["long_text"] == fast["long_text"] and fast["long_text"]["fast"]["policy"] == "tail"


def test_stage_times_land_in_report_json_and_md(tmp_path):
    from qserve.bench.stages import line, record_stages

    out = tmp_path / "report"
    shutil.copytree(REPORTS / "long-text", out)
    times = {"train": 384.2, "export": 84.0, "bench": 231.0, "total": 700.1}
    assert record_stages(out, times)
    data = json.loads((out / "report.json").read_text())
    assert data["pipeline"]["stage_s"] == {"train": 384.2, "export": 84.0, "bench": 231.0, "total": 700.1}
    md = (out / "report.md").read_text()
    assert "## Pipeline stages" in md and "| bench | 231 | 3.9 |" in md and "| total | 700 | 11.7 |" in md
    assert "Pipeline stages" in (out / "report.html").read_text()
    before = (out / "report.json").read_bytes()
    assert not record_stages(out, {**times, "bench": 1.0})  # a reused report keeps the times that measured it
    assert (out / "report.json").read_bytes() == before
    assert line(times) == "stage times: train 384s, export 84s, bench 231s, total 11.7 min"


def _ranked_by_real_text() -> dict:
    """The committed 12-variant report, its recommendation recomputed by today's rule (real-text b1)."""
    from qserve.bench.recommend import recommend

    report = json.loads((REPORTS / "embedded-default" / "report.json").read_text())
    report["recommended"] = recommend(report)
    assert report["recommended"]["shape"].startswith("b1 on real test texts")
    return report


def test_decision_chart_plots_what_the_recommendation_ranks_by():
    from qserve.bench.plots import decision_figure, decision_points

    report = _ranked_by_real_text()
    ranked = {r["variant"]: r["real_b1_p50_ms"] for r in report["recommended"]["ranking"]}
    pts = decision_points(report)
    assert pts and all(p["p50"] == ranked[p["name"]] for p in pts)
    fig = decision_figure(report)
    left = fig.axes[0]
    assert "b1 on real texts" in left.get_xlabel() and "ranks by" in left.get_title()
    xs = sorted(x for coll in left.collections for x, _ in coll.get_offsets())
    assert min(ranked.values()) in xs  # the fastest ranked point sits where the ranking puts it


def test_page_shows_the_ranked_latency_and_every_candidate(tmp_path):
    from qserve.serve.protocols.page import report_summary

    report = _ranked_by_real_text()
    (tmp_path / "report").mkdir()
    (tmp_path / "report" / "report.json").write_text(json.dumps(report))
    served = "torch-fp32"
    summary = report_summary(tmp_path / "variants" / served)
    rec = report["recommended"]
    assert summary.shape == rec["shape"] and summary.recommended == rec["variant"]
    names = [r.variant for r in summary.rows]
    candidates = [r["variant"] for r in rec["ranking"] if r["meets_bar"]]
    assert names[:2] == [served, rec["variant"]] and set(names) == {served, *candidates}
    by = {r["variant"]: r for r in rec["ranking"]}
    for row in summary.rows:
        assert row.p50_ms == by[row.variant]["real_b1_p50_ms"]  # the figure ranked, not b1/s128
        assert row.fixed_p50_ms == by[row.variant]["fixed_p50_ms"] and row.meets_bar == by[row.variant]["meets_bar"]


def test_policy_agreement_on_the_texts_both_scored():
    """The reference compares policies on its first texts when it is not the recommended variant:
    the recommended variant's agreement per policy is on those, and says so."""
    from qserve.bench.policies import add_agreement, md_lines

    ref = {
        "name": "torch-fp32",
        "status": "ok",
        "accuracy": {"n": 4},
        "long_text_policies": [{"policy": "tail", "n": 2, "accuracy": 0.5, "predictions": [1, 0]}],
    }
    rec = {
        "name": "ov-int8",
        "status": "ok",
        "accuracy": {"n": 4},
        "long_text_policies": [{"policy": "tail", "n": 4, "accuracy": 0.75, "predictions": [1, 1, 0, 0]}],
    }
    add_agreement([ref, rec], ref)
    r = rec["long_text_policies"][0]
    assert r["agreement"] == 0.5 and r["agreement_n"] == 2 and "predictions" not in r
    assert "agreement_n" not in ref["long_text_policies"][0]
    md = "\n".join(md_lines({"variants": [ref, rec], "agreement_reference": "torch-fp32"}))
    assert "| torch-fp32 | tail | 50.00% (2 texts) | 100.00% (2 texts) |" in md
    assert "| ov-int8 | tail | 75.00% | 50.00% (2 texts) |" in md


def test_each_child_says_where_its_time_went_and_checks_its_real_text_path(fast_run):
    from qserve.bench.realtext import CHECK_BOUND, CHECK_PAIRS

    _, report, _, store = fast_run
    md = (store.parent / "report.md").read_text()
    for v in report["variants"]:
        st = v["stage_s"]
        assert {"import", "load", "fixed", "real_text", "accuracy"} <= set(st) and "done" not in st
        assert all(x >= 0 for x in st.values()) and sum(st.values()) <= v["wall_s"]
        c = v["real_text_check"]
        assert c["pairs"] == CHECK_PAIRS and c["seq"] == 16 and c["bound"] == CHECK_BOUND
        assert c["ratio"] == pytest.approx(c["real_p50"] / (c["fixed_p50"] + c["tokenize_p50"]))
        assert c["within"] == (c["ratio"] <= CHECK_BOUND)
        assert f"| {v['name']} | {v['real_text_check']['real_p50']:.2f} |" in md
    ref = next(v for v in report["variants"] if v["name"] == report["agreement_reference"])
    assert "long_text" in ref["stage_s"]  # the reference compared the policies in this child
    assert "Where the bench's time went" in md and "real / (fixed + tokenize)" in md
