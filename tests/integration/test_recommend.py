"""The recommended variant: fastest at the headline shape among those meeting the agreement bar.

python -m pytest tests/integration/test_recommend.py -q
"""

from __future__ import annotations

import json
import shutil

import pytest

from qserve import QserveError
from qserve.bench.recommend import recommend
from qserve.bench.report import verdict_line
from qserve.rundir import VERSUS, RunDir, served


def _report(rows):
    variants = [
        {
            "name": n,
            "dir": f"/x/{n}",
            "status": st,
            "spec": {"name": n, "bits": bits},
            "agreement": agr,
            "fixed": [{"batch": 1, "seq": 128, "p50": p50}],
        }
        for n, bits, p50, agr, st in rows
    ]
    return {
        "format": "qserve-bench/test",
        "headline": {"batch": 1, "seq": 128},
        "agreement_reference": "torch-fp32",
        "environment": {"cpu": {"model": "Test CPU"}},
        "variants": variants,
    }


def test_fastest_variant_meeting_its_bar_wins():
    rep = _report(
        [
            ("torch-fp32", 32, 20.0, 1.0, "ok"),
            ("onnx-int8", 8, 7.0, 0.991, "ok"),
            ("ov-int8", 8, 5.0, 0.985, "ok"),  # faster, but int8 below 99%
            ("onnx-int4", 4, 6.0, 0.975, "ok"),  # 4-bit meets its 97% bar
            ("ov-bf16", 16, 1.0, None, "failed"),
        ]
    )  # failed runs are never recommended
    rec = recommend(rep)
    assert rec["variant"] == "onnx-int4" and rec["bar"] == 0.97 and rec["p50_ms"] == 6.0
    assert rec["cpu"] == "Test CPU" and rec["runner_up"] == "onnx-int8"  # the next candidate, not the reference
    assert [(r["variant"], r["verdict"]) for r in rec["ranking"]] == [
        ("ov-int8", "below bar"),  # faster, but below its bar: the verdict column says so, and why
        ("onnx-int4", "recommended"),
        ("onnx-int8", "passed"),
        ("torch-fp32", "passed"),
    ]
    assert rec["ranking"][0]["verdict_why"] == "agreement 98.50% < 99%"
    rep["recommended"] = rec
    assert verdict_line(rep).startswith("**Serve onnx-int4:** ") and "faster than onnx-int8 at b1/s128" in rec["why"]


def test_speed_only_run_recommends_nothing():
    rec = recommend(_report([("onnx-int8", 8, 7.0, None, "ok")]))
    assert rec["variant"] is None and "speed-only" in rec["why"]


def test_model_dir_resolves_to_the_recommended_variant(tiny_variant, tmp_path):
    model_dir = tmp_path / "run"
    shutil.copytree(tiny_variant, model_dir / "variants" / "torch-fp32")
    with pytest.raises(QserveError, match="report.json is missing"):
        served(RunDir(model_dir))
    rep = _report([("torch-fp32", 32, 20.0, 1.0, "ok"), ("onnx-int8", 8, 7.0, 0.95, "ok")])
    rep["recommended"] = recommend(rep)
    (model_dir / "report").mkdir()
    (model_dir / "report" / "report.json").write_text(json.dumps(rep))
    sel = served(RunDir(model_dir))
    assert sel.dir == str(model_dir / "variants" / "torch-fp32")
    assert sel.variant == "torch-fp32" and sel.measured_on == "Test CPU"
    assert sel.why == "Serve torch-fp32: the only variant that qualified; it is the reference (no gate needed)."
    assert sel.versus is None  # torch-fp32 is the only variant meeting its bar here
    shutil.rmtree(sel.dir)
    with pytest.raises(QserveError, match="recommends torch-fp32, but"):
        served(RunDir(model_dir))


def test_real_texts_at_their_own_length_rank_before_the_headline_shape():
    # ov-int8 wins b1/s128, but on real texts (short, each at its own length) onnx-int8 is faster
    rep = _report(
        [("torch-fp32", 32, 20.0, 1.0, "ok"), ("onnx-int8", 8, 7.0, 0.995, "ok"), ("ov-int8", 8, 5.0, 0.995, "ok")]
    )
    for v, real in zip(rep["variants"], (9.0, 2.0, 3.5)):
        v["real_text"] = [{"batch": 1, "p50": real}, {"batch": 8, "p50": real * 4}]
    rec = recommend(rep)
    assert rec["variant"] == "onnx-int8" and rec["p50_ms"] == 2.0 and rec["shape"].startswith("b1 on real test texts")
    assert "faster than ov-int8 at b1 on real texts" in rec["why"]
    assert [(r["variant"], r["fixed_p50_ms"]) for r in rec["ranking"]] == [
        ("onnx-int8", 7.0),
        ("ov-int8", 5.0),
        ("torch-fp32", 20.0),
    ]
    # one candidate without real-text latency: the whole ranking falls back to the headline shape
    del rep["variants"][2]["real_text"]
    assert recommend(rep)["variant"] == "ov-int8"


def test_model_dir_selection_carries_the_comparison_with_the_runner_up(tiny_variant, tmp_path):
    model_dir = tmp_path / "run"
    shutil.copytree(tiny_variant, model_dir / "variants" / "onnx-int8")
    rep = _report([("torch-fp32", 32, 20.0, 1.0, "ok"), ("onnx-int8", 8, 7.0, 0.995, "ok")])
    rep["recommended"] = recommend(rep)
    (model_dir / "report").mkdir()
    (model_dir / "report" / "report.json").write_text(json.dumps(rep))
    sel = served(RunDir(model_dir))
    versus = sel.versus
    assert sel.variant == "onnx-int8" and versus and versus["runner_up"] == "torch-fp32"
    assert f"{versus['ratio_text']} faster than the reference torch-fp32 (nothing else qualified)" in sel.why
    assert set(versus) <= set(VERSUS)
