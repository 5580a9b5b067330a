"""Re-run the committed reports, one stage at a time, on the CPU that measured them.

    make reports                                  # list the stages, their reports, CPUs and durations
    make reports STAGE=serve                      # re-run one stage (python -m benchmarks.render.rebuild serve)
    make reports STAGE=openvino FORCE=1           # on another CPU: only re-render its md from its own JSON

A stage runs its commands from the repository root, then re-renders the README's and docs' tables
(benchmarks/render/tables.py). Before running, it reads the CPU each of its committed reports records
(`provenance.cpu`, else the report's own environment block) and compares it with /proc/cpuinfo: a
report from another CPU is never regenerated here. The stage refuses, naming both CPUs; with FORCE=1
it re-renders each report's md from its JSON instead (where the script has a renderer) and measures
nothing. To replace a report with one from this machine on purpose, delete its directory first: a
stage whose reports are absent runs anywhere.

Durations are for 2 cores. The measured one comes from a report, never from a hand-typed string: a
pipeline's report.json records its stage times (`pipeline.stage_s`), and every stage this runs records
its wall time in benchmarks/reports/stage_times.json; stage_duration() renders it. What the time goes to,
and estimates (labelled so) for a stage never timed, are the stage's `duration` text. STAGE=all runs every
stage in order and skips, with the same message, those from another CPU.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from benchmarks.harness import ROOT, write_markdown
from benchmarks.render.stages import BY_NAME, STAGES, Stage  # the table; this module decides and runs
from qserve.files import write_json_atomic
from qserve.provenance import cpu_now, git_commit, recorded_cpu

STAGE_TIMES = "benchmarks/reports/stage_times.json"
"""Each stage's measured wall time, written after it runs here (plus backfilled ones, labelled so)."""


def cpu_here() -> str:
    return cpu_now()[0]


def recorded(stage: Stage, root: Path = ROOT) -> dict[str, str | None]:
    """{report json: the CPU it records} for the stage's reports that exist."""
    out = {}
    for r in stage.reports:
        p = root / r.json
        if p.is_file():
            out[r.json] = recorded_cpu(json.loads(p.read_text(encoding="utf-8")))
    return out


def stage_times(root: Path = ROOT) -> dict[str, dict[str, Any]]:
    p = root / STAGE_TIMES
    return json.loads(p.read_text(encoding="utf-8"))["stages"] if p.is_file() else {}


def record_time(name: str, seconds: float, cpu: str, root: Path = ROOT) -> None:
    """Keep the wall time of a stage that just ran here (the stages table renders it from this file)."""
    p = root / STAGE_TIMES
    data = json.loads(p.read_text(encoding="utf-8")) if p.is_file() else {"format": "qserve-stage-times/1"}
    data.setdefault("stages", {})[name] = {
        "minutes": round(seconds / 60, 2),
        "cpu": cpu,
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "source": "run",
    }
    write_json_atomic(p, data)


def stage_duration(stage: Stage, root: Path = ROOT) -> str:
    """How long the stage takes on 2 cores: measured (its pipeline report's own stage times, else its last run
    recorded in stage_times.json), then what the time goes to; "not measured" and the estimate otherwise."""
    measured = None
    for r in stage.reports:
        p = root / r.json
        stage_s = (
            (json.loads(p.read_text(encoding="utf-8")).get("pipeline") or {}).get("stage_s") or {}
            if p.is_file()
            else {}
        )
        if stage_s.get("total"):
            parts = ", ".join(f"{k} {v / 60:.1f}" for k, v in stage_s.items() if k != "total")
            measured = f"{stage_s['total'] / 60:.1f} min, the run's own stage times ({parts} min)"
            break
    rec = stage_times(root).get(stage.name)
    if measured is None and rec:
        when = "from its log, before runs were recorded" if rec.get("source") == "backfilled" else rec["when"][:10]
        measured = f"{rec['minutes']:.1f} min, measured on {rec.get('cpu') or 'an unrecorded CPU'} ({when})"
    if measured is None:
        return f"not measured: {stage.duration}" if stage.duration else "not measured"
    return f"{measured}: {stage.duration}" if stage.duration else measured


def plan(stage: Stage, here: str, force: bool, root: Path = ROOT) -> tuple[str, str]:
    """("run" | "rerender" | "refuse", why)."""
    other = {j: c for j, c in recorded(stage, root).items() if c and c != here}
    if not other:
        return "run", f"stage {stage.name}: its reports were measured on this CPU ({here}) or are absent"
    names = "; ".join(f"{j} on {c}" for j, c in other.items())
    if force:
        return "rerender", (
            f"stage {stage.name}: measured on another CPU ({names}); this is {here}. FORCE=1: "
            "re-rendering md from each report's JSON, measuring nothing"
        )
    return "refuse", (
        f"stage {stage.name} refused: its reports were measured on another CPU ({names}) and this "
        f"machine is {here}. A report is only regenerated on the CPU that measured it. FORCE=1 "
        "re-renders its md from its own JSON instead; to replace it with a report from this "
        "machine, delete the report's directory first."
    )


def _renderer(spec: str) -> Callable[[dict], str]:
    """ "module:function" (a qserve module, or a benchmarks module relative to the package, e.g.
    "studies.serve_windows:render") -> the function."""
    mod, fn = spec.split(":")
    return getattr(importlib.import_module(mod if mod.startswith("qserve.") else f"benchmarks.{mod}"), fn)


def rerender(stage: Stage, root: Path = ROOT) -> list[str]:
    """Re-write each report's md from its JSON (provenance header included); returns what it did, per report."""
    done = []
    for r in stage.reports:
        src = root / r.json
        if not src.is_file() or not r.md:
            continue
        if not r.render:
            done.append(f"{r.md}: kept (its script renders md only while measuring)")
            continue
        report = json.loads(src.read_text(encoding="utf-8"))
        write_markdown(root / r.md, _renderer(r.render)(report), report.get("provenance"))
        done.append(f"{r.md}: re-rendered from {r.json}")
    return done


def run_stage(stage: Stage, force: bool) -> int:
    here = cpu_here()
    action, why = plan(stage, here, force)
    print(why, flush=True)
    if action == "refuse":
        return 2
    if action == "rerender":
        for line in rerender(stage):
            print("  " + line)
    else:
        missing = [n for n in stage.needs if not (ROOT / n).exists()]
        if missing:
            print(
                f"stage {stage.name} needs {', '.join(missing)}: run `make reports STAGE=embedded-default` (or the "
                "stage that builds them, see `make reports`) on this machine first",
                file=sys.stderr,
            )
            return 2
        env = {
            **os.environ,
            "PY": sys.executable,
            "QSERVE": f"{sys.executable} -m qserve",
            "HF_HUB_OFFLINE": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        t0 = time.monotonic()
        for cmd in stage.commands:
            print(f"+ {cmd}", flush=True)
            rc = subprocess.run(["bash", "-c", f"set -eo pipefail; {cmd}"], cwd=ROOT, env=env).returncode
            if rc:
                print(f"stage {stage.name}: command failed (exit {rc}): {cmd}", file=sys.stderr)
                return rc
        seconds = time.monotonic() - t0
        record_time(stage.name, seconds, here)
        print(f"stage {stage.name} done in {seconds / 60:.1f} min (recorded in {STAGE_TIMES})")
    for note in stage.notes:
        print(f"note: {note}")
    return subprocess.run([sys.executable, "-m", "benchmarks.render.tables"], cwd=ROOT).returncode


def describe() -> str:
    here = cpu_here()
    lines = [f"Stages of `make reports STAGE=<name>` (this machine: {here}); STAGE=all runs them in order.", ""]
    for s in STAGES:
        cpus = sorted({c or "not recorded" for c in recorded(s).values()}) or ["no report yet"]
        lines += [
            f"{s.name}: {s.what}",
            f"    measured on: {', '.join(cpus)}",
            f"    duration on 2 cores: {stage_duration(s)}",
        ]
        lines += [f"    pending: {s.pending}"] if s.pending else []
        lines += [f"    note: {n}" for n in s.notes]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("stage", nargs="?", help=f"one of: {', '.join(BY_NAME)}, all (none: list them)")
    p.add_argument(
        "--force",
        action="store_true",
        help="on another CPU than the reports': re-render md from their JSON instead of refusing",
    )
    args = p.parse_args(argv)
    if not args.stage:
        print(describe())
        return 0
    if args.stage != "all" and args.stage not in BY_NAME:
        print(f"STAGE={args.stage!r} is not a stage; choose one of: {', '.join(BY_NAME)}, all", file=sys.stderr)
        return 2
    todo = list(STAGES) if args.stage == "all" else [BY_NAME[args.stage]]
    failed = [s.name for s in todo if run_stage(s, args.force)]
    if failed:
        print(f"stages not rebuilt: {', '.join(failed)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
