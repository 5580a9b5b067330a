"""The release gate end to end: tiny variants gated on the embedded test split, the verdict sealed in the
manifest, served with --require-gate through the real app; a multi-label model trained by `qserve train` gets
per-label thresholds fitted on held-out data.

    python -m pytest tests/integration/test_gate.py -q
"""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import build_tiny_checkpoint, serving

httpx2 = pytest.importorskip("httpx2")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A tiny checkpoint that names the embedded dataset (300 val / 300 test texts), with torch-fp32 (the
    reference) and torch-bf16 (the variant gated) exported beside each other, as `qserve pipeline` lays them out."""
    import exporters

    root = tmp_path_factory.mktemp("gate")
    ckpt = build_tiny_checkpoint(root / "checkpoint")
    (ckpt / "qserve_model.json").write_text(
        json.dumps(
            {
                "model_name": "tiny-distilbert",
                "max_length": 64,
                "dataset": "default",
                "seed": 42,
                "max_eval_samples": 300,
            }
        )
    )
    for name in ("torch-fp32", "torch-bf16"):
        exporters.export(ckpt, name, root / "variants" / name)
    return root


@pytest.fixture(scope="module")
def gated(run_dir) -> tuple[Path, list[dict]]:
    """The bf16 variant gated by the real command (report files written), copied first so the ungated one stays."""
    import shutil

    from qserve.cli import main

    variant = run_dir / "variants" / "gated-bf16"
    shutil.copytree(run_dir / "variants" / "torch-bf16", variant)
    out = run_dir / "gate-report"
    assert (
        main(
            [
                "gate",
                str(variant),
                "--reference",
                str(run_dir / "variants" / "torch-fp32"),
                "--threads",
                "1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert sorted(p.name for p in out.iterdir()) == ["gate.json", "gate.md", "gate.png"]
    return variant, json.loads((out / "gate.json").read_text())["results"]


def test_the_verdict_is_sealed_in_the_manifest(gated):
    from qserve.artifact import MANIFEST, VariantError
    from qserve.verify import verify

    variant, results = gated
    m = verify(variant)  # every file hash still verifies, and the digest covers the new fields
    g = m.gate
    assert g is not None and g["passed"] and g == results[0]["gate"]
    # 100% on the checkpoint's 300 test texts cannot clear 98% at the confidence 4 planned looks share (306 needed):
    # undecided at 300, the next look doubles into the rest of the split and decides it
    seq = g["sequential"]
    assert seq["planned"] == [300, 600, 1200, 2400] and seq["per_look_confidence"] == pytest.approx(0.9875)
    assert [(x["n"], x["decision"]) for x in seq["looks"]] == [(300, "undecided"), (600, "passed")]
    assert g["decision"] == "passed" and g["n"] == 600 == g["agreement"]["of"]
    assert g["data"]["n"] == 600 and g["data"]["split"] == "test" and len(g["data"]["fingerprint"]) == 64
    assert g["agreement"]["lo"] >= g["bar"]["agreement_lower_bound"] == 0.98
    assert set(g["accuracy"]["delta"]) == {"value", "lo", "hi"} and g["machine"]["device"] == "cpu"
    assert m.calibration is not None and m.calibration["fitted_on"]["split"] == "val"
    assert m.temperature is not None and m.temperature > 0 and m.calibration["fitted_on"]["n"] == 300
    assert {"before", "after"} <= set(g["calibration"]["ece"])
    # an edited verdict is refused like any edited field
    raw = json.loads((variant / MANIFEST).read_text())
    raw["gate"]["passed"] = not raw["gate"]["passed"]
    tampered = variant.parent / "tampered"
    import shutil

    shutil.copytree(variant, tampered)
    (tampered / MANIFEST).write_text(json.dumps(raw, indent=2))
    with pytest.raises(VariantError, match="edited after export"):
        verify(tampered)
    shutil.rmtree(tampered)
    md = (variant.parent.parent / "gate-report" / "gate.md").read_text()
    assert "| torch-bf16 | 600 | 100.00% [98.97%, 100.00%] |" in md and "PASSED at n=600" in md


def test_too_few_texts_fail_with_that_reason(run_dir):
    from qserve.gate.config import GateConfig
    from qserve.gate.run import run_gate

    one = GateConfig(max_samples=50, threads=1, record=False, looks=1)  # one look: the fixed-n gate
    results = run_gate([run_dir / "variants" / "torch-bf16"], one)
    g = results[0]["gate"]
    assert not g["passed"] and g["reasons"][0].startswith("too few texts: 50")
    assert "189" in g["reasons"][0] and g["decision"] == "undecided" and g["n"] == 50
    # the sequential gate scores more of the split until it decides: 50, 100, 200 undecided (306 needed), 400 passes
    (seq,) = run_gate([run_dir / "variants" / "torch-bf16"], replace(one, looks=4))
    assert [(x["n"], x["decision"]) for x in seq["gate"]["sequential"]["looks"]] == [
        (50, "undecided"),
        (100, "undecided"),
        (200, "undecided"),
        (400, "passed"),
    ]
    # a time budget the next look would pass stops it undecided, and says so
    (late,) = run_gate([run_dir / "variants" / "torch-bf16"], replace(one, looks=4, time_budget=1e-3))
    assert late["gate"]["decision"] == "undecided" and len(late["gate"]["sequential"]["looks"]) == 1
    assert "the next look (100 texts) would pass the --time-budget" in late["gate"]["reasons"][-1]
    assert json.loads((run_dir / "variants" / "torch-bf16" / "manifest.json").read_text()).get("gate") is None


def test_bad_inputs_are_named(run_dir, tmp_path):
    import exporters
    from qserve.gate.config import GateConfig
    from qserve.gate.run import GateError, run_gate

    variant = run_dir / "variants" / "torch-bf16"
    data = tmp_path / "other.csv"
    data.write_text("text,label\n" + "".join(f"text {i},{'spam' if i % 2 else 'ham'}\n" for i in range(60)))
    with pytest.raises(GateError, match=r"labels are \['ham', 'spam'\].*the model's are \['negative', 'positive'\]"):
        run_gate([variant], GateConfig(data=str(data), record=False))
    other = build_tiny_checkpoint(tmp_path / "other-ckpt", seed=1)
    exporters.export(other, "torch-fp32", tmp_path / "other-fp32")
    with pytest.raises(GateError, match="of the same checkpoint"):
        run_gate([variant], GateConfig(reference=str(tmp_path / "other-fp32"), record=False))
    with pytest.raises(GateError, match="pass --reference DIR"):
        lonely = tmp_path / "alone" / "torch-bf16"
        import shutil

        shutil.copytree(variant, lonely)
        run_gate([lonely], GateConfig(record=False))


def test_require_gate_refuses_an_ungated_variant(run_dir, capsys):
    from qserve.cli import main

    code = main(["serve", str(run_dir / "variants" / "torch-bf16"), "--require-gate", "--port", "0", "--threads", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "--require-gate" in err and "has never been gated" in err and "qserve gate" in err


def test_require_gate_serves_a_gated_variant_and_shows_the_verdict(gated):
    from qserve.serve.infra.config import ServeConfig

    variant, _ = gated
    with serving(ServeConfig(variant_dir=str(variant), require_gate=True, threads=1)) as srv:
        with httpx2.Client(base_url=srv.url, trust_env=False, timeout=30) as c:
            m = c.get("/v1/models").json()["models"][0]
            assert m["gate"]["passed"] is True and m["gate"]["n"] == 600 and m["gate"]["bar"] == 0.98
            a = c.post("/v1/classify", json={"inputs": ["a fine film"]}).json()
            t = m["calibration"]["temperature"]
            assert a["temperature"] == t
            meta = c.get(f"/v2/models/{m['id']}").json()["parameters"]
            assert meta["gate"] == "passed" and meta["temperature"] == str(t)


# -- the long-text policy a verdict holds for ------------------------------------------------------------------


def test_a_policy_switch_the_gate_did_not_verify_is_refused_or_served_as_ungated(gated, capsys):
    from qserve.cli import main
    from qserve.serve.infra.config import ServeConfig

    variant, _ = gated
    assert json.loads((variant / "manifest.json").read_text())["gate"]["long_text"] == "head"  # its own policy
    code = main(["serve", str(variant), "--require-gate", "--long-text", "tail", "--port", "0", "--threads", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "long-text policy tail" in err and "its gate verified head" in err and "--long-text" in err
    with serving(ServeConfig(variant_dir=str(variant), long_text="tail", threads=1)) as srv:
        with httpx2.Client(base_url=srv.url, trust_env=False, timeout=30) as c:
            m = c.get("/v1/models").json()["models"][0]
            assert m["long_text"] == "tail"
            g = m["gate"]
            assert g["verdict"] == "ungated" and g["passed"] is False and g["gated_long_text"] == "head"
            assert "qserve gate VARIANT --long-text tail" in g["why"]
            assert c.get(f"/v2/models/{m['id']}").json()["parameters"]["gate"] == "ungated"


def test_a_run_dir_serves_the_reports_policy_only_once_a_gate_verdict_covers_it(gated, tmp_path):
    """The report of a run dir prefers tail for the recommended variant, whose gate verified head: the server
    serves head (what was gated) and says why; once the variant is gated under tail, it serves tail, passed."""
    import shutil

    from qserve.gate.config import GateConfig
    from qserve.pipeline import _gate_chosen_policy
    from qserve.serve.infra.config import ServeConfig

    run = tmp_path / "run"
    variant = run / "variants" / "gated-bf16"
    shutil.copytree(gated[0], variant)
    (run / "report").mkdir()
    report = {
        "format": "qserve-bench/test",
        "recommended": {"variant": "gated-bf16", "dir": str(variant), "why": "the test's"},
        "long_text": {"variant": "gated-bf16", "fast": {"policy": "tail"}, "own": "head", "why": "tail won"},
    }
    (run / "report" / "report.json").write_text(json.dumps(report))

    def served() -> dict:
        with serving(ServeConfig(variant_dir=str(run), require_gate=True, threads=1)) as srv:
            with httpx2.Client(base_url=srv.url, trust_env=False, timeout=30) as c:
                return c.get("/v1/models").json()["models"][0]

    m = served()
    assert m["selection"]["variant"] == "gated-bf16" and m["long_text"] == "head"
    assert m["gate"]["verdict"] == "passed" and m["gate"]["long_text"] == "head"
    assert "the report chose tail" in m["selection"]["long_text_why"]
    # what `qserve pipeline` does once its study separated tail (qserve gate VARIANT --long-text tail by hand)
    report["long_text"]["changed"] = True
    _gate_chosen_policy(report, GateConfig(reference=str(gated[0].parent / "torch-fp32"), threads=1), None)
    assert report["long_text"]["gate"]["policy"] == "tail" and report["long_text"]["gate"]["verdict"].startswith("PASS")
    (run / "report" / "report.json").write_text(json.dumps(report))
    m = served()
    assert m["long_text"] == "tail" and m["gate"]["verdict"] == "passed" and m["gate"]["gated_long_text"] == "tail"


# -- multi-label: per-label thresholds from held-out data ------------------------------------------------------

TOPICS = {"sports": ["goal", "match", "team"], "politics": ["vote", "senate", "law"], "tech": ["chip", "code", "robot"]}


def test_multi_label_thresholds_are_fitted_on_held_out_data_and_served(tmp_path):
    import exporters
    from qserve.cli import main
    from qserve.gate.config import GateConfig
    from qserve.gate.run import run_gate

    rng = random.Random(0)
    rows = []
    for i in range(300):
        labs = sorted(rng.sample(list(TOPICS), rng.choice([1, 1, 2])))
        words = [rng.choice(TOPICS[t]) for t in labs for _ in range(2)] + [f"w{i}", rng.choice(["film", "day"])]
        rows.append({"text": " ".join(words), "label": labs})
    data = tmp_path / "topics.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    base = build_tiny_checkpoint(tmp_path / "base")
    ck = tmp_path / "multi-ck"
    assert (
        main(
            [
                "train",
                "--model",
                str(base),
                "--dataset",
                str(data),
                "--out",
                str(ck),
                "--precision",
                "32-true",
                "--max-length",
                "32",
                "--batch-size",
                "16",
                "--lr",
                "1e-3",
                "--epochs",
                "1",
            ]
        )
        == 0
    )
    for name in ("torch-fp32", "torch-bf16"):
        exporters.export(ck, name, tmp_path / "variants" / name)
    variant = tmp_path / "variants" / "torch-bf16"
    g = run_gate([variant], GateConfig(threads=1))[0]
    cal = g["calibration"]
    assert cal["fitted_on"]["split"] == "val" and g["gate"]["data"]["split"] == "test"
    assert len(cal["thresholds"]) == 3 and all(0 <= t <= 1 for t in cal["thresholds"])
    f1 = g["gate"]["calibration"]["macro_f1"]
    assert set(f1) == {"at_0.5", "at_thresholds"}  # both reported on the test split the fit never saw
    assert [p["label"] for p in g["gate"]["per_class"]] == ["politics", "sports", "tech"]
    # served: the thresholds apply unless the request sends its own
    from qserve.serve.infra.config import ServeConfig

    with serving(ServeConfig(variant_dir=str(variant), threads=1)) as srv:
        with httpx2.Client(base_url=srv.url, trust_env=False, timeout=30) as c:
            a = c.post("/v1/classify", json={"inputs": ["goal vote chip"]}).json()
            assert a["thresholds"] == dict(zip(["politics", "sports", "tech"], cal["thresholds"]))
            assert "threshold" not in a
            for p in a["predictions"][0]:
                assert p["on"] == (p["score"] >= a["thresholds"][p["label"]])
            own = c.post("/v1/classify", json={"inputs": ["goal vote chip"], "threshold": 0.5}).json()
            assert own["threshold"] == 0.5 and "thresholds" not in own


def test_the_pipelines_gate_scores_the_bench_texts_and_stops_at_the_first_pass(run_dir):
    """--max-eval-samples rebuilds the splits as `qserve bench --max-eval-samples N` does (the same test texts);
    until_pass stops at the first variant that passes, as the pipeline gates its candidates fastest first."""
    from qserve.data.datasets import load_dataset
    from qserve.gate.config import GateConfig
    from qserve.gate.run import fingerprint, pool_of, run_gate

    bf16 = run_dir / "variants" / "torch-bf16"
    cfg = GateConfig(max_eval_samples=200, max_calibration_samples=100, threads=1, record=False)
    results = run_gate([bf16, bf16], cfg, until_pass=True)
    assert len(results) == 1 and results[0]["gate"]["passed"]
    bench_test = load_dataset("default", seed=42, max_eval_samples=200).test  # what the bench scores
    # the first look is the bench's 200 texts; the next (undecided at 200) adds 200 of the rest of the test split
    assert results[0]["gate"]["sequential"]["looks"][0]["n"] == 200 == len(bench_test)
    pool = pool_of(bench_test, load_dataset("default", seed=42).test)
    assert results[0]["gate"]["data"]["n"] == 400
    assert results[0]["gate"]["data"]["fingerprint"] == fingerprint(pool.take(list(range(400))))
    assert results[0]["calibration"]["fitted_on"]["n"] == 100
    assert len(run_gate([bf16, bf16], cfg)) == 2  # without until_pass, every variant
