"""Report assembly and rendering from synthetic child results (no child processes here).

python -m pytest tests/unit/test_bench_report.py -q
"""

from __future__ import annotations

import csv
import io
import json
import re

import pytest

from qserve import QserveError
from qserve.bench import analysis
from qserve.bench.config import BenchConfig
from qserve.bench.report import render_csv, render_md, write_reports
from qserve.bench.stats import summarize
from qserve.benchreport import load_report, summary_rows


def _fixed(p50s: dict[tuple[int, int], float]) -> list[dict]:
    out = []
    for (b, s), p in p50s.items():
        rec = {"batch": b, "seq": s, **summarize([p * 0.9, p, p, p * 1.5])}
        rec["throughput"] = b / (rec["mean"] / 1e3)
        out.append(rec)
    return out


def _meta(name: str, dtype: str, backend: str) -> analysis.VariantMeta:
    from qserve.artifact import Manifest, ModelMeta
    from qserve.variants import spec_of

    spec = spec_of({"name": name, "backend": backend, "bits": 32, "dtype": dtype})
    manifest = Manifest(
        spec=spec, labels=("negative", "positive"), max_length=64, model_name="m", parity={"agreement": 1.0}
    )
    return analysis.VariantMeta(
        f"/v/{name}", manifest, ModelMeta(dataset="default"), None, disk_bytes=1_000_000 * (4 if dtype == "fp32" else 1)
    )


def _ok(name: str, p50: float, preds: list[int]) -> dict:
    return {
        "status": "ok",
        "name": name,
        "load_s": 0.5,
        "import_s": 1.0,
        "wall_s": 3.0,
        "device": "cpu",
        "peak_rss_mb": 500.0,
        "model_rss_mb": 50.0,
        "fixed": _fixed({(1, 128): p50, (8, 128): p50 * 4}),
        "real_text": [
            {"batch": 1, **summarize([p50, p50 * 1.2]), "texts": 2, "throughput": 10.0, "mean_padded_len": 100.0}
        ],
        "accuracy": {
            "dataset": "imdb-embedded",
            "seed": 42,
            "n": 4,
            "accuracy": sum(preds) / 4,
            "predictions": preds,
            "seconds": 0.1,
        },
    }


def synthetic_report() -> dict:
    cfg = BenchConfig(batch_sizes=[1, 8], seq_lens=[128], threads=2).validate()
    metas = [_meta("torch-fp32", "fp32", "torch"), _meta("onnx-int8", "int8", "onnx"), _meta("broken", "fp32", "torch")]
    raws = [
        _ok("torch-fp32", 40.0, [1, 1, 0, 0]),
        _ok("onnx-int8", 10.0, [1, 0, 0, 0]),
        {
            "status": "failed",
            "error": "VariantError: tampered",
            "failure": "child exited with code 1",
            "stage": "load",
            "returncode": 1,
            "log_tail": "...",
        },
    ]
    cfg_dims = {"dim": 768, "n_layers": 6, "hidden_dim": 3072, "n_heads": 12}
    from qserve.bench.floor import flops_per_sequence

    report = {
        "format": "qserve-bench/1",
        "created": "2020-01-01T00:00:00+00:00",
        "run": {"name": "synthetic", "out": "x"},
        "config": cfg.to_json(),
        "environment": {
            "cpu": {"model": "Test CPU", "cores": 2, "flags": ["avx2"]},
            "threads": 2,
            "device": "cpu",
            "versions": {"torch": "0"},
            "python": "3",
            "platform": "linux",
            "gpu": None,
        },
        "headline": {"batch": 1, "seq": 128},
        "model": {"name": "m"},
        "floor": {
            "flops_per_sequence": {"128": flops_per_sequence(cfg_dims, 128)},
            "threads": 2,
            "peaks": {
                "fp32": {"gflops": 100.0, "method": "torch.matmul", "shape": [1024, 1024, 1024]},
                "int8": {"gflops": 400.0, "method": "onnxruntime MatMulInteger", "shape": [128, 768, 3072]},
            },
            "model_peaks": {
                "int8": {"gflops": 200.0, "method": "onnxruntime MatMulInteger", "shape": [128, 768, 3072]}
            },
        },
        "variants": [analysis.variant_entry(m, r) for m, r in zip(metas, raws)],
    }
    return analysis.finish(report)


def test_agreement_speedup_and_floor_are_computed():
    r = synthetic_report()
    v = {x["name"]: x for x in r["variants"]}
    assert r["agreement_reference"] == "torch-fp32" and r["speedup_reference"] == "torch-fp32"
    assert v["torch-fp32"]["agreement"] == 1.0
    assert v["onnx-int8"]["agreement"] == 0.75  # 3 of 4 predictions match fp32
    assert v["onnx-int8"]["speedup_vs_torch_fp32"] == pytest.approx(4.0)
    fl = v["onnx-int8"]["floor"]
    assert fl["peak"] == "int8" and fl["floor_ms"] == pytest.approx(11_174_808_576 / 400e9 * 1e3)
    assert fl["p50_over_floor"] == pytest.approx(10.0 / fl["floor_ms"])
    assert fl["model_floor_ms"] == pytest.approx(2 * fl["floor_ms"])
    assert v["torch-fp32"]["floor"]["peak"] == "fp32" and "model_floor_ms" not in v["torch-fp32"]["floor"]
    assert all("_predictions" not in x for x in r["variants"])  # predictions never reach report.json
    assert v["broken"]["status"] == "failed" and v["broken"]["stage"] == "load"
    assert v["broken"]["speedup_vs_torch_fp32"] is None


def test_agreement_needs_the_same_test_texts():
    metas = [_meta("torch-fp32", "fp32", "torch"), _meta("onnx-int8", "int8", "onnx")]
    a, b = _ok("torch-fp32", 40.0, [1, 1, 0, 0]), _ok("onnx-int8", 10.0, [1, 1, 0, 0])
    b["accuracy"]["seed"] = 7  # another split: agreement would compare different texts
    rep = {
        "headline": {"batch": 1, "seq": 128},
        "floor": {},
        "variants": [analysis.variant_entry(m, x) for m, x in zip(metas, [a, b])],
    }
    analysis.finish(rep)
    assert rep["variants"][0]["agreement"] == 1.0 and rep["variants"][1]["agreement"] is None


def test_md_opens_with_the_verdict_and_one_summary_table_then_the_details():
    md = render_md(synthetic_report())
    lines = md.splitlines()
    assert lines[2] == (
        "**Serve torch-fp32:** the only variant that qualified; it is the reference (no gate needed)."
    )  # right under the title: what to serve, against what, and its gate verdict
    head, align, *body = lines[4:9]
    assert head == (
        "| variant | b1 on real texts, p50 (ms) | b8/s128 (seq/s) | peak RSS (MiB) | size (MB) "
        "| agreement vs torch-fp32 | its lower bound | verdict |"
    )
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in body]
    assert [(c[0], c[-1]) for c in cells] == [
        ("torch-fp32", "recommended"),
        ("onnx-int8", "below bar"),
        ("broken", "not a candidate"),
    ]
    # one number per cell: no interval, mode or note beside a figure
    assert all(re.fullmatch(r"–|[\d,]+(\.\d+)?%?", x) for c in cells for x in c[1:-1]), cells
    assert cells[1][1:7] == ["11.00", cells[1][2], "500", "1.0", "75.00%", cells[1][6]] and lines[9] == ""
    assert "- **below bar** (agreement 75.00% < 99%): onnx-int8." in md
    assert "- **not a candidate** (its bench failed: child exited with code 1): broken." in md
    # the proof after the first screen: rounds, every other column, the floor, the failures, the machine
    details = md[md.index("## Details") :]
    for col in ("load (s)", "accuracy", "texts scored", "speed-up vs torch-fp32 b1/s128", "p50/floor"):
        assert col in details, col
    assert "11.175 GFLOP" in details  # the distilbert-base-dims count at S=128
    assert "4.00×" in details  # onnx-int8's speed-up
    assert "## Failures" in details and "VariantError: tampered" in details
    assert "Test CPU" in md and "threads: 2" in details


def test_checks_section_says_pass_fail_context_or_not_measured():
    r = synthetic_report()
    r["checks"] = [
        {"name": "speed-up", "value": 3.5, "unit": "×", "target": ">= 3.0×", "passed": True},
        {"name": "floor ratio", "value": 1.9, "unit": "×", "target": "<= 1.5×", "passed": False},
        {"name": "context ratio", "value": 1.8, "unit": "×", "target": "(context)", "passed": None},
        {"name": "missing ratio", "value": None, "unit": "×", "target": "<= 1.5×", "passed": None},
    ]
    md = render_md(r)
    assert "| speed-up | 3.50× | >= 3.0× | **pass** |" in md
    assert "| floor ratio | 1.90× | <= 1.5× | **FAIL** |" in md
    assert "| context ratio | 1.80× | (context) | – |" in md
    assert "| missing ratio | – | <= 1.5× | not measured |" in md


def test_csv_rows_and_summary():
    r = synthetic_report()
    rows = list(csv.DictReader(io.StringIO(render_csv(r))))
    kinds = [(x["variant"], x["kind"], x["batch"]) for x in rows]
    assert ("torch-fp32", "fixed", "1") in kinds and ("onnx-int8", "real_text", "1") in kinds
    assert ("broken", "failed", "") in kinds
    s = {x.variant: x for x in summary_rows(r)}
    assert s["onnx-int8"].throughput == pytest.approx(r["variants"][1]["fixed"][1]["throughput"])


def test_write_and_rerender_from_json(tmp_path):
    from qserve.cli import main

    r = synthetic_report()
    written = write_reports(r, tmp_path / "rep")
    names = sorted(p.name for p in written)
    assert names == [
        "accuracy_vs_size.png",
        "decision.png",
        "latency_vs_batch.png",
        "report.csv",
        "report.html",
        "report.json",
        "report.md",
    ]
    md = (tmp_path / "rep" / "report.md").read_text()
    csv_text = (tmp_path / "rep" / "report.csv").read_text()
    (tmp_path / "rep" / "report.md").unlink()
    (tmp_path / "rep" / "report.csv").unlink()
    assert main(["report", str(tmp_path / "rep")]) == 0
    assert (tmp_path / "rep" / "report.md").read_text() == md
    assert (tmp_path / "rep" / "report.csv").read_text() == csv_text
    assert main(["report", str(tmp_path / "rep" / "report.json"), "--out", str(tmp_path / "other")]) == 0
    assert (tmp_path / "other" / "report.md").read_text() == md
    assert json.loads((tmp_path / "other" / "report.json").read_text()) == json.loads(
        (tmp_path / "rep" / "report.json").read_text()
    )


def test_load_report_rejects_other_files(tmp_path):
    with pytest.raises(QserveError, match="does not exist"):
        load_report(tmp_path)
    (tmp_path / "report.json").write_text('{"format": "something-else"}')
    with pytest.raises(QserveError, match="not a qserve bench report"):
        load_report(tmp_path)


def _gated_report(int8_preds: list[int]) -> dict:
    metas = [
        _meta("torch-fp32", "fp32", "torch"),
        _meta("onnx-int8", "int8", "onnx"),
        _meta("onnx-fp32", "fp32", "onnx"),
    ]
    raws = [
        _ok("torch-fp32", 40.0, [1, 1, 0, 0]),
        _ok("onnx-int8", 10.0, int8_preds),
        _ok("onnx-fp32", 20.0, [1, 1, 0, 0]),
    ]
    rep = {
        "headline": {"batch": 1, "seq": 128},
        "floor": {},
        "environment": {"cpu": {"model": "Test CPU"}},
        "variants": [analysis.variant_entry(m, x) for m, x in zip(metas, raws)],
    }
    return analysis.finish(rep)


def _verdict(passed: bool) -> dict:
    return {
        "passed": passed,
        "agreement": {"value": 1.0, "lo": 0.99 if passed else 0.9, "hi": 1.0},
        "bar": {"agreement_lower_bound": 0.98},
        "data": {"n": 1000},
        "reasons": [] if passed else ["too few"],
    }


def test_the_pipeline_gates_the_candidates_faster_than_the_reference_fastest_first():
    from qserve.bench.recommend import recommend
    from qserve.pipeline import _gate_candidates

    rep = _gated_report([1, 1, 0, 0])  # onnx-int8 (10 ms) and onnx-fp32 (20 ms) both agree 100%
    assert _gate_candidates(rep)[0] == ["/v/onnx-int8", "/v/onnx-fp32"]
    rep = _gated_report([1, 0, 0, 0])  # onnx-int8 below its bar: not a candidate
    assert _gate_candidates(rep)[0] == ["/v/onnx-fp32"]
    for v in rep["variants"]:  # nothing faster than the reference meets its bar: none, and the reason why
        if v["name"] == "onnx-fp32":
            v["agreement"] = 0.5
    rep["recommended"] = recommend(rep)
    assert _gate_candidates(rep) == ([], "no variant faster than the reference meets its agreement bar")


def test_a_gate_re_chooses_the_recommendation_and_the_md_shows_it():
    rep = _gated_report([1, 1, 0, 0])
    assert rep["recommended"]["variant"] == "onnx-int8"  # point estimates only
    analysis.apply_gates(rep, {"/v/onnx-int8": _verdict(False), "/v/onnx-fp32": _verdict(True)})
    assert rep["recommended"]["variant"] == "onnx-fp32" and "release gate passed" in rep["recommended"]["why"]
    analysis.apply_gates(rep, {"/v/onnx-fp32": _verdict(False)})
    assert rep["recommended"]["variant"] == "torch-fp32"  # no gated variant passed: the reference itself
    rep["gate"] = {
        "dir": "gate",
        "max_candidates": 3,
        "data": {"n": 1000, "dataset": "imdb-embedded", "fingerprint": "ab" * 32},
        "rows": [{"variant": "onnx-int8", "verdict": "FAIL"}],
        "not_gated": ["onnx-fp32"],
    }
    rep.update(
        {
            "config": BenchConfig(batch_sizes=[1], seq_lens=[128]).validate().to_json(),
            "created": "x",
            "run": {"name": "r"},
        }
    )
    rep["environment"].update({"threads": 2, "device": "cpu", "versions": {}, "python": "3", "platform": "linux"})
    md = render_md(rep)
    assert (
        "## Release gate" in md
        and "| onnx-int8 | FAIL |" in md
        and "Not gated (two faster candidates passed first)" in md
    )


def _gate_result(name: str, passed: bool) -> dict:
    lo = 0.99 if passed else 0.9
    return {
        "variant": name,
        "dir": f"/v/{name}",
        "gate": {
            "passed": passed,
            "reasons": [] if passed else [f"lower bound {lo:.2%} < 98%"],
            "agreement": {"value": 1.0, "lo": lo, "hi": 1.0, "of": 4},
            "accuracy": {"delta": {"value": 0.0, "lo": -0.01, "hi": 0.01}},
            "bar": {"agreement_lower_bound": 0.98},
            "data": {"n": 4, "dataset": "imdb-embedded", "fingerprint": "ab" * 32},
        },
    }


def test_a_gate_that_changes_the_pick_redraws_every_chart_from_the_final_verdict(tmp_path, monkeypatch):
    """The pipeline's gate stage renders every file again from the verdict it leaves: each chart on disk is the
    chart drawn from the final report.json, byte for byte, and the md, html and csv name the same variant."""
    from types import SimpleNamespace

    from qserve import pipeline
    from qserve.bench.plots import CHARTS, decision_figure, write_plots

    rep = _gated_report([1, 1, 0, 0])
    rep.update(
        config=BenchConfig(batch_sizes=[1, 8], seq_lens=[128], threads=2).validate().to_json(),
        created="x",
        run={"name": "r"},
        format="qserve-bench/1",
    )
    rep["environment"].update({"threads": 2, "device": "cpu", "versions": {}, "python": "3", "platform": "linux"})
    write_reports(rep, tmp_path)
    assert rep["recommended"]["variant"] == "onnx-int8"  # on point estimates, before the gate
    before = {n: (tmp_path / n).read_bytes() for n in CHARTS}

    def gate(dirs, cfg, until_pass, plan):
        assert [d.name for d in dirs] == ["onnx-int8", "onnx-fp32"] and until_pass == 2  # one more after a pass
        return [_gate_result("onnx-int8", False), _gate_result("onnx-fp32", True)]

    monkeypatch.setattr(pipeline, "run_gate", gate)
    monkeypatch.setattr(pipeline, "write_report", lambda results, out, force: None)
    args = SimpleNamespace(bench_eval_samples=4, threads=1)
    pipeline._gate_stage(tmp_path, args, SimpleNamespace(device="cpu"), force=True)
    final, _ = load_report(tmp_path)
    assert final["recommended"]["variant"] == "onnx-fp32" and final["recommended"]["runner_up"] == "torch-fp32"
    (tmp_path / "fresh").mkdir()
    fresh = write_plots(final, tmp_path / "fresh")
    assert sorted(p.name for p in fresh) == sorted(CHARTS)
    for p in fresh:
        assert (tmp_path / p.name).read_bytes() == p.read_bytes(), f"{p.name} is not the final verdict's chart"
    assert before["decision.png"] != (tmp_path / "decision.png").read_bytes()
    fig = decision_figure(final)
    assert fig.get_suptitle().endswith("recommended: onnx-fp32")
    assert (tmp_path / "report.md").read_text().splitlines()[2].startswith("**Serve onnx-fp32:**")
    assert 'id="recommended"><strong>Serve onnx-fp32:</strong>' in (tmp_path / "report.html").read_text()
    verdicts = {r["variant"]: r["verdict"] for r in csv.DictReader(io.StringIO((tmp_path / "report.csv").read_text()))}
    assert verdicts == {"torch-fp32": "passed", "onnx-int8": "failed gate", "onnx-fp32": "recommended"}
