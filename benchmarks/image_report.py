"""The images' report (docs/deploy.md): sizes, no torch in the serving image, container start to ready (phase by
phase, beside the same variant served from this venv), the toolkit image's train -> export -> bench of one variant,
and the serving profile in a fresh venv.

    echo -20 > /proc/$$/autogroup; python -m benchmarks.image_report --note 'nothing else running'

Images from `make image` (IMAGE:serve, IMAGE:toolkit). Without --variant an onnx-int8 dir is exported first from the
embedded encoder (an untrained head: the trained variant's graph and size). Each start is `docker run` of a
read-only, non-root container with the dir mounted read-only, /ready polled every 50 ms from outside; its phases
come from the server's own log lines (docker's timestamps): create and start, Python with its imports and the CLI,
the app and server start, the model load, the warm-up, the first /ready 200. One more start profiles the imports
(PYTHONPROFILEIMPORTTIME) and is not counted. The containers run at the CPU weight of nice -20 in their own group
(the autogroup line above reaches no container: docker puts them in a cgroup); other jobs on the machine still
slow docker itself. --toolkit and --venv are slower stages; a report keeps the ones not run this time from the
last report, saying when and at which commit they were measured. Writes benchmarks/reports/image/report.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import httpx2

import exporters
from benchmarks.harness import ROOT
from benchmarks.harness.report import write_report
from benchmarks.harness.server import code_env, free_port, spawn, wait_ready
from qserve.devices import cpu_label, usable_cores
from qserve.extras import TOOLKIT_ONLY
from qserve.modeling import default_model_dir
from qserve.provenance import provenance

OUT = ROOT / "benchmarks" / "reports" / "image"
BARS = {"serve_image_mb": 600, "start_to_ready_s": 5.0}
NICE_M20 = 88761
"""The CFS weight of nice -20: each container's CPU shares, its cgroup under the root (--cgroup-parent /) where the
autogroups' tasks are, so a start competes as `echo -20 > /proc/$$/autogroup` makes this process compete."""
POLL_S = 0.05
MARKS = {
    "python_imports_cli": re.compile(r"qserve\.serve: model \S+: "),  # run_serve: every import done, flags parsed
    "app_start": re.compile(r"Application startup complete"),  # uvicorn ran the lifespan: the load starts
    "model_load": re.compile(r"qserve\.serve: loaded \S+ from "),  # served_model.load_model
    "warm_up": re.compile(r"qserve\.serve: serving \S+ version"),  # state.py: warmed up, batching
}
"""The log line that ends each phase of a start (after create_start: `docker run` to the container's process)."""
PHASES = ("create_start", *MARKS, "first_ready")
CARRIED = ("toolkit_image", "toolkit_run", "toolkit_pipeline", "fresh_venv")
"""The slower stages: a report run without them keeps the last report's (measured then, there)."""


def _docker(*args: str, timeout: float = 3600) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=True, timeout=timeout).stdout


def image_size_mb(image: str) -> float:
    return int(_docker("image", "inspect", "-f", "{{.Size}}", image)) / 1e6


def bytecode(image: str) -> dict:
    """The .pyc files the image's venv carries (docker/precompile.py: what a serving start imports): count and MB."""
    sizes = _docker("run", "--rm", "--entrypoint", "find", image, "/opt/qserve", "-name", "*.pyc", "-printf", "%s\\n")
    got = [int(x) for x in sizes.split()]
    return {"files": len(got), "mb": round(sum(got) / 1e6, 1)}


def heavy_in(image: str) -> list[str]:
    code = f"import importlib.util as u; print(','.join(m for m in {TOOLKIT_ONLY!r} if u.find_spec(m)))"
    return [m for m in _docker("run", "--rm", "--entrypoint", "python", image, "-c", code).strip().split(",") if m]


def start_to_ready(image: str, variant: Path, threads: int, profile_imports: bool = False) -> dict:
    """One start: `docker run` (read-only root, non-root, the dir mounted read-only, CPU weight of nice -20) to the
    first /ready 200, and its phases (PHASES); profile_imports: with PYTHONPROFILEIMPORTTIME and PYTHONVERBOSE, the
    imports' seconds by package and the modules compiled from source at the start instead."""
    name, port = f"qserve-ready-{uuid.uuid4().hex[:8]}", free_port()
    cmd = ["run", "-d", "--name", name, "--read-only", "--tmpfs", "/tmp", "--cgroup-parent=/"]
    cmd += ["--cpu-shares", str(NICE_M20), "-p", f"127.0.0.1:{port}:8000", "-v", f"{variant}:/models:ro"]
    cmd += ["-e", "PYTHONPROFILEIMPORTTIME=1", "-e", "PYTHONVERBOSE=1"] if profile_imports else []
    cmd += [image, "serve", "--threads", str(threads), "--log-level", "info"]
    start = time.time()
    _docker(*cmd, timeout=120)
    try:
        ready = poll_ready(f"http://127.0.0.1:{port}", lambda: _running(name), name)
        started = _time(_docker("inspect", "-f", "{{.State.StartedAt}}", name))
        logs = subprocess.run(["docker", "logs", "-t", name], capture_output=True, text=True, check=True, timeout=60)
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)
    lines = sorted(
        (_time(stamp), text)
        for stamp, _, text in (line.partition(" ") for line in (logs.stdout + logs.stderr).splitlines())
    )
    if profile_imports:
        return import_profile([text for _, text in lines])
    return {"seconds": round(ready - start, 3), "phases": phases(start, started, lines, ready)}


def venv_start_to_ready(variant: Path, threads: int) -> dict:
    """One start of `python -m qserve serve` from this checkout and venv, as start_to_ready measures a container's
    (its log lines timed as they arrive; no container phase)."""
    port = free_port()
    cmd = [sys.executable, "-m", "qserve", "serve", str(variant), "--threads", str(threads), "--port", str(port)]
    start = time.time()
    proc = spawn(
        [*cmd, "--log-level", "info"],
        ROOT,
        code_env(ROOT),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[tuple[float, str]] = []

    def read() -> None:
        for line in proc.stderr or ():
            lines.append((time.time(), line))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        ready = poll_ready(f"http://127.0.0.1:{port}", lambda: proc.poll() is None, "venv server")
    finally:
        proc.terminate()
        proc.wait(60)
        reader.join(10)
    return {"seconds": round(ready - start, 3), "phases": phases(start, start, lines, ready)}


def poll_ready(url: str, alive: Callable[[], bool], tag: str, timeout: float = 180.0) -> float:
    """The time /ready first answers 200, polled every POLL_S; fails at once when `alive()` turns false."""
    deadline, polls = time.monotonic() + timeout, 0
    while True:
        try:
            if httpx2.get(f"{url}/ready", timeout=2, trust_env=False).status_code == 200:
                return time.time()
        except httpx2.TransportError:
            pass
        polls += 1
        if (polls % 20 == 0 and not alive()) or time.monotonic() > deadline:
            raise RuntimeError(f"{tag} at {url} exited or was not ready after {timeout:.0f} s")
        time.sleep(POLL_S)


def phases(start: float, started: float, lines: list[tuple[float, str]], ready: float) -> dict[str, float]:
    """Seconds of each of PHASES in one start, from the times of the log lines (MARKS) that end them."""
    marks: dict[str, float] = {}
    for t, text in lines:
        for key, pattern in MARKS.items():
            if key not in marks and pattern.search(text):
                marks[key] = t
    missing = [key for key in MARKS if key not in marks]
    if missing:
        raise RuntimeError(f"no log line ends phase {', '.join(missing)}: {[text for _, text in lines][-20:]}")
    out, last = {"create_start": started - start}, started
    for key in MARKS:
        out[key], last = marks[key] - last, marks[key]
    out["first_ready"] = ready - last
    return {k: round(v, 3) for k, v in out.items()}


def import_profile(lines: list[str]) -> dict:
    """PYTHONPROFILEIMPORTTIME's lines: every import's own seconds, summed, and by top-level package; PYTHONVERBOSE's:
    the modules compiled from source (no .pyc in the image) during the start."""
    own: dict[str, float] = {}
    compiled = [m.group(1) for m in (re.match(r"# code object from (/\S+\.py)$", t.strip()) for t in lines) if m]
    for text in lines:
        m = re.match(r"import time:\s+(\d+) \|\s+\d+ \|\s*(\S+)", text)
        if m:
            top = m.group(2).split(".")[0]
            own[top] = own.get(top, 0.0) + int(m.group(1)) / 1e6
    top = dict(sorted(own.items(), key=lambda kv: -kv[1])[:12])
    return {
        "total_s": round(sum(own.values()), 3),
        "by_package_s": {k: round(v, 3) for k, v in top.items()},
        "compiled_at_start": len(compiled),
        "compiled_at_start_first": compiled[:20],
    }


def summary(starts: list[dict]) -> dict:
    """Median and spread of the starts, the median of each phase."""
    times = [s["seconds"] for s in starts]
    return {
        "median_s": round(statistics.median(times), 2),
        "min_s": round(min(times), 2),
        "max_s": round(max(times), 2),
        "seconds": times,
        "phases_median_s": {k: round(statistics.median(s["phases"][k] for s in starts), 3) for k in PHASES},
        "starts": starts,
    }


def _running(name: str) -> bool:
    r = subprocess.run(["docker", "inspect", "-f", "{{.State.Running}}", name], capture_output=True, text=True)
    return r.stdout.strip() == "true"


def _time(stamp: str) -> float:
    """Docker's RFC 3339 time (nanoseconds, Z) as a Unix time."""
    stamp = stamp.strip()
    head, _, frac = stamp.rstrip("Z").partition(".")
    return datetime.fromisoformat(head + "+00:00").timestamp() + float(f"0.{frac or 0}")


def export_variant(out: Path) -> Path:
    """onnx-int8 of the embedded encoder with an untrained head: the trained variant's graph and size."""
    exporters.export(default_model_dir(), "onnx-int8", out)
    return out


def toolkit_docker(image: str, work: Path) -> list[str]:
    """`docker run` of the toolkit image: read-only root, non-root, `work` its writable /work, nice -20's weight."""
    run = ["docker", "run", "--rm", "--read-only", "--tmpfs", "/tmp", "--cgroup-parent=/", "--cpu-shares"]
    return [*run, str(NICE_M20), "-v", f"{work}:/work", "-w", "/work", image]


def toolkit_run(image: str, max_samples: int) -> dict:
    """train (a short setting) -> export onnx-int8 -> bench it, each a `docker run` of the toolkit image."""
    work = Path(tempfile.mkdtemp(prefix="qserve-toolkit-"))
    work.chmod(0o777)  # the image's user writes the run dir
    run = toolkit_docker(image, work)
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


def toolkit_pipeline(image: str, max_samples: int) -> dict:
    """`qserve pipeline` in the toolkit image on the embedded default, its smallest real run: train (a few steps)
    -> export onnx-int8 -> bench -> report, one `docker run` (read-only root, non-root, a writable run dir)."""
    work = Path(tempfile.mkdtemp(prefix="qserve-pipeline-"))
    work.chmod(0o777)  # the image's user writes the run dir
    args = ["pipeline", "--run-dir", "/work/run", "--max-samples", str(max_samples), "--max-eval-samples", "100"]
    args += ["--max-length", "64", "--variants", "onnx-int8", "--bench-eval-samples", "100", "--batch-sizes", "1,8"]
    args += ["--seq-lens", "64", "--time-budget", "1", "--threads", "2"]
    run = toolkit_docker(image, work)
    start = time.monotonic()
    r = subprocess.run([*run, *args], capture_output=True, text=True, timeout=3600, check=False)
    out: dict = {"seconds": round(time.monotonic() - start, 1), "exit": r.returncode, "argv": args}
    report = work / "run" / "report"
    out["report_files"] = sorted(f.name for f in report.iterdir()) if report.is_dir() else []
    out["ok"] = r.returncode == 0 and "report.json" in out["report_files"]
    if not out["ok"]:
        out["tail"] = (r.stdout + r.stderr)[-2000:]
    shutil.rmtree(work, ignore_errors=True)
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
        "heavy_installed": [n for n in names if n.replace("-", "_") in TOOLKIT_ONLY or n == "lightning"],
        "classify_status": r.status_code,
        "answer": answer,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--image", default="qserve", help="the images' name (IMAGE:serve, IMAGE:toolkit)")
    ap.add_argument(
        "--variant", type=Path, help="an onnx-int8 dir for start to ready (default: the toolkit run's, else exported)"
    )
    ap.add_argument("--repeat", type=int, default=5, help="container starts (at least 5 for the report's median)")
    ap.add_argument("--venv-repeat", type=int, default=5, help="starts of the same dir from this venv, interleaved")
    ap.add_argument("--threads", type=int, default=2, help="the server's --threads")
    ap.add_argument("--toolkit", action="store_true", help="also run train -> export -> bench in IMAGE:toolkit")
    ap.add_argument("--max-samples", type=int, default=1000, help="the toolkit run's training samples")
    ap.add_argument(
        "--pipeline", action="store_true", help="also run `qserve pipeline` (onnx-int8, a few steps) in IMAGE:toolkit"
    )
    ap.add_argument("--pipeline-samples", type=int, default=200, help="the pipeline run's training samples")
    ap.add_argument("--venv", type=Path, help="a fresh venv where `pip install 'qserve[serve]'` ran")
    ap.add_argument("--note", default="", help="the conditions (other jobs on the machine ...)")
    a = ap.parse_args(argv)
    serve, toolkit = f"{a.image}:serve", f"{a.image}:toolkit"
    report: dict = {
        "provenance": dict(provenance(argv)),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "bars": BARS,
        "note": a.note,
        "machine": machine(),
        "docker": _docker("version", "-f", "{{.Server.Version}}").strip(),
    }
    report["serve_image"] = {
        "size_mb": round(image_size_mb(serve), 1),
        "heavy": heavy_in(serve),
        "heavy_checked": list(TOOLKIT_ONLY),
        "bytecode": bytecode(serve),
        "labels": json.loads(_docker("image", "inspect", "-f", "{{json .Config.Labels}}", serve)),
        "base": _docker("image", "inspect", "-f", "{{.Config.Image}}", serve).strip() or None,
    }
    variant = a.variant
    if a.toolkit:
        report["toolkit_image"] = {"size_mb": round(image_size_mb(toolkit), 1)}
        report["toolkit_run"] = toolkit_run(toolkit, a.max_samples)
        variant = variant or Path(report["toolkit_run"]["variant_dir"])
    if a.pipeline:
        report["toolkit_image"] = {"size_mb": round(image_size_mb(toolkit), 1)}
        report["toolkit_pipeline"] = toolkit_pipeline(toolkit, a.pipeline_samples)
    with tempfile.TemporaryDirectory(prefix="qserve-image-") as tmp:
        if variant is None:
            variant = export_variant(Path(tmp) / "onnx-int8")
        variant = variant.resolve()
        subprocess.run(["chmod", "-R", "a+rX", str(variant)], check=True)
        name = json.loads((variant / "manifest.json").read_text())["spec"]["name"]
        box: list[dict] = []
        venv: list[dict] = []
        for i in range(max(a.repeat, a.venv_repeat)):  # interleaved: a change in the machine's load hits both
            if i < a.repeat:
                box.append(start_to_ready(serve, variant, a.threads))
            if i < a.venv_repeat:
                venv.append(venv_start_to_ready(variant, a.threads))
        if box:
            report["start_to_ready"] = {
                "variant": name,
                "threads": a.threads,
                "polled_every_s": POLL_S,
                "cpu_weight": f"nice -20 (--cgroup-parent / --cpu-shares {NICE_M20})",
                **summary(box),
                "imports": start_to_ready(serve, variant, a.threads, profile_imports=True),
            }
        if venv:
            report["venv_start_to_ready"] = {"variant": name, "threads": a.threads, **summary(venv)}
        if a.venv is not None:
            report["fresh_venv"] = fresh_venv(a.venv, variant)
    report["machine"]["load_average_after"] = list(os.getloadavg())
    carry(report, OUT / "report.json")
    write_report(OUT, report, render(report), echo=False)
    return 0


def machine() -> dict:
    """The CPU (qserve.devices), the load when the run starts and this process's autogroup (its CPU weight)."""
    try:
        autogroup = Path("/proc/self/autogroup").read_text().strip()
    except OSError:
        autogroup = None
    return {
        "cpu": cpu_label(),
        "cores": usable_cores(),
        "load_average_before": list(os.getloadavg()),
        "autogroup": autogroup,
    }


def carry(report: dict, last: Path) -> None:
    """The slower stages (CARRIED) this run skipped, from the last report, stamped with when and where they ran."""
    if not last.is_file():
        return
    old = json.loads(last.read_text())
    for key in CARRIED:
        if key not in report and key in old:
            stamp = old[key].get("measured") or {"created": old["created"], "commit": old["provenance"]["commit"]}
            report[key] = {**old[key], "measured": stamp}


def render(report: dict) -> str:
    """The report's markdown: start to ready phase by phase (container and venv), then the rest as JSON."""
    out = ["# Container images", ""]
    if report.get("note"):
        out += [f"Conditions: {report['note']}", ""]
    m = report["machine"]
    out += [
        f"{m['cpu']}, {m['cores']} cores; load average {m['load_average_before'][0]:.2f} before, "
        f"{m['load_average_after'][0]:.2f} after; this process {m['autogroup']}.",
        "",
    ]
    runs = [(k, report[k]) for k in ("start_to_ready", "venv_start_to_ready") if k in report]
    if runs:
        out += ["| phase (median s) | " + " | ".join(k for k, _ in runs) + " |", "|---" * (len(runs) + 1) + "|"]
        for phase in PHASES:
            out.append(f"| {phase} | " + " | ".join(f"{r['phases_median_s'][phase]:.2f}" for _, r in runs) + " |")
        out.append("| **start to ready, median** | " + " | ".join(f"**{r['median_s']:.2f}**" for _, r in runs) + " |")
        out.append("| min - max | " + " | ".join(f"{r['min_s']:.2f} - {r['max_s']:.2f}" for _, r in runs) + " |")
        out += [""]
    rest = {k: v for k, v in report.items() if k != "provenance"}
    return "\n".join([*out, "```json", json.dumps(rest, indent=2), "```", ""])


if __name__ == "__main__":
    raise SystemExit(main())
