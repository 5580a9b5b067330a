"""Resumable training (qserve.training.resume): a real `python -m qserve.training.train` SIGKILLed, then resumed.

    python -m pytest tests/integration/test_resume.py -q

Each case trains the tiny DistilBERT (dropout on) on a 200-row CSV for 2 epochs (20 optimizer steps)
three ways: uninterrupted in this process, killed in a child process right after a checkpoint (or in the
middle of writing one), and resumed in this process. The weights must be identical bit for bit: the
kernels are the same CPU kernels with the same thread count, the resumed run replays the same data order,
dropout draws, LR schedule step and optimizer state.
"""

from __future__ import annotations

import csv
import json
import os
import random
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from qserve import QserveError
from qserve.training.config import FILES_WRITTEN, TrainConfig
from qserve.training.resume import CHECKPOINT, KILL_ENV, PARTIAL_SUFFIX, STARTED
from qserve.training.train import train

ROOT = Path(__file__).resolve().parents[2]
WORDS = {0: ["awful", "boring", "dull"], 1: ["great", "superb", "loved"]}


def toy_rows(path: Path) -> Path:
    """200 short reviews, the label given by one sentiment word (the pipeline tests use it too)."""
    rng = random.Random(1)
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        for i in range(200):
            words = [rng.choice(["the", "film", "plot", "was", "a"]) for _ in range(5)] + [rng.choice(WORDS[i % 2])]
            w.writerow([" ".join(words) + f" {i}", "positive" if i % 2 else "negative"])
    return path


@pytest.fixture(scope="module")
def toy_csv(tmp_path_factory) -> Path:
    return toy_rows(tmp_path_factory.mktemp("data") / "toy.csv")


def cfg_for(ckpt: Path, data: Path, out: Path, **kw) -> TrainConfig:
    base = dict(
        model=str(ckpt),
        dataset=str(data),
        out=str(out),
        max_length=32,
        batch_size=16,
        lr=5e-3,
        epochs=2,
        precision="32-true",
        device="cpu",
        max_eval_samples=20,
    )
    return TrainConfig(**{**base, **kw})


def argv_for(cfg: TrainConfig) -> list[str]:
    from qserve.training.study import child_argv

    return child_argv(cfg, cfg.precision, Path(cfg.out))


def kill_run(cfg: TrainConfig, hook: str) -> subprocess.CompletedProcess:
    """Run `qserve train` in a child with the test hook; it must die by SIGKILL. Same torch thread count."""
    import torch

    env = {**os.environ, KILL_ENV: hook, "OMP_NUM_THREADS": str(torch.get_num_threads()), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(argv_for(cfg), cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    return proc


def weights(out: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(out / "model.safetensors")


def assert_same_run(a: Path, b: Path) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    differ = [k for k in wa if not (wa[k].dtype == wb[k].dtype and bool((wa[k] == wb[k]).all()))]
    assert differ == [], f"weights differ in {differ[:5]}"
    ma, mb = (json.loads((d / "train_metrics.json").read_text()) for d in (a, b))
    for key in (
        "optimizer_steps",
        "train_loss_last_epoch",
        "val_accuracy_per_epoch",
        "test_accuracy",
        "test_loss",
        "optimizer_state_bytes",
    ):
        assert ma[key] == mb[key], key


# (precision, --checkpoint-every, kill hook, grad_accum): after step 3; at the epoch boundary (step 10,
# the 2nd checkpoint, so the resumed run skips a whole epoch's order); torn in the middle of the 2nd
# write (step 8: the 1st, step 4, must be what resumes).
CASES = [("32-true", 3, "after:1", 1), ("bf16-mixed", 5, "after:2", 1), ("bf16-true", 4, "torn:2", 2)]


@pytest.mark.parametrize("precision, every, hook, accum", CASES, ids=[c[0] for c in CASES])
def test_killed_run_resumes_to_the_same_weights(
    tiny_checkpoint, toy_csv, tmp_path, capsys, precision, every, hook, accum
):
    ref = tmp_path / "uninterrupted"
    train(cfg_for(tiny_checkpoint, toy_csv, ref, precision=precision, grad_accum=accum, checkpoint_every=0))
    out = tmp_path / "killed"
    cfg = cfg_for(tiny_checkpoint, toy_csv, out, precision=precision, grad_accum=accum, checkpoint_every=every)
    kill_run(cfg, hook)
    assert (out / STARTED).is_file() and (out / CHECKPOINT).is_file()
    kind, n = hook.split(":")
    steps_per_epoch = 10 // accum
    at = every * (int(n) - (kind == "torn"))
    assert (out / (CHECKPOINT + PARTIAL_SUFFIX)).is_file() == (kind == "torn")
    if kind == "torn":
        half = (out / (CHECKPOINT + PARTIAL_SUFFIX)).stat().st_size
        assert 0 < half < (out / CHECKPOINT).stat().st_size  # the torn temp file, never renamed into place
    if precision == "32-true":  # another config is refused by name, the run left as it was
        with pytest.raises(QserveError, match=r"another config \(--lr 0\.005 recorded, 0\.001 now\).*--force"):
            train(cfg_for(tiny_checkpoint, toy_csv, out, lr=1e-3, checkpoint_every=every))
        assert (out / CHECKPOINT).is_file()
    capsys.readouterr()
    m = train(cfg)  # the same command again: it resumes, and says so
    assert f"resuming at step {at} of {2 * steps_per_epoch}" in capsys.readouterr().out
    assert m["resumed_at_steps"] == [at] and m["optimizer_steps"] == 2 * steps_per_epoch
    assert m["checkpoints_written"] == (2 * steps_per_epoch - 1) // every  # none at the last step: the end follows
    assert sorted(p.name for p in out.iterdir()) == sorted(FILES_WRITTEN)  # the checkpoint is gone
    assert_same_run(ref, out)
    if precision == "32-true":  # once more: a finished run is never retrained, the recorded metrics come back
        before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
        assert train(cfg)["resumed_at_steps"] == [at]
        assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
        with pytest.raises(QserveError, match=r"--resume: .* finished run, nothing to resume"):
            train(cfg_for(tiny_checkpoint, toy_csv, out, resume=True))
        with pytest.raises(
            QserveError,
            match=r"finished run trained with another config \(--epochs 2 recorded, "
            r"3 now",
        ):
            train(cfg_for(tiny_checkpoint, toy_csv, out, epochs=3))


def test_plan_choices_name_the_flags(tmp_path):
    from dataclasses import asdict

    from qserve.training.resume import plan, record_start

    cfg, defaults = asdict(TrainConfig(out=str(tmp_path / "o"))), asdict(TrainConfig())
    out = tmp_path / "o"
    assert plan(out, cfg, defaults, None, False).action == "fresh"
    with pytest.raises(QserveError, match="--resume: .* no unfinished run to resume; allowed: --no-resume"):
        plan(out, cfg, defaults, True, False)
    record_start(out, cfg)  # killed before its first checkpoint: nothing to resume, it starts over
    assert plan(out, cfg, defaults, None, False).action == "fresh"
    with pytest.raises(QserveError, match="--resume: .* no checkpoint yet"):
        plan(out, cfg, defaults, True, False)
    (out / CHECKPOINT).write_bytes(b"x")
    assert plan(out, cfg, defaults, None, False).action == "resume"
    assert plan(out, {**cfg, "checkpoint_every": 9, "force": True}, defaults, True, False).action == "resume"
    assert plan(out, cfg, defaults, False, False).action == "fresh"  # --no-resume
    with pytest.raises(QserveError, match=r"--seed 42 recorded, 1 now.*--force to start over"):
        plan(out, {**cfg, "seed": 1}, defaults, None, False)
    assert plan(out, {**cfg, "seed": 1}, defaults, None, True).action == "fresh"
    old = {k: v for k, v in cfg.items() if k != "checkpoint_every"}  # recorded before a field existed
    (out / STARTED).write_text(json.dumps(old))
    assert plan(out, cfg, defaults, None, False).action == "resume"


def test_checkpoint_every_is_validated(tiny_checkpoint, toy_csv, tmp_path):
    with pytest.raises(QserveError, match=r"--checkpoint-every must be an integer >= 0 \(got -1\)"):
        train(cfg_for(tiny_checkpoint, toy_csv, tmp_path / "o", checkpoint_every=-1))
    assert not (tmp_path / "o").exists()


def test_ddp_run_killed_on_every_rank_resumes_to_the_same_weights(tiny_checkpoint, toy_csv, tmp_path):
    """--devices 2 (Fabric DDP, gloo): both ranks die after the first checkpoint; the re-run resumes both. The
    uninterrupted run also shows what DDP itself must get right: rank 0 alone writes and reports, and the
    sharded evaluation of an odd count (7 test rows over 2 ranks) counts every row once."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from qserve.data.datasets import load_dataset

    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(max(1, torch.get_num_threads() // 2))}
    # The uninterrupted run goes on beside the killed-then-resumed pair: each run's ranks import one after another,
    # mostly one core busy, and the results do not depend on it (fixed thread count, deterministic CPU kernels).
    # Each run gets its own rendezvous port, picked while all are held open so no two runs can share one.
    socks = [socket.socket() for _ in range(3)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()

    def start(name: str, hook: str | None, port: int) -> tuple[subprocess.Popen, str | None, list]:
        cfg = cfg_for(
            tiny_checkpoint,
            toy_csv,
            tmp_path / name,
            batch_size=8,
            epochs=1,
            devices=2,
            strategy="ddp",
            checkpoint_every=4 if name == "killed" else 0,
            max_eval_samples=7,
        )
        run_env = {**env, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), **({KILL_ENV: hook} if hook else {})}
        logs = [open(tmp_path / f"{name}-{hook}.{x}", "w+", encoding="utf-8") for x in ("out", "err")]
        # its own process group (rank 0 starts rank 1), so a failing test leaves neither behind; its output goes to
        # files, so a run waited on later never blocks on a full pipe
        proc = subprocess.Popen(
            argv_for(cfg), cwd=ROOT, env=run_env, stdout=logs[0], stderr=logs[1], text=True, start_new_session=True
        )
        return proc, hook, logs

    def finish(run) -> str:
        proc, hook, logs = run
        proc.wait(timeout=300)
        for f in logs:
            f.seek(0)
        out, err = (f.read() for f in logs)
        for f in logs:
            f.close()
        assert proc.returncode == (-signal.SIGKILL if hook else 0), err[-3000:]
        return out

    started = [start("uninterrupted", None, ports[0])]
    try:
        started.append(start("killed", "after:1", ports[1]))
        runs = {("killed", "after:1"): finish(started[-1])}
        started.append(start("killed", None, ports[2]))
        runs["killed", None] = finish(started[-1])
        runs["uninterrupted", None] = finish(started[0])
    except BaseException:
        for proc, _, _ in started:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        raise
    assert "resuming at step 4 of 10 (epoch 1/1, batch 4/10)" in runs["killed", None]
    assert runs["killed", None].count("resuming") == 1 and runs["killed", None].count("trained ") == 1  # rank 0
    assert_same_run(tmp_path / "uninterrupted", tmp_path / "killed")

    out = tmp_path / "uninterrupted"
    assert runs["uninterrupted", None].count("trained ") == 1  # only rank 0 reports
    assert sorted(p.name for p in out.iterdir()) == sorted(FILES_WRITTEN)
    m = json.loads((out / "train_metrics.json").read_text())
    assert m["world_size"] == 2 and m["optimizer_steps"] == 10  # 160 training rows / 2 ranks / batch 8
    data = load_dataset(str(toy_csv), max_eval_samples=7)
    model = AutoModelForSequenceClassification.from_pretrained(out).eval()
    enc = AutoTokenizer.from_pretrained(out)(
        data.test.texts, truncation=True, max_length=32, padding=True, return_tensors="pt"
    )
    with torch.no_grad():
        pred = model(**enc).logits.argmax(-1).tolist()
    assert len(pred) == m["sizes"]["test"] == 7
    assert m["test_accuracy"] == pytest.approx(sum(p == y for p, y in zip(pred, data.test.labels)) / 7)
