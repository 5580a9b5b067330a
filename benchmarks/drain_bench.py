"""Nothing lost at shutdown: SIGTERM a fresh server under load, N times per kind, every request accounted for.

    python -m benchmarks.drain_bench models/minilm-l6-distilbert-imdb/variants/onnx-int8 --runs 20 \
        --out benchmarks/reports/drain

Kinds, interleaved run by run: the venv server, the serving image (qserve as PID 1; docker/build.sh serve first when
missing) and --workers 2, each with the default --drain-seconds. 32 keep-alive clients send until the server closes
their connection; 8 open a new connection per request until the drain period minus 1 s after the signal. The bar:
0 lost (any request without a response but a refused connect; resets count), the image's exit status 0 (a venv
server may end by the re-raised signal, as uvicorn does), every exit within the drain period plus 2 s.
"""

from __future__ import annotations

import argparse
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.harness import ROOT, Container, Server, code_env, finish, machine, reviews
from benchmarks.harness.drain import FRESH, KEEP_ALIVE, sigterm_under_load
from qserve.serve.infra.config import ServeConfig

KINDS = ("venv", "image", "workers")
CLOSED = re.compile(r"listener closed (\d+) us after its last accept, with (\d+) queued")
SLACK_S = 2.0
"""An exit is due within the drain period plus this."""


def _env() -> dict[str, str]:
    env = code_env(ROOT)
    env.pop("QSERVE_DRAIN_SECONDS", None)  # the default drain period, as a user runs it
    return env


def one_run(kind: str, variant: Path, image: str, texts: list[str], drain_s: float, logs: Path, i: int) -> dict:
    """Start a fresh `kind` server, SIGTERM it under load: what every request got, its exit, its drain lines."""
    flags = ["--threads", "1", "--log-level", "warning"]
    if kind == "image":
        box = Container(image, variant, *flags)
        try:
            box.wait_ready(300)
            got = sigterm_under_load(box.url, texts, box.signal, box.wait, drain_s)
            log = box.logs()
        finally:
            box.remove()
    else:
        more = ["--workers", "2"] if kind == "workers" else []
        srv = Server([str(variant), *flags, *more], ROOT, logs / f"{kind}-{i}.log", tag=kind, env=_env())
        srv.wait_ready(300)

        def wait(timeout: float) -> int | None:
            try:
                return srv.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                return None

        try:
            got = sigterm_under_load(srv.url, texts, lambda: srv.proc.send_signal(signal.SIGTERM), wait, drain_s)
        finally:
            srv.stop()
        log = Path(srv.logf.name).read_text(errors="replace")
    closes = [(int(a), int(b)) for a, b in CLOSED.findall(log)]
    return {
        **got,
        "kind": kind,
        "window_us": max((a for a, _ in closes), default=None),
        "queued": sum(b for _, b in closes),
    }


def ok(run: dict) -> bool:
    code_ok = run["exit_code"] == 0 or (run["kind"] != "image" and run["exit_code"] == -signal.SIGTERM)
    return not run["lost"] and code_ok and run["exit_s"] <= run["drain_s"] + SLACK_S


def run(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    drain_s = ServeConfig().drain_seconds
    if (
        "image" in args.kinds
        and subprocess.run(["docker", "image", "inspect", args.image], capture_output=True).returncode
    ):
        subprocess.run(
            [str(ROOT / "docker" / "build.sh"), "serve"],
            cwd=ROOT,
            check=True,
            env={**_env(), "IMAGE": args.image.split(":")[0]},
        )
    variant = Path(args.variant).resolve()
    subprocess.run(["chmod", "-R", "a+rX", str(variant)], check=True)  # the container's user reads the mount
    texts = reviews(64)
    logs = args.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    runs = []
    for i in range(args.runs):
        for kind in args.kinds:  # interleaved: a slow phase of the machine falls on every kind alike
            r = {**one_run(kind, variant, args.image, texts, drain_s, logs, i), "drain_s": drain_s}
            r["ok"] = ok(r)
            print(
                f"{kind} #{i + 1}: {r['answered']} answered, {len(r['lost'])} lost, exit {r['exit_code']} "
                f"after {r['exit_s']:.2f} s",
                flush=True,
            )
            runs.append(r)
    return {
        "variant": str(variant.resolve().relative_to(ROOT)) if variant.resolve().is_relative_to(ROOT) else str(variant),
        "machine": machine(),
        "drain_s": drain_s,
        "keep_alive": KEEP_ALIVE,
        "fresh": FRESH,
        "runs": runs,
        "command": " ".join(["python -m benchmarks.drain_bench", *argv]),
    }


def render(rep: dict) -> str:
    rows, lost = [], 0
    for kind in dict.fromkeys(r["kind"] for r in rep["runs"]):
        rs = [r for r in rep["runs"] if r["kind"] == kind]
        lost += sum(len(r["lost"]) for r in rs)
        unready = [r["unready_ms"] for r in rs if r["unready_ms"] is not None]
        rows.append(
            f"| {kind} | {len(rs)} | {sum(r['answered'] for r in rs):,} | {sum(r['after_signal'] for r in rs):,} | "
            f"{sum(len(r['lost']) for r in rs)} | {sum(r['refused'] for r in rs)} | "
            f"{', '.join(sorted({str(r['exit_code']) for r in rs}))} | {max(r['exit_s'] for r in rs):.2f} | "
            f"{max(unready):.0f} | {max((r['window_us'] or 0) for r in rs)} | {sum(r['queued'] for r in rs)} |"
        )
    passed = sum(r["ok"] for r in rep["runs"])
    head = (
        f"{lost} requests lost in {len(rep['runs'])} SIGTERMs under load ({passed} of {len(rep['runs'])} met the bar: "
        f"0 lost, exit status, exit within {rep['drain_s']:g} + {SLACK_S:g} s), drain period {rep['drain_s']:g} s."
    )
    lines = [
        head,
        "",
        "| server | SIGTERMs | answered | after the signal | lost | refused connects | exit status | slowest exit s "
        "| /ready 503 after ms (max) | listener close after last accept us (max) | queued connections taken |",
        "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|",
        *rows,
        "",
        f"{rep['keep_alive']} keep-alive clients send until their connection is closed; {rep['fresh']} open a new "
        f"connection per request until {rep['drain_s'] - 1:g} s after the signal. Variant `{rep['variant']}`; "
        "one intra-op thread per server. A venv server ends by the re-raised SIGTERM (status -15) as uvicorn does; "
        "--workers' supervisor and the image (PID 1) exit 0.",
    ]
    bad = [
        f"- {r['kind']}: {r['lost'][:3]} exit {r['exit_code']} after {r['exit_s']:.2f} s"
        for r in rep["runs"]
        if not r["ok"]
    ]
    return "\n".join(lines + (["", "Runs that missed the bar:", *bad] if bad else [])) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m benchmarks.drain_bench", description=__doc__.split("\n")[0])
    p.add_argument("variant", help="a variant dir to serve (the main job's onnx-int8)")
    p.add_argument("--runs", type=int, default=20, help="SIGTERMs per kind")
    p.add_argument(
        "--kinds", type=lambda s: s.split(","), default=list(KINDS), help=f"comma-separated: {','.join(KINDS)}"
    )
    p.add_argument("--image", default="qserve:serve", help="the serving image (built by docker/build.sh when missing)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "reports" / "drain")
    args = p.parse_args(argv)
    bad = [k for k in args.kinds if k not in KINDS]
    if bad:
        p.error(f"--kinds {','.join(bad)}: choose from {','.join(KINDS)}")
    return finish("drain_bench", args, argv, run, render, lambda rep: not all(r["ok"] for r in rep["runs"]))


if __name__ == "__main__":
    sys.exit(main())
