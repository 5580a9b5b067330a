"""qserve.train and qserve.study on a tiny DistilBERT and a tiny local CSV (seconds each).

    python -m pytest tests/test_train.py -q
"""

from __future__ import annotations

import csv
import json
import logging
import random
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from qserve import QserveError
from qserve.train import FILES_WRITTEN, TrainConfig, config_from_args, field_docs, train

POS = ["great", "wonderful", "superb", "loved", "brilliant"]
NEG = ["awful", "boring", "terrible", "hated", "dull"]
FILLER = ["the", "film", "plot", "actor", "scene", "was", "and", "a", "movie", "story"]


@pytest.fixture(scope="module")
def separable_csv(tmp_path_factory) -> Path:
    """200 short reviews whose label is given by one sentiment word: learnable in a few epochs."""
    rng = random.Random(0)
    path = tmp_path_factory.mktemp("data") / "toy.csv"
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        for i in range(200):
            lab = i % 2
            words = [rng.choice(FILLER) for _ in range(6)] + [rng.choice(POS if lab else NEG)]
            rng.shuffle(words)
            w.writerow([" ".join(words) + f" {i}", "positive" if lab else "negative"])
    return path


def tiny_cfg(checkpoint, dataset, out, **kw) -> TrainConfig:
    base = dict(model=str(checkpoint), dataset=str(dataset), out=str(out), max_length=32, batch_size=16,
                lr=5e-3, epochs=4, precision="32-true", device="cpu")
    return TrainConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def trained(tiny_checkpoint, separable_csv, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "tiny-32"
    metrics = train(tiny_cfg(tiny_checkpoint, separable_csv, out))
    return out, metrics


def test_training_writes_exactly_these_files(trained):
    out, _ = trained
    assert sorted(p.name for p in out.iterdir()) == sorted(FILES_WRITTEN)
    assert [p.name for p in out.parent.iterdir()] == [out.name]  # no staging leftovers beside it


def test_training_learns_and_records_metrics(trained, separable_csv):
    out, metrics = trained
    saved = json.loads((out / "train_metrics.json").read_text())
    assert saved["test_accuracy"] == metrics["test_accuracy"] >= 0.9
    assert saved["val_accuracy"] >= 0.9 and len(saved["val_accuracy_per_epoch"]) == 4
    assert saved["precision"] == "32-true" and saved["device"] == "cpu" and saved["world_size"] == 1
    assert saved["sizes"] == {"train": 160, "val": 20, "test": 20}
    assert saved["optimizer_steps"] == 4 * 10 and saved["step_time_median_s"] > 0 and saved["samples_per_s"] > 0
    assert saved["peak_memory_bytes"] > 50e6 and "RSS" in saved["peak_memory_kind"]
    assert saved["config"]["lr"] == 5e-3 and "torch" in saved["versions"] and "lightning" in saved["versions"]
    meta = json.loads((out / "qserve_model.json").read_text())
    assert meta == {"model_name": f"{Path(saved['base_model']).name}-toy", "base_model": saved["base_model"],
                    "dataset": str(separable_csv.resolve()), "seed": 42, "max_length": 32,
                    "max_eval_samples": 2000, "labels": ["negative", "positive"]}


def test_checkpoint_reproduces_test_accuracy_from_its_metadata(trained):
    """What bench does: rebuild the test split from qserve_model.json and score the saved weights."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from qserve.data import load_dataset

    out, metrics = trained
    meta = json.loads((out / "qserve_model.json").read_text())
    data = load_dataset(meta["dataset"], seed=meta["seed"], max_eval_samples=meta["max_eval_samples"])
    model = AutoModelForSequenceClassification.from_pretrained(out).eval()
    tok = AutoTokenizer.from_pretrained(out)
    assert model.config.id2label == {0: "negative", 1: "positive"}
    enc = tok(data.test.texts, truncation=True, max_length=meta["max_length"], padding=True, return_tensors="pt")
    assert set(enc) == {"input_ids", "attention_mask"}
    with torch.no_grad():
        pred = model(**enc).logits.argmax(-1).tolist()
    acc = sum(p == y for p, y in zip(pred, data.test.labels)) / len(pred)
    assert acc == pytest.approx(metrics["test_accuracy"])


def test_bf16_true_saves_fp32_weights(tiny_checkpoint, separable_csv, tmp_path):
    from safetensors import safe_open

    out = tmp_path / "bf16"
    m = train(tiny_cfg(tiny_checkpoint, separable_csv, out, precision="bf16-true", epochs=1, max_eval_samples=8))
    assert m["precision"] == "bf16-true" and m["sizes"]["test"] == 8
    with safe_open(out / "model.safetensors", "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"F32"}
    assert json.loads((out / "config.json").read_text())["dtype"] == "float32"


def test_existing_out_needs_force(trained, tiny_checkpoint, separable_csv, tmp_path):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("user data")
    with pytest.raises(QserveError, match="already exists; pass --force"):
        train(tiny_cfg(tiny_checkpoint, separable_csv, out, epochs=1))
    assert (out / "keep.txt").read_text() == "user data"
    train(tiny_cfg(tiny_checkpoint, separable_csv, out, epochs=1, max_eval_samples=4, force=True))
    assert sorted(p.name for p in out.iterdir()) == sorted(FILES_WRITTEN)


@pytest.mark.parametrize("kw, match", [
    ({"precision": "fp16"}, r"--precision must be one of 32-true, 16-mixed, bf16-mixed, bf16-true \(got 'fp16'\)"),
    ({"precision": "16-mixed"}, r"16-mixed is not supported on CPU.*bf16-mixed or 32-true"),
    ({"matmul_precision": "low"}, r"--matmul-precision must be one of highest, high, medium"),
    ({"epochs": 0}, r"--epochs must be an integer >= 1"),
    ({"batch_size": -1}, r"--batch-size must be an integer >= 1"),
    ({"lr": 0.0}, r"--lr must be > 0"),
    ({"warmup_ratio": 1.0}, r"--warmup-ratio must be in \[0, 1\)"),
    ({"device": "tpu"}, r"--device must be one of auto, cpu, cuda"),
    ({"max_length": 4096}, r"--max-length 4096 exceeds the model's 128 positions"),
])
def test_bad_settings_are_refused_before_writing(tiny_checkpoint, separable_csv, tmp_path, kw, match):
    out = tmp_path / "never"
    with pytest.raises(QserveError, match=match):
        train(tiny_cfg(tiny_checkpoint, separable_csv, out, **{"epochs": 1, **kw}))
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_bad_dataset_file_is_refused(tiny_checkpoint, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("text,sentiment\ngood,1\n")
    with pytest.raises(QserveError, match=r"bad\.csv, line 1: missing column\(s\) label"):
        train(tiny_cfg(tiny_checkpoint, bad, tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_bf16_on_cpu_without_native_support_warns(monkeypatch, caplog):
    from qserve import devices
    from qserve.train import check_precision

    monkeypatch.setattr(devices, "cpu_supports_bf16", lambda: False)
    with caplog.at_level(logging.WARNING, logger="qserve.train"):
        check_precision("bf16-mixed", "cpu")
    assert "emulated and slow" in caplog.text
    caplog.clear()
    check_precision("32-true", "cpu")
    assert caplog.text == ""


# -- CLI -----------------------------------------------------------------------------------

def parse(argv):
    import argparse

    from qserve.train import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["train", *argv])


def test_every_config_field_has_help_and_a_flag():
    docs = field_docs(TrainConfig)
    assert set(docs) == {f.name for f in fields(TrainConfig)}
    args = parse([])
    assert config_from_args(args) == TrainConfig()


def test_cli_flags_map_to_config():
    args = parse(["--model", "m", "--dataset", "d.csv", "--precision", "bf16-true", "--epochs", "3",
                  "--batch-size", "8", "--lr", "2e-5", "--grad-accum", "2", "--max-length", "256",
                  "--max-samples", "0", "--max-eval-samples", "500", "--seed", "1", "--out", "o", "--device", "cpu",
                  "--devices", "2", "--strategy", "ddp", "--matmul-precision", "high", "--force"])
    cfg = config_from_args(args)
    assert cfg == TrainConfig(model="m", dataset="d.csv", precision="bf16-true", epochs=3, batch_size=8, lr=2e-5,
                              grad_accum=2, max_length=256, max_samples=None, max_eval_samples=500, seed=1,
                              out="o", device="cpu", devices=2, strategy="ddp", matmul_precision="high",
                              force=True)


def test_cli_rejects_bad_precision_and_repeats_without_compare(capsys):
    with pytest.raises(SystemExit):
        parse(["--precision", "fp8"])
    assert "invalid choice: 'fp8'" in capsys.readouterr().err
    with pytest.raises(QserveError, match="--precision was given 2 times.*--compare"):
        config_from_args(parse(["--precision", "32-true", "--precision", "bf16-mixed"]))


def test_child_argv_round_trips_the_config():
    from qserve.study import child_argv

    cfg = TrainConfig(model="m", dataset="x.csv", epochs=2, lr=3e-5, max_samples=None, max_eval_samples=None,
                      matmul_precision="medium", force=True)
    argv = child_argv(cfg, "bf16-true", Path("/tmp/o"))
    assert argv[1:3] == ["-m", "qserve.train"]
    back = config_from_args(parse(argv[3:]))
    assert back == TrainConfig(**{**cfg.__dict__, "precision": "bf16-true", "out": "/tmp/o", "force": False})


def test_import_stays_light():
    code = ("import sys, qserve.train, qserve.study, qserve.data, qserve.modeling; "
            "heavy = [m for m in ('torch', 'transformers', 'lightning') if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# -- precision study --------------------------------------------------------------------

def test_study_refuses_16_mixed_on_cpu(tmp_path):
    from qserve.study import compare

    with pytest.raises(QserveError, match="16-mixed is not supported on cpu"):
        compare(TrainConfig(device="cpu"), ["16-mixed"], tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_study_runs_each_precision_in_a_child(tiny_checkpoint, separable_csv, tmp_path):
    from qserve.study import compare

    cfg = tiny_cfg(tiny_checkpoint, separable_csv, None, epochs=1, max_eval_samples=8)
    study = compare(cfg, ["32-true", "bf16-mixed"], tmp_path / "report")
    assert sorted(p.name for p in (tmp_path / "report").iterdir()) == ["precision_study.json",
                                                                       "precision_study.md"]
    runs = {r["precision"]: r for r in study["runs"]}
    assert set(runs) == {"32-true", "bf16-mixed"} and all(r["ok"] for r in runs.values())
    assert runs["32-true"]["step_time_vs_32_true"] == 1.0
    assert study["bf16_mixed_over_32_true_step_time"] == runs["bf16-mixed"]["step_time_vs_32_true"] > 0
    assert runs["bf16-mixed"]["peak_memory_bytes"] > 0 and runs["bf16-mixed"]["sizes"]["test"] == 8
    md = (tmp_path / "report" / "precision_study.md").read_text()
    assert "| bf16-mixed |" in md and "not measured by qserve" in md and "| bf16-true | 5.22 | 2.87 | 92.69% |" in md
    assert json.loads((tmp_path / "report" / "precision_study.json").read_text())["reference"]["runs"]
    with pytest.raises(QserveError, match="already exists"):
        compare(cfg, ["32-true"], tmp_path / "report")


def test_ddp_on_two_cpu_processes_counts_every_eval_example_once(tiny_checkpoint, separable_csv, tmp_path):
    """Fabric DDP (gloo) with 2 ranks: rank 0 alone writes; sharded eval with an odd count is exact."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from qserve.data import load_dataset

    out = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "qserve.train", "--model", str(tiny_checkpoint), "--dataset", str(separable_csv),
           "--max-length", "32", "--batch-size", "8", "--lr", "5e-3", "--epochs", "2", "--precision", "32-true",
           "--device", "cpu", "--devices", "2", "--strategy", "ddp", "--max-eval-samples", "7", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("trained ") == 1  # only rank 0 reports
    assert sorted(p.name for p in out.iterdir()) == sorted(FILES_WRITTEN)
    m = json.loads((out / "train_metrics.json").read_text())
    assert m["world_size"] == 2 and m["optimizer_steps"] == 2 * 10  # 160 examples / 2 ranks / batch 8
    data = load_dataset(str(separable_csv), max_eval_samples=7)
    model = AutoModelForSequenceClassification.from_pretrained(out).eval()
    enc = AutoTokenizer.from_pretrained(out)(data.test.texts, truncation=True, max_length=32, padding=True,
                                             return_tensors="pt")
    with torch.no_grad():
        pred = model(**enc).logits.argmax(-1).tolist()
    assert m["test_accuracy"] == pytest.approx(sum(p == y for p, y in zip(pred, data.test.labels)) / 7)
