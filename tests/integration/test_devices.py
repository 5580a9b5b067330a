"""Device selection on every stage, proven on the CPU path (QSERVE_FORCE_CPU=1 where it matters).

    python -m pytest tests/integration/test_devices.py -q

What a GPU changes is chosen in a few places: qserve.devices.resolve_device (all stages),
train's precision checks, ONNX Runtime's provider list, and bench's CUDA memory/timing
hooks. These tests pin that each takes its CUDA branch only for a CUDA device, and that
asking for CUDA where there is none fails with a message naming what to do instead.
Nothing here needs (or starts) a GPU; the same tests pass on a GPU machine.
"""

from __future__ import annotations

import re
import types

import pytest

from qserve import QserveError
from qserve.cli import main as cli_main
from qserve.devices import resolve_device


@pytest.fixture
def force_cpu(monkeypatch):
    monkeypatch.setenv("QSERVE_FORCE_CPU", "1")


# -- qserve.devices ----------------------------------------------------------------------


def test_auto_is_cpu_when_forced(force_cpu):
    assert resolve_device("auto") == "cpu"
    assert resolve_device("cpu") == "cpu"


@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_cuda_without_gpu_is_a_clear_error(force_cpu, device):
    with pytest.raises(
        QserveError,
        match=rf"--device {device} was asked for but no CUDA GPU is available; "
        r"use --device cpu or auto",
    ):
        resolve_device(device)


def test_unknown_device_lists_the_allowed_ones():
    with pytest.raises(QserveError, match=r"--device must be one of auto, cpu, cuda or cuda:N \(got 'tpu'\)"):
        resolve_device("tpu")


def test_force_cpu_other_values_do_not_force(monkeypatch):
    # only "1" forces: QSERVE_FORCE_CPU=0 must leave a GPU machine on its GPU
    import torch

    monkeypatch.setenv("QSERVE_FORCE_CPU", "0")
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")


# -- every stage's CLI refuses --device cuda without a GPU, before any heavy work ------------


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "--device", "cuda", "--max-samples", "8"],
        ["export", "{ckpt}", "--bits", "8", "--device", "cuda"],
        ["bench", "{variant}", "--device", "cuda", "--out", "{tmp}/bench"],
        ["pipeline", "--device", "cuda"],
    ],
)
def test_cli_cuda_without_gpu(force_cpu, argv, tiny_checkpoint, tiny_variant, tmp_path, capsys):
    argv = [a.format(ckpt=tiny_checkpoint, variant=tiny_variant, tmp=tmp_path) for a in argv]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert f"qserve {argv[0]}: error: --device cuda was asked for but no CUDA GPU is available" in err
    assert not (tmp_path / "bench").exists()  # refused before writing anything


# -- train: precision per device ---------------------------------------------------------


@pytest.mark.parametrize("device", ["cpu", "auto"])
def test_train_refuses_16_mixed_on_cpu(force_cpu, device, capsys):
    # 'auto' resolves to the CPU here, so the same refusal applies; data is never loaded
    assert cli_main(["train", "--precision", "16-mixed", "--device", device, "--dataset", "/nonexistent.csv"]) == 2
    err = capsys.readouterr().err
    assert "--precision 16-mixed is not supported on CPU" in err
    assert "use bf16-mixed or 32-true" in err


def test_train_rejects_unknown_matmul_precision(capsys):
    with pytest.raises(SystemExit):
        cli_main(["train", "--matmul-precision", "tf32"])
    # argparse quotes the choices in some Python versions and not in others
    assert re.search(
        r"--matmul-precision: invalid choice: 'tf32' \(choose from '?highest'?, '?high'?, '?medium'?\)",
        capsys.readouterr().err,
    )


def test_train_applies_matmul_precision(tiny_checkpoint, tmp_path):
    """--matmul-precision reaches torch (it is what turns TF32 on for 32-true on Ampere+)."""
    import csv

    import torch

    from qserve.training.config import TrainConfig
    from qserve.training.train import train

    data = tmp_path / "toy.csv"
    with open(data, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        for i in range(40):
            w.writerow([f"{'great' if i % 2 else 'awful'} film {i}", "positive" if i % 2 else "negative"])
    before = torch.get_float32_matmul_precision()
    try:
        train(
            TrainConfig(
                model=str(tiny_checkpoint),
                dataset=str(data),
                out=str(tmp_path / "run"),
                device="cpu",
                precision="32-true",
                max_length=16,
                batch_size=8,
                matmul_precision="medium",
            )
        )
        assert torch.get_float32_matmul_precision() == "medium"
    finally:
        torch.set_float32_matmul_precision(before)


# -- ONNX Runtime: the provider list follows the device --------------------------------------


def _onnx_rt(device: str, cuda_spec: bool = True):
    from qserve.runtime.onnx_rt import OnnxRuntime

    rt = object.__new__(OnnxRuntime)  # provider selection only: no model file needed
    rt.device, rt.name = device, "onnx-fp32"
    from dataclasses import replace

    from qserve.artifact import Manifest
    from qserve.variants import VARIANTS

    rt.manifest = Manifest(spec=replace(VARIANTS["onnx-fp32"], cuda=cuda_spec), labels=("a", "b"), max_length=8)
    return rt


def test_onnx_cpu_uses_only_the_cpu_provider():
    import onnxruntime as ort

    assert _onnx_rt("cpu")._providers(ort) == ["CPUExecutionProvider"]


def test_onnx_cuda_on_cpu_onnxruntime_names_the_gpu_extra():
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has the CUDA provider")
    with pytest.raises(QserveError) as e:
        _onnx_rt("cuda")._providers(ort)
    msg = str(e.value)
    assert "needs onnxruntime-gpu" in msg and "CPUExecutionProvider" in msg
    assert "pip uninstall -y onnxruntime && pip install 'qserve[gpu]'" in msg


def test_onnx_cpu_only_variant_refused_on_cuda():
    import onnxruntime as ort

    with pytest.raises(QserveError, match="has no CUDA kernels in ONNX Runtime; load it with --device cpu"):
        _onnx_rt("cuda:0", cuda_spec=False)._providers(ort)


# -- bench: CUDA timing and memory hooks only for a CUDA device --------------------------------


def test_torch_runtime_synchronize_skips_cuda_on_cpu(tiny_variant):
    from qserve.runtime import load_runtime

    rt = load_runtime(tiny_variant, "cpu")
    rt.synchronize()  # on a CPU-only torch, torch.cuda.synchronize() would raise: the CPU branch skips it
    import torch

    if not torch.cuda.is_available():
        with pytest.raises((AssertionError, RuntimeError)):
            types.MethodType(type(rt).synchronize, types.SimpleNamespace(device="cuda", _torch=torch))()


def test_measure_reports_cuda_memory_only_for_cuda(tiny_variant):
    """A CPU bench child records RSS and no `cuda` block (max_memory_allocated/reserved are CUDA-only)."""
    from qserve.bench.measure import measure

    job = {
        "variant_dir": str(tiny_variant),
        "device": "cpu",
        "threads": 1,
        "batch_sizes": [1],
        "seq_lens": [8],
        "warmup": 0,
        "time_budget_s": 0.01,
        "min_iters": 1,
        "max_iters": 2,
        "data": {},
    }
    res = measure(job)
    assert res["device"] == "cpu" and "cuda" not in res
    assert res["peak_rss_mb"] > 0 and res["fixed"][0]["count"] >= 1


def test_bench_child_env_pins_cpu_only_for_cpu(monkeypatch):
    from qserve.bench.config import BenchConfig
    from qserve.bench.runner import _child_env

    monkeypatch.delenv("QSERVE_FORCE_CPU", raising=False)
    assert _child_env(BenchConfig(device="cpu", threads=2))["QSERVE_FORCE_CPU"] == "1"
    assert "QSERVE_FORCE_CPU" not in _child_env(BenchConfig(device="cuda", threads=2))


def test_floor_gemms_per_device():
    """The floor measures fp16 (and bf16 regardless of CPU flags) only on CUDA; building the list starts nothing."""
    from qserve.bench.floor import _torch_methods

    cpu = {d for d, _, _ in _torch_methods("cpu")}
    cuda = {d for d, _, _ in _torch_methods("cuda")}
    assert "fp16" not in cpu and {"fp32", "int8"} <= cpu
    assert {"fp32", "int8", "bf16", "fp16"} == cuda


@pytest.mark.parametrize(
    "memory, expected",
    [
        (
            {
                "peak_rss_mb": 900.0,
                "cuda": {"max_allocated_mb": 120.0, "max_reserved_mb": 160.0, "device_used_mb": 700.0},
            },
            (120.0, "CUDA max allocated"),
        ),
        # ONNX Runtime allocates outside torch: torch's counter is 0, the device-wide figure stands in
        (
            {"peak_rss_mb": 900.0, "cuda": {"max_allocated_mb": 0.0, "max_reserved_mb": 0.0, "device_used_mb": 700.0}},
            (700.0, "CUDA device used"),
        ),
        ({"peak_rss_mb": 900.0}, (900.0, "peak RSS")),
    ],
)
def test_report_memory_column_follows_the_device(memory, expected):
    from qserve.bench.report import peak_memory

    assert peak_memory({"memory": memory}) == expected
