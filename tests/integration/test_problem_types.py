"""Multi-label and regression classifiers end to end: data, training, export parity, bench agreement, serving.

    python -m pytest tests/integration/test_problem_types.py -q

Two tiny models are trained by the real `qserve train` on small local files (a multi-label .jsonl, a
regression .csv), exported by the real exporters and served by real uvicorn (/v1, V2 over HTTP and gRPC).
"""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import numpy as np
import pytest
from conftest import serving, train_problem

from qserve import QserveError
from qserve import problemtypes as problems

httpx2 = pytest.importorskip("httpx2")

TOPICS = {
    "sports": ["goal", "match", "team", "coach"],
    "politics": ["vote", "senate", "law", "election"],
    "tech": ["chip", "code", "robot", "app"],
}
TEXTS = ["goal match team coach", "vote senate law", "chip code robot", "a quiet afternoon"]


def write_multi(path: Path, n: int = 80) -> Path:
    rng = random.Random(0)
    rows = []
    for i in range(n):
        labs = sorted(rng.sample(list(TOPICS), rng.choice([1, 1, 2])))
        words = [rng.choice(TOPICS[t]) for t in labs for _ in range(3)] + [f"w{i}"]
        rows.append({"text": " ".join(words), "label": labs})
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return path


def write_regression(path: Path, n: int = 80) -> Path:
    rng = random.Random(1)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        for i in range(n):
            k = rng.randint(0, 5)
            w.writerow([" ".join(["great"] * k + ["film", f"x{i}"]), f"{k / 5 + rng.random() / 100:.3f}"])
    return path


# -- data ---------------------------------------------------------------------------------------


def test_local_files_infer_the_problem_type_and_split_accordingly(tmp_path):
    from qserve.data.datasets import load_dataset

    multi = load_dataset(str(write_multi(tmp_path / "m.jsonl")))
    assert multi.problem_type == problems.MULTI and multi.labels == ["politics", "sports", "tech"]
    assert all(isinstance(lab, tuple) and lab for lab in multi.train.labels)
    assert multi.info["split"] == "seeded stratified 80/10/10 (by label set)"
    reg = load_dataset(str(write_regression(tmp_path / "r.csv")))
    assert reg.problem_type == problems.REGRESSION and reg.labels == ["value"]
    assert all(isinstance(lab, float) for lab in reg.test.labels) and reg.info["split"] == "seeded random 80/10/10"
    assert "class_counts" in reg.info and reg.info["class_counts"]["test"] == {"value": 0}
    # a CSV cell holding a JSON list is multi-label; integer labels are single-label unless told otherwise
    p = tmp_path / "cells.csv"
    p.write_text(
        "text,label\n" + "".join(f'"t{i}","[""a"", ""b""]"\n' if i % 2 else f't{i},["a"]\n' for i in range(30)),
        encoding="utf-8",
    )
    assert load_dataset(str(p)).problem_type == problems.MULTI
    q = tmp_path / "ints.csv"
    q.write_text("text,label\n" + "".join(f"t{i},{i % 3}\n" for i in range(30)), encoding="utf-8")
    assert load_dataset(str(q)).problem_type == problems.SINGLE
    assert load_dataset(str(q), problem_type=problems.REGRESSION).train.labels[0] in (0.0, 1.0, 2.0)


def test_bad_labels_and_flags_are_named(tmp_path):
    from qserve.data.datasets import load_dataset

    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps({"text": "a", "label": ["x", 1]}) + "\n", encoding="utf-8")
    with pytest.raises(QserveError, match=r"line 1: .*mixes integer and string"):
        load_dataset(str(p))
    r = tmp_path / "bad.csv"
    r.write_text("text,label\na,1.5\nb,high\n", encoding="utf-8")
    with pytest.raises(QserveError, match=r"line 3: label 'high' is not a finite number"):
        load_dataset(str(r), problem_type=problems.REGRESSION)
    with pytest.raises(QserveError, match="--problem-type multi needs a local"):
        load_dataset("default", problem_type=problems.MULTI)
    with pytest.raises(QserveError, match="--problem-type must be one of single, multi, regression"):
        problems.from_flag("binary")


def test_scores_and_agreement_per_problem_type():
    logits = np.array([[0.0, 2.0], [-1.0, 1.0]])
    np.testing.assert_allclose(problems.scores(logits, problems.SINGLE).sum(axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(problems.scores(logits, problems.MULTI), 1 / (1 + np.exp(-logits)), rtol=1e-6)
    assert problems.scores(logits, problems.REGRESSION).tolist() == logits.tolist()
    assert problems.agreement([[1, 0], [1, 1]], [[1, 0], [0, 1]], problems.MULTI) == 0.75
    assert problems.agreement([[1.0], [2.0]], [[1.1], [2.1]], problems.REGRESSION, span=10.0) == pytest.approx(0.99)
    assert problems.from_config({"num_labels": 1}) == problems.REGRESSION
    assert problems.from_config({"id2label": {"0": "a", "1": "b"}}) == problems.SINGLE
    m = problems.metrics([[1, 0, 1], [0, 1, 0]], [(0, 2), (0,)], problems.MULTI, 3)
    assert m == {"accuracy": 0.5, "label_accuracy": pytest.approx(4 / 6)}
    assert problems.metrics([[1.0], [3.0]], [2.0, 3.0], problems.REGRESSION, 1) == {
        "mae": 0.5,
        "rmse": pytest.approx(0.5**0.5),
    }


# -- training, export, serving ------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(tiny_checkpoint, regression_checkpoint, tmp_path_factory):
    """{kind: checkpoint} trained by the real CLI from local files on a tiny random DistilBERT (the regression one
    is the suite's shared regression_checkpoint)."""
    root = tmp_path_factory.mktemp("problems")
    multi = train_problem(tiny_checkpoint, write_multi(root / "topics.jsonl"), root / "multi-ck")
    return {"multi": multi, "regression": regression_checkpoint}


@pytest.fixture(scope="module")
def variants(trained, tmp_path_factory):
    import exporters

    root = tmp_path_factory.mktemp("pt-variants")
    return {
        kind: exporters.export(ck, "torch-fp32", root / f"{kind}-torch-fp32") and root / f"{kind}-torch-fp32"
        for kind, ck in trained.items()
    }


def test_training_records_the_problem_type_and_its_metrics(trained):
    multi = json.loads((trained["multi"] / "train_metrics.json").read_text())
    assert multi["problem_type"] == problems.MULTI
    assert 0 <= multi["test_accuracy"] <= multi["test_label_accuracy"] <= 1  # exact match <= per label
    reg = json.loads((trained["regression"] / "train_metrics.json").read_text())
    assert "test_accuracy" not in reg and "val_accuracy" not in reg and reg["test_mae"] <= reg["test_rmse"]
    config = json.loads((trained["regression"] / "config.json").read_text())
    assert config["problem_type"] == "regression" and config["id2label"] == {"0": "value"}
    meta = json.loads((trained["regression"] / "qserve_model.json").read_text())
    assert meta["problem_type"] == "regression" and 0.9 < meta["label_range"] < 1.1
    assert json.loads((trained["multi"] / "config.json").read_text())["problem_type"] == problems.MULTI


def test_multi_label_exports_pass_parity(trained, tmp_path):
    import exporters
    from qserve.runtime import load_runtime

    ref = load_runtime(exporters.export(trained["multi"], "torch-fp32", tmp_path / "t") and tmp_path / "t")
    expected = ref.predict(TEXTS)
    for name in ("onnx-fp32", "onnx-int8", "ov-int8"):
        m = exporters.export(trained["multi"], name, tmp_path / name).to_json()
        assert m["problem_type"] == problems.MULTI and m["parity"]["problem_type"] == problems.MULTI
        assert m["parity"]["within_tolerance"] and m["parity"]["agreement"] == 1.0, (name, m["parity"])
        got = load_runtime(tmp_path / name).predict(TEXTS)
        assert got.shape == (len(TEXTS), 3) and not np.allclose(got.sum(axis=1), 1.0)  # sigmoid, not softmax
        np.testing.assert_allclose(got, expected, atol=0.02)


def test_an_edited_problem_type_is_refused(variants, tmp_path):
    import shutil
    from dataclasses import replace

    from qserve.artifact import VariantError, read_manifest, write_manifest
    from qserve.verify import verify

    copy = tmp_path / "v"
    shutil.copytree(variants["multi"], copy)
    write_manifest(
        copy, replace(read_manifest(copy), problem_type=problems.SINGLE)
    )  # resealed, but config.json disagrees
    with pytest.raises(VariantError, match="problem_type 'single_label_classification' but the hashed config.json"):
        verify(copy)


def test_served_end_to_end_through_v1_and_v2(variants, tiny_variant):
    from qserve.runtime import load_runtime
    from qserve.serve.core.repository import Repository, sources_from_dirs
    from qserve.serve.infra.config import ServeConfig

    ref = {k: load_runtime(v) for k, v in variants.items()}
    repo = Repository(
        sources_from_dirs([f"multi={variants['multi']}", f"reg={variants['regression']}", f"single={tiny_variant}"])
    )
    cfg = ServeConfig(variant_dir=str(variants["multi"]), threads=1, max_wait_ms=2, threshold=0.45, grpc_port=0)
    with serving(cfg, repository=repo) as srv, httpx2.Client(base_url=srv.url, timeout=30, trust_env=False) as c:
        # /v1 multi-label: every label, its sigmoid score and `on` at the server's threshold (or the request's)
        want = ref["multi"].predict(TEXTS)
        body = c.post("/v1/classify", json={"inputs": TEXTS, "model": "multi"}).json()
        assert body["problem_type"] == problems.MULTI and body["threshold"] == 0.45
        for row, preds in zip(want, body["predictions"]):
            assert sorted(p["label"] for p in preds) == ["politics", "sports", "tech"]
            by = {p["label"]: p for p in preds}
            for j, label in enumerate(["politics", "sports", "tech"]):
                assert by[label]["score"] == pytest.approx(float(row[j]), abs=1e-5)
                assert by[label]["on"] is bool(row[j] >= 0.45)
        all_on = c.post("/v1/classify", json={"inputs": TEXTS, "model": "multi", "threshold": 0}).json()
        assert all(p["on"] for preds in all_on["predictions"] for p in preds) and all_on["threshold"] == 0.0
        none_on = c.post("/v1/classify", json={"inputs": TEXTS, "model": "multi", "threshold": 1}).json()
        assert not any(p["on"] for preds in none_on["predictions"] for p in preds)
        for bad in ("0.5", 1.5, -0.1, True):
            r = c.post("/v1/classify", json={"inputs": "x", "model": "multi", "threshold": bad})
            assert r.status_code == 422 and "threshold" in r.json()["error"] and "[0, 1]" in r.json()["error"], bad
        for name, kind in (("single", "single-label"), ("reg", "a regression model")):
            r = c.post("/v1/classify", json={"inputs": "x", "model": name, "threshold": 0.5})
            assert r.status_code == 422 and f"is {kind}" in r.json()["error"] and "multi-label" in r.json()["error"]
        # /v1 regression: the value
        value = ref["regression"].predict(TEXTS)
        body = c.post("/v1/classify", json={"inputs": TEXTS, "model": "reg"}).json()
        assert body["problem_type"] == "regression" and "threshold" not in body
        assert [p[0]["label"] for p in body["predictions"]] == ["value"] * len(TEXTS)
        np.testing.assert_allclose([p[0]["score"] for p in body["predictions"]], value[:, 0], atol=1e-5)
        # single-label answers keep their shape (no `on`)
        single = c.post("/v1/classify", json={"inputs": "fine", "model": "single"}).json()
        assert set(single["predictions"][0][0]) == {"label", "score"}

        # V2 over HTTP: probabilities (sigmoid) for multi-label, value [n, 1] for regression; metadata lists them
        v2 = {"inputs": [{"name": "text", "shape": [len(TEXTS)], "datatype": "BYTES", "data": TEXTS}]}
        out = {o["name"]: o for o in c.post("/v2/models/multi/infer", json=v2).json()["outputs"]}
        assert set(out) == {"probabilities", "truncated"} and out["probabilities"]["shape"] == [len(TEXTS), 3]
        np.testing.assert_allclose(np.reshape(out["probabilities"]["data"], (len(TEXTS), 3)), want, atol=1e-5)
        out = {o["name"]: o for o in c.post("/v2/models/reg/infer", json=v2).json()["outputs"]}
        assert set(out) == {"value", "truncated"} and out["value"]["shape"] == [len(TEXTS), 1]
        np.testing.assert_allclose(out["value"]["data"], value[:, 0], atol=1e-5)
        r = c.post("/v2/models/reg/infer", json={**v2, "outputs": [{"name": "probabilities"}]})
        assert r.status_code == 422 and "has outputs value, truncated" in r.json()["error"]
        meta = c.get("/v2/models/reg").json()
        assert meta["outputs"][0] == {"name": "value", "datatype": "FP32", "shape": [-1, 1]}
        assert meta["parameters"]["problem_type"] == "regression"
        cfg_out = c.get("/v2/models/multi/config").json()["output"]
        assert [o["name"] for o in cfg_out] == ["probabilities", "truncated"] and cfg_out[0]["dims"] == [-1, 3]
        assert {m["id"]: m["problem_type"] for m in c.get("/v1/models").json()["models"]} == {
            "multi": problems.MULTI,
            "reg": problems.REGRESSION,
            "single": problems.SINGLE,
        }

        # V2 over gRPC: the same outputs
        grpcclient = pytest.importorskip("tritonclient.grpc")
        g = grpcclient.InferenceServerClient(f"127.0.0.1:{srv.server.config.app.state.grpc.port}")
        t = grpcclient.InferInput("text", [len(TEXTS)], "BYTES")
        t.set_data_from_numpy(np.array([x.encode() for x in TEXTS], dtype=object))
        res = g.infer("reg", [t])
        np.testing.assert_allclose(res.as_numpy("value"), value, atol=1e-5)
        assert res.as_numpy("probabilities") is None
        np.testing.assert_allclose(g.infer("multi", [t]).as_numpy("probabilities"), want, atol=1e-5)
        assert [o.name for o in g.get_model_metadata("reg").outputs] == ["value", "truncated"]
        from tritonclient.utils import InferenceServerException

        with pytest.raises(InferenceServerException) as e:
            g.infer("multi", [t], outputs=[grpcclient.InferRequestedOutput("label")])
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT" and "has outputs probabilities" in e.value.message()
