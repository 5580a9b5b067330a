"""The images' report (docs/deploy.md): sizes, no torch in the serving image, container start to ready, the toolkit
image's train -> export -> bench of one variant, and the serving profile in a fresh venv.

    python -m benchmarks.image_report --variant models/run/variants/onnx-int8 --toolkit --venv /tmp/servevenv

Images from `make image` (IMAGE:serve, IMAGE:toolkit). Writes benchmarks/reports/image/report.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import httpx2

from benchmarks.harness import ROOT
from benchmarks.harness.report import write_report
from benchmarks.harness.server import free_port, spawn, wait_ready
from qserve.provenance import provenance

OUT = ROOT / "benchmarks" / "reports" / "image"
BARS = {"serve_image_mb": 600, "start_to_ready_s": 5.0}
HEAVY = ("torch", "bitsandbytes", "lightning_fabric", "optimum")


def _docker(*args: str, timeout: float = 3600) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=True, timeout=timeout).stdout


def image_size_mb(image: str) -> float:
    return int(_docker("image", "inspect", "-f", "{{.Size}}", image)) / 1e6


def heavy_in(image: str) -> list[str]:
    code = f"import importlib.util as u; print(','.join(m for m in {HEAVY!r} if u.find_spec(m)))"
    return [m for m in _docker("run", "--rm", "--entrypoint", "python", image, "-c", code).strip().split(",") if m]


def start_to_ready(image: str, variant: Path, threads: int) -> float:
    """Seconds from `docker run` (read-only root, non-root, the dir mounted read-only) to /ready answering 200."""
    name, port = f"qserve-ready-{uuid.uuid4().hex[:8]}", free_port()
    t0 = time.monotonic()
    _docker(
        "run",
        "-d",
        "--name",
        name,
        "--read-only",
        "--tmpfs",
        "/tmp",
        "-p",
        f"127.0.0.1:{port}:8000",
        "-v",
        f"{variant}:/models:ro",
        image,
        "serve",
        "--threads",
        str(threads),
        "--log-level",
        "warning",
    )
    try:
        wait_ready(f"http://127.0.0.1:{port}", timeout=120, tag=name)
        return time.monotonic() - t0
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)


def toolkit_run(image: str, max_samples: int) -> dict:
    """train (a short setting) -> export onnx-int8 -> bench it, each a `docker run` of the toolkit image."""
    work = Path(tempfile.mkdtemp(prefix="qserve-toolkit-"))
    work.chmod(0o777)  # the image's user writes the run dir
    run = ["docker", "run", "--rm", "--read-only", "--tmpfs", "/tmp", "-v", f"{work}:/work", "-w", "/work", image]
    steps = {
        "train": ["train", "--max-samples", str(max_samples), "--max-eval-samples", "200", "--out", "/work/run"],
        "export": ["export", "/work/run", "--variant", "onnx-int8", "--out", "/work/run/variants/onnx-int8"],
        "bench": [
            "bench",
            "/work/run/variants/onnx-int8",
            "--batch-sizes",
            "1,8",
            "--seq-lens",
            "128",
            "--time-budget",
            "1",
            "--no-floor",
            "--max-eval-samples",
            "200",
            "--out",
            "/work/run/bench",
        ],
    }
    out: dict = {"max_samples": max_samples, "steps": {}}
    for step, args in steps.items():
        t0 = time.monotonic()
        r = subprocess.run([*run, *args], capture_output=True, text=True, timeout=3600, check=False)
        out["steps"][step] = {"seconds": round(time.monotonic() - t0, 1), "exit": r.returncode, "argv": args}
        if r.returncode != 0:
            out["steps"][step]["tail"] = (r.stdout + r.stderr)[-2000:]
            break
    out["variant_dir"] = str(work / "run" / "variants" / "onnx-int8")
    out["ok"] = all(s["exit"] == 0 for s in out["steps"].values()) and len(out["steps"]) == len(steps)
    return out


def fresh_venv(venv: Path, variant: Path) -> dict:
    """A venv where `pip install 'qserve[serve]'` ran: what it holds, and that it serves `variant`."""
    pip = subprocess.run(
        [str(venv / "bin" / "pip"), "list", "--format=json"], capture_output=True, text=True, check=True
    )
    names = sorted(p["name"].lower() for p in json.loads(pip.stdout))
    port = free_port()
    cmd = [str(venv / "bin" / "qserve"), "serve", str(variant), "--threads", "1", "--port", str(port)]
    proc = spawn(cmd, Path(tempfile.gettempdir()), {"PATH": f"{venv}/bin:/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})
    try:
        wait_ready(f"http://127.0.0.1:{port}", proc, timeout=300, tag="fresh venv")
        r = httpx2.post(
            f"http://127.0.0.1:{port}/v1/classify", json={"inputs": "A wonderful film."}, timeout=30, trust_env=False
        )
        answer = r.json() if r.status_code == 200 else r.text
    finally:
        proc.terminate()
        proc.wait(60)
    return {
        "packages": len(names),
        "heavy_installed": [n for n in names if n.replace("-", "_") in HEAVY or n in ("lightning-fabric", "lightning")],
        "classify_status": r.status_code,
        "answer": answer,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--image", default="qserve", help="the images' name (IMAGE:serve, IMAGE:toolkit)")
    ap.add_argument("--variant", type=Path, help="an onnx-int8 dir for start-to-ready (default: the toolkit's)")
    ap.add_argument("--repeat", type=int, default=5, help="start-to-ready runs")
    ap.add_argument("--threads", type=int, default=2, help="the server's --threads")
    ap.add_argument("--toolkit", action="store_true", help="also run train -> export -> bench in IMAGE:toolkit")
    ap.add_argument("--max-samples", type=int, default=1000, help="the toolkit run's training samples")
    ap.add_argument("--venv", type=Path, help="a fresh venv where `pip install 'qserve[serve]'` ran")
    ap.add_argument("--note", default="", help="the conditions (other jobs on the machine ...)")
    a = ap.parse_args(argv)
    serve, toolkit = f"{a.image}:serve", f"{a.image}:toolkit"
    report: dict = {
        "provenance": dict(provenance(argv)),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "bars": BARS,
        "note": a.note,
        "docker": _docker("version", "-f", "{{.Server.Version}}").strip(),
    }
    report["serve_image"] = {
        "size_mb": round(image_size_mb(serve), 1),
        "heavy": heavy_in(serve),
        "labels": json.loads(_docker("image", "inspect", "-f", "{{json .Config.Labels}}", serve)),
        "base": _docker("image", "inspect", "-f", "{{.Config.Image}}", serve).strip() or None,
    }
    variant = a.variant
    if a.toolkit:
        report["toolkit_image"] = {"size_mb": round(image_size_mb(toolkit), 1)}
        report["toolkit_run"] = toolkit_run(toolkit, a.max_samples)
        variant = variant or Path(report["toolkit_run"]["variant_dir"])
    if variant is not None:
        subprocess.run(["chmod", "-R", "a+rX", str(variant)], check=True)
        times = [start_to_ready(serve, variant.resolve(), a.threads) for _ in range(a.repeat)]
        report["start_to_ready"] = {
            "seconds": [round(t, 2) for t in times],
            "median_s": round(statistics.median(times), 2),
            "max_s": round(max(times), 2),
            "threads": a.threads,
            "variant": json.loads((variant / "manifest.json").read_text()).get("variant") or variant.name,
        }
    if a.venv is not None and variant is not None:
        report["fresh_venv"] = fresh_venv(a.venv, variant.resolve())
    md = "\n".join(
        [
            "# Container images",
            "",
            "```json",
            json.dumps({k: v for k, v in report.items() if k != "provenance"}, indent=2),
            "```",
            "",
        ]
    )
    write_report(OUT, report, md, echo=False)
    if shutil.which("docker") is None:
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
