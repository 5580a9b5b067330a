"""qserve.training.train and qserve.training.study's runs on a tiny DistilBERT and a tiny local CSV (seconds each);
the precisions, flags and the study's plan are in tests/unit/test_train_precision.py.

    python -m pytest tests/integration/test_train.py -q
"""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import pytest

from qserve import QserveError
from qserve.training.config import FILES_WRITTEN, TrainConfig
from qserve.training.study import SEED
from qserve.training.train import train

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
    base = dict(
        model=str(checkpoint),
        dataset=str(dataset),
        out=str(out),
        max_length=32,
        batch_size=16,
        lr=5e-3,
        epochs=4,
        precision="32-true",
        device="cpu",
    )
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
    assert saved["config"]["lr"] == 5e-3 and "torch" in saved["versions"] and "lightning-fabric" in saved["versions"]
    meta = json.loads((out / "qserve_model.json").read_text())
    assert meta == {
        "model_name": f"{Path(saved['base_model']).name}-toy",
        "base_model": saved["base_model"],
        "dataset": str(separable_csv.resolve()),
        "seed": 42,
        "max_length": 32,
        "long_text": "head-tail:16",
        "max_eval_samples": 2000,
        "labels": ["negative", "positive"],
        "problem_type": "single_label_classification",
    }


@pytest.fixture(scope="module")
def ending_csv(tmp_path_factory) -> Path:
    """200 long reviews whose sentiment words come last, past the first 32 tokens."""
    rng = random.Random(1)
    path = tmp_path_factory.mktemp("data") / "ending.csv"
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        for i in range(200):
            lab = i % 2
            words = [rng.choice(FILLER) for _ in range(34)] + [rng.choice(POS if lab else NEG) for _ in range(3)]
            w.writerow([" ".join(words), "positive" if lab else "negative"])
    return path


def test_training_reads_long_texts_by_its_long_text_policy(tiny_checkpoint, ending_csv, tmp_path):
    """The label sits in the last token: head never sees it, head-tail does (train, val and test alike)."""
    head = train(tiny_cfg(tiny_checkpoint, ending_csv, tmp_path / "head", epochs=6, long_text="head"))
    ht = train(tiny_cfg(tiny_checkpoint, ending_csv, tmp_path / "ht", epochs=6, long_text="head-tail"))
    assert ht["val_accuracy"] >= 0.9 and ht["test_accuracy"] >= 0.9
    assert head["val_accuracy"] <= 0.75
    assert json.loads((tmp_path / "ht" / "qserve_model.json").read_text())["long_text"] == "head-tail:16"
    assert ht["config"]["long_text"] == "head-tail"


@pytest.mark.parametrize(
    "bad,why", [("windows", "inference policy"), ("middle", "allowed forms"), ("head-tail:40", "H must be 1..31")]
)
def test_training_refuses_a_policy_it_cannot_train_on(tiny_checkpoint, separable_csv, tmp_path, bad, why):
    with pytest.raises(QserveError, match=why) as e:
        train(tiny_cfg(tiny_checkpoint, separable_csv, tmp_path / "x", long_text=bad))
    assert "--long-text" in str(e.value) and not (tmp_path / "x").exists()


def test_checkpoint_reproduces_test_accuracy_from_its_metadata(trained):
    """What bench does: rebuild the test split from qserve_model.json and score the saved weights."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from qserve.data.datasets import load_dataset

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


def test_bf16_true_saves_fp32_weights_and_trains_with_a_kahan_buffer(tiny_checkpoint, separable_csv, tmp_path):
    from safetensors.torch import load_file

    out = tmp_path / "bf16"
    m = train(tiny_cfg(tiny_checkpoint, separable_csv, out, precision="bf16-true", epochs=1, max_eval_samples=8))
    assert m["precision"] == "bf16-true" and m["sizes"]["test"] == 8
    weights = load_file(out / "model.safetensors")
    assert {t.dtype for t in weights.values()} == {__import__("torch").float32}
    assert json.loads((out / "config.json").read_text())["dtype"] == "float32"
    # the default update is compensated: exp_avg, exp_avg_sq and the Kahan buffer, each bf16
    assert m["bf16_update"] == "compensated" and m["optimizer"] == "optimi.AdamW"
    assert m["optimizer_state_bytes"] == 3 * 2 * sum(t.numel() for t in weights.values())
    assert m["optimizer_step_median_s"] > 0


def test_auto_precision_follows_the_cpu_and_records_why(tiny_checkpoint, separable_csv, tmp_path, cpu_flags, capsys):
    cpu_flags("avx2 fma")  # an AVX2-only CPU: no bf16 instructions
    m = train(
        tiny_cfg(tiny_checkpoint, separable_csv, tmp_path / "auto", precision="auto", epochs=1, max_eval_samples=8)
    )
    assert m["precision"] == "32-true" and m["config"]["precision"] == "auto"
    choice = m["precision_choice"]
    assert choice["asked"] == "auto" and choice["precision"] == "32-true"
    assert choice["reason"].startswith("this CPU has no bf16 instructions: bf16-mixed measured")
    assert choice["probe"]["fp32_s"] > 0
    assert f"precision: 32-true ({choice['reason']})" in capsys.readouterr().out
    saved = json.loads((tmp_path / "auto" / "train_metrics.json").read_text())
    assert saved["precision_choice"] == choice


def test_time_budget_cuts_the_run_to_the_steps_that_fit_and_says_so(tiny_checkpoint, separable_csv, tmp_path):
    from qserve.training.train import BUDGET_STEPS, budget_steps

    # 10 steps an epoch, 4 epochs; a budget of ~6 ms is spent by the first steps: the run stops once they are timed
    m = train(tiny_cfg(tiny_checkpoint, separable_csv, tmp_path / "cut", train_budget=1e-4, max_eval_samples=8))
    assert m["optimizer_steps"] == BUDGET_STEPS and len(m["val_accuracy_per_epoch"]) == 1
    assert m["time_budget"] == {
        "minutes": 1e-4,
        "steps": BUDGET_STEPS,
        "of_steps": 40,
        "examples": 16 * BUDGET_STEPS,
        "of_examples": 160 * 4,
        "cut": True,
    }
    # a budget the recipe fits in trains it whole
    m = train(
        tiny_cfg(tiny_checkpoint, separable_csv, tmp_path / "whole", epochs=1, train_budget=60, max_eval_samples=8)
    )
    assert m["optimizer_steps"] == 10 and m["time_budget"]["cut"] is False
    # the plan: steps done plus what the rest buys at the median step (the first, warm-up, left out)
    assert budget_steps(1.0, 4, 10.0, [9.0, 1.0, 1.0, 1.0], 1000) == 4 + 50
    assert budget_steps(1.0, 4, 70.0, [9.0, 1.0, 1.0, 1.0], 1000) == 4
    assert budget_steps(10.0, 4, 4.0, [1.0] * 4, 100) == 100


def test_existing_out_needs_force(trained, tiny_checkpoint, separable_csv, tmp_path):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("user data")
    with pytest.raises(QserveError, match="already exists; pass --force"):
        train(tiny_cfg(tiny_checkpoint, separable_csv, out, epochs=1))
    assert (out / "keep.txt").read_text() == "user data"
    train(tiny_cfg(tiny_checkpoint, separable_csv, out, epochs=1, max_eval_samples=4, force=True))
    assert sorted(p.name for p in out.iterdir()) == sorted(FILES_WRITTEN)


def test_default_out_is_the_run_dirs_checkpoint(tiny_checkpoint, separable_csv, tmp_path, monkeypatch):
    """Without --out, training writes models/<model>-<dataset>/checkpoint: the run dir `qserve pipeline` fills,
    so `qserve export RUN/checkpoint` lands in RUN/variants/ and the README's tour finds both."""
    from qserve.training.config import run_dir

    monkeypatch.chdir(tmp_path)
    cfg = tiny_cfg(tiny_checkpoint, separable_csv, "unused", epochs=1, max_eval_samples=4)
    cfg.out = None  # no --out
    train(cfg)
    ckpt = tmp_path / "models" / f"{tiny_checkpoint.name}-{separable_csv.stem}" / "checkpoint"
    assert ckpt == tmp_path / run_dir(str(tiny_checkpoint), str(separable_csv)) / "checkpoint"
    assert sorted(p.name for p in ckpt.iterdir()) == sorted(FILES_WRITTEN)
    assert [p.name for p in (tmp_path / "models").iterdir()] == [ckpt.parent.name]


@pytest.mark.parametrize(
    "kw, match",
    [
        (
            {"precision": "fp16"},
            r"--precision must be one of auto, 32-true, 16-mixed, bf16-mixed, bf16-true "
            r"\(got 'fp16'\)",
        ),
        ({"train_budget": 0}, r"--train-budget must be a number of minutes > 0 \(got 0\)"),
        ({"precision": "16-mixed"}, r"16-mixed is not supported on CPU.*bf16-mixed or 32-true"),
        ({"matmul_precision": "low"}, r"--matmul-precision must be one of highest, high, medium"),
        ({"bf16_update": "fp32"}, r"--bf16-update must be one of compensated, plain \(got 'fp32'\)"),
        ({"epochs": 0}, r"--epochs must be an integer >= 1"),
        ({"batch_size": -1}, r"--batch-size must be an integer >= 1"),
        ({"lr": 0.0}, r"--lr must be > 0"),
        ({"warmup_ratio": 1.0}, r"--warmup-ratio must be in \[0, 1\)"),
        ({"device": "tpu"}, r"--device must be one of auto, cpu, cuda"),
        ({"max_length": 4096}, r"--max-length 4096 exceeds the model's 128 positions"),
    ],
)
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


def test_study_runs_each_precision_in_a_child(tiny_checkpoint, separable_csv, tmp_path):
    from qserve.training.study import compare

    cfg = tiny_cfg(tiny_checkpoint, separable_csv, None, epochs=1, max_eval_samples=8)
    study = compare(
        cfg,
        ["32-true", "bf16-mixed"],
        tmp_path / "report",
        step_rounds=1,
        step_samples=48,
        noise_precision="bf16-mixed",
    )  # named: the default (what auto chooses) depends on the CPU
    assert sorted(p.name for p in (tmp_path / "report").iterdir()) == ["precision_study.json", "precision_study.md"]
    runs = {r["label"]: r for r in study["runs"]}
    assert list(runs) == ["32-true", "bf16-mixed", "bf16-mixed, seed 43"] and all(r["ok"] for r in runs.values())
    assert runs["32-true"]["step_time_vs_32_true"] == 1.0
    assert study["bf16_mixed_over_32_true_step_time"] == runs["bf16-mixed"]["step_time_vs_32_true"] > 0
    assert runs["bf16-mixed"]["peak_memory_bytes"] > 0 and runs["bf16-mixed"]["sizes"]["test"] == 8
    # both keep fp32 weights, so both keep two fp32 moments per parameter
    assert runs["32-true"]["optimizer_state_bytes"] == runs["bf16-mixed"]["optimizer_state_bytes"] > 0
    assert study["noise"]["seeds"] == [42, 43] and study["noise"]["test_accuracy"] == [
        runs["bf16-mixed"]["test_accuracy"],
        runs["bf16-mixed, seed 43"]["test_accuracy"],
    ]
    assert set(study["gaps_to_bf16_mixed"]) == {"32-true"}
    # one interleaved step round: a short child per timed run (not the noise run), ratios to both bases
    assert [len(r.get("step_rounds_s") or []) for r in runs.values()] == [1, 1, 0] and study["complete"]
    assert runs["32-true"]["step_interleaved_vs_32_true"] == 1.0 == runs["bf16-mixed"]["step_interleaved_vs_bf16_mixed"]
    assert runs["32-true"]["step_interleaved_vs_bf16_mixed"] > 0
    md = (tmp_path / "report" / "precision_study.md").read_text()
    assert "Step time, interleaved: after the full runs, 1 round(s)" in md
    assert "| bf16-mixed | torch.AdamW |" in md and "Run-to-run noise: bf16-mixed with seeds 42 and 43" in md
    assert "not measured by qserve" in md
    assert "| 5.22 | 0.24x | 2.87 | 0.53x | 92.69% (plain Adam on bf16 weights) |" in md  # the seed's bf16-true
    assert "| bf16-mixed | " in md.split("## Beside the seed")[1]  # ours beside the seed's, as ratios
    assert ("with AMX" in md) == ("amx_bf16" in study["cpu"]["flags"])
    assert json.loads((tmp_path / "report" / "precision_study.json").read_text())["reference"] == SEED
    with pytest.raises(QserveError, match="already exists"):
        # no noise run: the default one would first time the CPU's bf16 for `auto`, which the refusal does not need
        compare(cfg, ["32-true"], tmp_path / "report", noise_precision="none")
    with pytest.raises(QserveError, match=r"--step-samples must be an integer >= 3 x --batch-size \(48\)"):
        compare(cfg, ["32-true"], tmp_path / "other", step_rounds=1, step_samples=20)
