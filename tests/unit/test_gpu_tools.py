"""benchmarks/gpu_tools.py: what the offline GPU check carries, unpacks and reports.

    python -m pytest tests/unit/test_gpu_tools.py -q

Built on small fake wheels (zip files laid out as wheels are), so these run in seconds;
the real packing is exercised by benchmarks/gpu_wheels.sh and the dry run of gpu_check.sh.
"""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from benchmarks import gpu_tools

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tools():
    return gpu_tools


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _wheel(path: Path, files: dict[str, bytes], dist: str) -> Path:
    name, version = dist[:-len(".dist-info")].split("-")
    files = {**files, f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: py3-none-any\n"}
    record = "\n".join([_record_line(n, d) for n, d in files.items()] + [f"{dist}/RECORD,,"]) + "\n"
    with zipfile.ZipFile(path, "w") as zf:
        for n, d in files.items():
            zf.writestr(n, d)
        zf.writestr(f"{dist}/RECORD", record)
    return path


def test_slim_wheel_keeps_cpu_and_the_cuda_asked_for(tools, tmp_path):
    libs = {f"bitsandbytes/libbitsandbytes_{v}.so": v.encode() * 100 for v in ("cpu", "cuda121", "cuda130", "rocm64")}
    src = _wheel(tmp_path / "bitsandbytes-0.50.2-py3-none-any.whl",
                 {"bitsandbytes/__init__.py": b"__version__ = '0.50.2'\n", **libs}, "bitsandbytes-0.50.2.dist-info")
    (tmp_path / "out").mkdir()
    out = tools.slim_wheel(src, tmp_path / "out", ["130"])
    assert out.name == "bitsandbytes-0.50.2-1cuda130-py3-none-any.whl"  # build tag: not PyPI's file
    with zipfile.ZipFile(out) as zf:
        names = set(zf.namelist())
        record = zf.read("bitsandbytes-0.50.2.dist-info/RECORD").decode().splitlines()
        for line in record[:-1]:  # every kept file's hash is right
            name = line.split(",")[0]
            assert line == _record_line(name, zf.read(name))
    assert "bitsandbytes/libbitsandbytes_cuda130.so" in names and "bitsandbytes/libbitsandbytes_cpu.so" in names
    assert not {"bitsandbytes/libbitsandbytes_cuda121.so", "bitsandbytes/libbitsandbytes_rocm64.so"} & names
    assert {line.split(",")[0] for line in record} == names
    # pip installs it exactly as gpu_check.sh does
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--target", str(tmp_path / "site"), str(out)], check=True)
    assert (tmp_path / "site" / "bitsandbytes" / "libbitsandbytes_cuda130.so").read_bytes() == b"cuda130" * 100


def test_slim_wheel_refuses_a_missing_cuda_version(tools, tmp_path):
    src = _wheel(tmp_path / "bitsandbytes-0.50.2-py3-none-any.whl",
                 {"bitsandbytes/libbitsandbytes_cpu.so": b"x"}, "bitsandbytes-0.50.2.dist-info")
    with pytest.raises(SystemExit, match="no library for cuda130"):
        tools.slim_wheel(src, tmp_path, ["130"])


def test_pack_dist_rounds_weights_to_bf16_and_unpack_restores_fp32(tools, tmp_path):
    import torch
    from safetensors.torch import load_file, save

    torch.manual_seed(0)
    w = torch.randn(8, 4)
    ids = torch.arange(5, dtype=torch.int64)
    weights = save({"w": w, "ids": ids}, metadata={"format": "pt"})
    src = _wheel(tmp_path / "pkg-1.0-py3-none-any.whl",
                 {"pkg/__init__.py": b"X = 1\n", "pkg/model/model.safetensors": weights, "pkg/model/vocab.txt": b"a\nb\n"},
                 "pkg-1.0.dist-info")
    packed = tmp_path / "pkg.tar.xz"
    note = tools.pack_dist(src, packed, ["pkg/model/model.safetensors"])
    assert note["bf16_upcast"] == ["pkg/model/model.safetensors"]
    with tarfile.open(packed, "r:xz") as tar:
        names = set(tar.getnames())
    assert "pkg-1.0.dist-info/RECORD" not in names and tools.TRANSPORT in names

    site = tmp_path / "site"
    tools.unpack(packed, site)
    got = load_file(site / "pkg/model/model.safetensors")
    assert got["w"].dtype == torch.float32 and torch.equal(got["w"], w.to(torch.bfloat16).float())
    assert torch.equal(got["ids"], ids)
    assert tools._file_metadata(site / "pkg/model/model.safetensors") == {"format": "pt"}
    assert (site / "pkg/model/vocab.txt").read_bytes() == b"a\nb\n" and not (site / tools.TRANSPORT).exists()


def test_pack_dist_names_a_missing_weights_file(tools, tmp_path):
    src = _wheel(tmp_path / "pkg-1.0-py3-none-any.whl", {"pkg/__init__.py": b""}, "pkg-1.0.dist-info")
    with pytest.raises(SystemExit, match="has no pkg/model.safetensors"):
        tools.pack_dist(src, tmp_path / "p.tar.xz", ["pkg/model.safetensors"])


def test_summary_reports_every_stage_and_the_skipped_variants(tools, tmp_path):
    work = tmp_path / "work"
    (work / "ckpt-bf16-mixed").mkdir(parents=True)
    (work / "variants" / "bnb-nf4").mkdir(parents=True)
    (work / "bench").mkdir()
    (work / "stages.tsv").write_text("train-bf16-mixed\tok\t0\t31\t\nexport-onnx-fp32\tfailed\t1\t12\tqserve export: "
                                     "error: boom\n", encoding="utf-8")
    (work / "skipped.tsv").write_text("onnx-fp32\tCUDA provider unavailable\n", encoding="utf-8")
    (work / "run.json").write_text(json.dumps({"dry": False, "device": "cuda", "budget_s": 480, "total_s": 300}))
    (work / "ckpt-bf16-mixed" / "train_metrics.json").write_text(json.dumps({
        "precision": "bf16-mixed", "train_time_s": 12.5, "step_time_median_s": 0.02, "samples_per_s": 640.0,
        "peak_memory_bytes": 3 * 2**30, "peak_allocated_bytes": 2**30, "val_accuracy": 0.88, "test_accuracy": 0.875,
        "peak_memory_kind": "torch.cuda.max_memory_reserved", "sizes": {"train": 8000}, "config": {"batch_size": 32}}))
    (work / "variants" / "bnb-nf4" / "manifest.json").write_text(json.dumps({
        "export_device": "cuda", "parity": {"max_abs_logit_diff": 0.3, "agreement": 1.0},
        "files": {"model.safetensors": {"bytes": 30_000_000}}}))
    (work / "bench" / "report.json").write_text(json.dumps({
        "config": {"device": "cuda", "batch_sizes": [1, 32], "seq_lens": [128]}, "headline": {"batch": 1, "seq": 128},
        "environment": {"gpu": "NVIDIA H200"},
        "variants": [{"name": "bnb-nf4", "status": "ok", "device": "cuda",
                      "fixed": [{"batch": 1, "seq": 128, "p50": 3.21, "throughput": 311.0},
                                {"batch": 32, "seq": 128, "p50": 9.5, "throughput": 3368.0}],
                      "accuracy": {"accuracy": 0.87}, "agreement": 0.99,
                      "memory": {"peak_rss_mb": 1500.0, "cuda": {"max_allocated_mb": 95.0, "max_reserved_mb": 128.0}}}]}))
    data = tools.summary(work, tmp_path / "out")
    assert data["skipped"] == {"onnx-fp32": "CUDA provider unavailable"}
    assert [s["status"] for s in data["stages"]] == ["ok", "failed"]
    md = (tmp_path / "out" / "summary.md").read_text(encoding="utf-8")
    assert "| export-onnx-fp32 | failed | 1 | 12 | qserve export: error: boom |" in md
    assert "| bf16-mixed | bf16-mixed | default | 12.5 | 0.0200 | 640 | 3072 | 1024 | 88.00% | 87.50% |" in md
    assert "| bnb-nf4 | ok | 3.21 | 9.50 | 311 | 3368 | 87.00% | 99.00% | 95 | 128 | 1500 |" in md
    assert "- onnx-fp32: CUDA provider unavailable" in md and "NVIDIA H200" in md
    assert json.loads((tmp_path / "out" / "gpu_check.json").read_text())["bench"]["variants"]["bnb-nf4"]["status"] == "ok"


@pytest.mark.parametrize("script", ["gpu_check.sh", "gpu_wheels.sh"])
def test_scripts_parse(script):
    subprocess.run(["bash", "-n", str(ROOT / "benchmarks" / script)], check=True)


def test_gpu_check_without_outdir_says_how_to_call_it():
    r = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh")], capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin"})
    assert r.returncode == 2 and "usage: OUT=DIR bash benchmarks/gpu_check.sh" in r.stderr
