"""A GPU machine whose onnxruntime has no CUDA provider (issue 53), faked on the CPU: the plan puts the ONNX
variants on the CPU, and export, bench, gate, the runtime and every table follow it, for real, on the CPU.

    python -m pytest tests/integration/test_gpu_plan.py -q

The capabilities are faked (tests/conftest.py `fake_gpu`); everything that then runs (exports, bench children,
the gate, ONNX Runtime) is real. What would run on the fake GPU cannot run here: a torch variant placed on it
fails its export, which the pipeline reports and goes on without.
"""

from __future__ import annotations

import csv
import io
import json
import shutil
from pathlib import Path

import pytest

from qserve import QserveError
from qserve.cli import main as cli_main


@pytest.fixture(scope="module")
def onnx_variant(tiny_checkpoint, tmp_path_factory) -> Path:
    import exporters

    out = tmp_path_factory.mktemp("gpu-plan") / "onnx-fp32"
    exporters.export(tiny_checkpoint, "onnx-fp32", out, device="cpu")
    return out


def test_the_runtime_puts_an_onnx_variant_on_the_cpu_for_auto_and_refuses_an_explicit_cuda(fake_gpu, onnx_variant):
    from qserve.runtime import load_runtime

    fake_gpu()
    rt = load_runtime(onnx_variant, "auto")  # what `qserve serve RUN_DIR` and `qserve predict` load with
    try:
        assert rt.device == "cpu" and rt.session.get_providers() == ["CPUExecutionProvider"]
        assert rt.predict(["a fine film"]).shape == (1, 2)
    finally:
        rt.close()
    with pytest.raises(
        QserveError,
        match=r"^--device cuda: onnx-fp32 cannot run on CUDA here \(onnxruntime 1.30.0 is "
        r"the CPU build",
    ):
        load_runtime(onnx_variant, "cuda")


def test_export_places_a_named_onnx_variant(fake_gpu, tiny_checkpoint, tmp_path, capsys):
    fake_gpu()
    argv = ["export", str(tiny_checkpoint), "--bits", "32", "--backend", "onnx", "--out", str(tmp_path / "v")]
    assert cli_main([*argv, "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert "qserve export: error: --device cuda: onnx-fp32 cannot run on CUDA here" in err
    assert "use --device cpu, or --device auto" in err and not (tmp_path / "v").exists()
    assert cli_main(argv) == 0  # --device auto: the CPU, said
    err = capsys.readouterr().err
    assert "note: onnx-fp32 cannot run on cuda here (onnxruntime 1.30.0 is the CPU build" in err
    assert "exported and parity-checked on the cpu (--device auto)" in err
    assert json.loads((tmp_path / "v" / "manifest.json").read_text())["export_device"] == "cpu"
    # --bits 8 on a GPU picks the GPU's default (bnb-int8) as before; a CPU-only 8-bit variant named for an explicit
    # --device cuda is refused up front, naming the flag
    assert (
        cli_main(
            [
                "export",
                str(tiny_checkpoint),
                "--bits",
                "8",
                "--backend",
                "onnx",
                "--device",
                "cuda",
                "--out",
                str(tmp_path / "i8"),
            ]
        )
        == 2
    )
    assert "onnx-int8 has no CUDA kernels; on CUDA use one of" in capsys.readouterr().err


def test_pipeline_on_a_gpu_without_the_onnx_provider_ends_with_its_report(
    fake_gpu, tiny_checkpoint, tmp_path, monkeypatch, capsys
):
    """`qserve pipeline` (device auto) on the faked GPU: the plan is printed before training; torch-fp32, planned
    on the GPU, fails its export here (no real GPU) and the run goes on; the ONNX variants are exported, benched
    and gated on the CPU, and every table of the report marks them (cpu)."""
    from qserve import pipeline

    fake_gpu()
    ckpt = tmp_path / "run" / "checkpoint"
    shutil.copytree(tiny_checkpoint, ckpt)
    (ckpt / "qserve_model.json").write_text(
        json.dumps(
            {
                "model_name": "tiny-distilbert",
                "max_length": 64,
                "dataset": "default",
                "seed": 42,
                "max_eval_samples": 60,
            }
        )
    )
    trained: list[str] = []

    def train_stage(cfg, run_dir, force):  # training on the fake GPU cannot run; the plan came before it
        trained.append(cfg.device)
        return ckpt

    monkeypatch.setattr(pipeline, "_train_stage", train_stage)
    argv = [
        "pipeline",
        "--run-dir",
        str(tmp_path / "run"),
        "--variants",
        "torch-fp32,onnx-fp32,onnx-int8",
        "--batch-sizes",
        "1",
        "--seq-lens",
        "16",
        "--time-budget",
        "0.05",
        "--bench-eval-samples",
        "60",
        "--bench-long-text",
        "",
        "--threads",
        "1",
        "--no-repair",  # whether onnx-int8 could win here is timing: the repair stage is test_e2e_default's
    ]
    assert cli_main(argv) == 1  # the report is written; the exit status says a variant failed
    out = capsys.readouterr().out
    plan_at = out.index("plan:")
    assert plan_at < out.index("== [1/4] train") and trained == ["cuda"]
    assert "   torch-fp32: cuda\n   onnx-fp32: cpu (onnxruntime 1.30.0 is the CPU build" in out
    assert "   onnx-int8: cpu (onnx-int8 has no CUDA kernels (a CPU-only variant))" in out
    assert "[2/3] onnx-fp32: exporting on the cpu ..." in out and "[1/3] torch-fp32: exporting ..." in out
    assert "1 variant(s) failed: torch-fp32" in out

    report_dir = tmp_path / "run" / "report"
    report = json.loads((report_dir / "report.json").read_text())
    assert report["config"]["device"] == "cuda"
    assert [(v["name"], v["device"], v["status"]) for v in report["variants"]] == [
        ("onnx-fp32", "cpu", "ok"),
        ("onnx-int8", "cpu", "ok"),
    ]
    assert report["variants"][0]["placement"].startswith("onnxruntime 1.30.0 is the CPU build")
    assert all(v["floor"] is None for v in report["variants"])  # the floor's peaks would be the GPU's
    pipe = report["pipeline"]
    assert pipe["plan"]["device"] == "cuda" and "torch-fp32" in pipe["export_failed"]
    assert "NVIDIA H200 (faked) (cuda, sm_90, bf16 yes)" in pipe["machine"]

    md = (report_dir / "report.md").read_text()
    for table_row in ("| onnx-fp32 (cpu) | ", "| onnx-int8 (cpu) | "):
        assert md.count(table_row) >= 4, table_row  # summary, latency grid, real text, invariance, bench time
    assert "measured on another device than the run's, marked so in every table: onnx-fp32 (cpu) (onnxruntime" in md
    assert "- Run on cuda, except: **onnx-fp32** on the cpu (onnxruntime 1.30.0 is the CPU build" in md
    assert "- Export failed for **torch-fp32**: " in md
    rows = list(csv.DictReader(io.StringIO((report_dir / "report.csv").read_text())))
    assert {(r["variant"], r["device"]) for r in rows} == {("onnx-fp32", "cpu"), ("onnx-int8", "cpu")}
    # the pipeline gates a candidate only when it is faster than the reference here (timing): `qserve gate` with
    # --device auto on the same machine scores onnx-int8 against onnx-fp32 (torch-fp32 failed), both on the CPU
    from qserve.gate.config import GateConfig
    from qserve.gate.run import run_gate

    (g,) = [
        r["gate"]
        for r in run_gate([tmp_path / "run" / "variants" / "onnx-int8"], GateConfig(max_eval_samples=60, record=False))
    ]
    assert g["machine"]["device"] == g["reference"]["device"] == "cpu" and g["reference"]["name"] == "onnx-fp32"
    if (report_dir / "gate" / "gate.md").is_file():
        assert "onnx-int8 |" in (report_dir / "gate" / "gate.md").read_text()  # same device: no mark


def test_export_all_on_a_gpu_asks_each_variant_for_its_planned_device(
    fake_gpu, tiny_checkpoint, tmp_path, monkeypatch, capsys
):
    """`qserve export CKPT --all --device cuda` beside the CPU onnxruntime: every variant the machine runs, the
    ONNX ones exported (and parity-checked) on the CPU with a note, OpenVINO skipped where it is not installed.
    The exporter itself is replaced by a recorder: what is decided here is the device each one is asked for (the
    real exports on the CPU run in the pipeline test above; those on the fake GPU cannot run)."""
    import exporters
    from qserve import placement

    fake_gpu()
    real = placement.not_installed
    monkeypatch.setattr(
        placement,
        "not_installed",
        lambda spec: (
            "openvino is not installed: pip install 'qserve[openvino]'" if spec.backend == "openvino" else real(spec)
        ),
    )
    asked: dict[str, str] = {}

    def export(checkpoint, spec, out, device, **kw):
        asked[spec.name] = device
        raise QserveError("recorded")  # --all reports it and goes on

    monkeypatch.setattr(exporters, "export", export)
    assert cli_main(["export", str(tiny_checkpoint), "--all", "--device", "cuda", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert asked == {
        "torch-fp32": "cuda",
        "torch-bf16": "cuda",
        "torch-fp16": "cuda",
        "bnb-int8": "cuda",
        "bnb-nf4": "cuda",
        "bnb-fp4": "cuda",
        "onnx-fp32": "cpu",
        "onnx-fp16": "cpu",
        "onnx-int8": "cpu",
        "onnx-int4": "cpu",
    }
    assert "note: onnx-fp32 is exported and parity-checked on the cpu: onnxruntime 1.30.0 is the CPU build" in err
    assert "skipping ov-int8: openvino is not installed: pip install 'qserve[openvino]'" in err
