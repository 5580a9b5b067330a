"""One stage of the offline GPU check: its report kept as it goes, its verdict, its logs' tails; standard library only.

    python -m benchmarks.gpu.stage rehearse graphs /tmp/w/graphs --seconds 2 --steps 4   # a stage that only sleeps

benchmarks/gpu/check.sh runs each stage under a time limit. A stage writes NAME/report.json after every step
(StageReport), so one killed at its limit keeps what it finished; `verdict` then reads that report and the exit
status: ok, "ran, N targets missed" (it finished, a number missed its bar), timeout (which steps it kept) or failed
(in which step, and its log's last line). Also `preflight` (the interpreter has what the call needs, in seconds)
and `tails` (the last lines of every log in one file). Standard library only: each command starts in a fraction of
a second, before anyone knows torch imports.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any


class StageReport:
    """NAME/report.json of one stage, rewritten atomically at each step's start and end."""

    def __init__(self, out: Path, stage: str, **info: Any):
        self.path = out / "report.json"
        out.mkdir(parents=True, exist_ok=True)
        self.t0 = time.monotonic()
        self.data: dict[str, Any] = {"stage": stage, **info, "steps": [], "running": None, "checks": [], "done": False}
        self.save()

    def save(self) -> None:
        self.data["elapsed_s"] = round(time.monotonic() - self.t0, 3)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2, default=str), encoding="utf-8")
        os.replace(tmp, self.path)

    def start(self, step: str) -> None:
        self.data["running"] = step
        self.save()

    def done(self, step: str, **result: Any) -> None:
        self.data["steps"].append({"step": step, "at_s": round(time.monotonic() - self.t0, 3), **result})
        self.data["running"] = None
        self.save()

    def check(self, name: str, value: Any, op: str, bar: float | None) -> None:
        """A target: passed None where no bar applies (a dry run) or nothing was measured."""
        ok = None if bar is None or value is None else (value <= bar if op == "<=" else value >= bar)
        self.data["checks"].append(
            {"name": name, "value": value, "target": f"{op} {bar:g}" if bar is not None else "", "passed": ok}
        )
        self.save()

    def finish(self) -> int:
        """0 when every target held (or none applied), 1 when one was missed."""
        self.data["done"] = True
        self.save()
        return 1 if any(c["passed"] is False for c in self.data["checks"]) else 0


# -- rehearse: a stage that takes its estimated device time ---------------------------------------------------
def rehearse(name: str, out: Path, seconds: float, steps: int, since_ms: int | None = None) -> int:
    """`seconds` in `steps` equal sleeps, counted from `since_ms` (epoch ms: when the stage started, so its
    start-up counts) or from now."""
    rep = StageReport(out, name, rehearsal=True, seconds=seconds)
    start = since_ms / 1000 if since_ms else time.time()
    for i in range(steps):
        rep.start(f"step {i + 1}")
        time.sleep(max(0.0, start + seconds * (i + 1) / steps - time.time()))
        rep.done(f"step {i + 1}")
    return rep.finish()


# -- preflight: what the call needs imports, in seconds ---------------------------------------------------------
def preflight(out: Path, need: list[str], cuda: bool) -> int:
    """Import each of `need` (torch first when `cuda`, and ask it for a GPU); write out and say what is missing."""
    t0 = time.monotonic()
    found: dict[str, str] = {}
    missing: dict[str, str] = {}
    for mod in need:
        try:
            m = importlib.import_module(mod)
            found[mod] = str(getattr(m, "__version__", "")) or str(getattr(m, "__file__", ""))
        except Exception as e:  # noqa: BLE001 - whatever stops the import is the answer
            missing[mod] = f"{type(e).__name__}: {e}"[:300]
    if cuda:
        if "torch" in sys.modules:
            torch = sys.modules["torch"]
            if not torch.cuda.is_available():
                missing["torch.cuda"] = f"torch {torch.__version__} (CUDA build: {torch.version.cuda}) sees no GPU"
            else:
                found["torch.cuda"] = torch.cuda.get_device_name(0)
        else:
            missing.setdefault("torch", "not imported")
    rep = {
        "python": sys.executable,
        "version": sys.version.split()[0],
        "found": found,
        "missing": missing,
        "seconds": round(time.monotonic() - t0, 2),
    }
    out.write_text(json.dumps(rep, indent=2), encoding="utf-8")
    for mod, why in missing.items():
        print(f"preflight: missing {mod}: {why}", file=sys.stderr)
    print(f"preflight: {len(found)} found, {len(missing)} missing, {rep['seconds']} s")
    return 3 if missing else 0


# -- verdict: what stages.tsv says of a stage ---------------------------------------------------------------------
def _last(path: Path, n: int = 1) -> list[str]:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return []
    return lines[-n:]


def pipeline_steps(run: Path) -> list[str]:
    """What a (possibly killed) `qserve pipeline` left in its run dir, in order: each is kept and reused."""
    steps = []
    if (run / "checkpoint" / "train_metrics.json").is_file():
        steps.append("train")
    variants = sorted(p.parent.name for p in run.glob("variants/*/manifest.json"))
    if variants:
        steps.append(f"export ({len(variants)} variants: {', '.join(variants)})")
    if (run / "report" / "gate").is_dir():
        steps.append("gate")
    if (run / "report" / "report.json").is_file():
        steps.append("report")
    return steps


PIPELINE_TARGETS = {
    "training tokens/s": (">=", 640_000.0),
    "test accuracy": (">=", 0.915),
    "main job s": ("<=", 300.0),
    "recommended b1/s128 p50 ms": ("<=", 0.6),
    "recommended b32/s128 seq/s": (">=", 35_000.0),
}
"""The issue's bars for `qserve pipeline` with its defaults on the GPU (the seed's recipe, its speed, its time)."""


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def pipeline_checks(run: Path) -> list[dict[str, Any]]:
    """The GPU targets of the main job, from what its run dir holds (a bar not reached yet reads None)."""
    m = _json(run / "checkpoint" / "train_metrics.json") or {}
    rep = _json(run / "report" / "report.json") or {}
    length = (m.get("config") or {}).get("max_length")
    rec = (rep.get("recommended") or {}).get("variant")
    fixed = {
        (r.get("batch"), r.get("seq")): r
        for v in rep.get("variants") or []
        if v.get("name") == rec
        for r in v.get("fixed") or []
    }
    got = {
        "training tokens/s": m["samples_per_s"] * length if m.get("samples_per_s") and length else None,
        "test accuracy": m.get("test_accuracy"),
        "main job s": ((rep.get("pipeline") or {}).get("stage_s") or {}).get("total"),
        "recommended b1/s128 p50 ms": (fixed.get((1, 128)) or {}).get("p50"),
        "recommended b32/s128 seq/s": (fixed.get((32, 128)) or {}).get("throughput"),
    }
    out = []
    for name, (op, bar) in PIPELINE_TARGETS.items():
        v = got[name]
        ok = None if v is None else (v <= bar if op == "<=" else v >= bar)
        out.append({"name": name, "value": v, "target": f"{op} {bar:g}", "passed": ok})
    return out


def stage_state(
    work: Path, name: str, run: Path | None, targets: bool = False
) -> tuple[list[str], str | None, list[dict[str, Any]]]:
    """(finished steps, the step running when it ended, its checks) from what the stage left; `targets`: the
    pipeline is held to its GPU bars."""
    if name == "pipeline" and run is not None and pipeline_steps(run):
        return pipeline_steps(run), None, pipeline_checks(run) if targets else []
    for rel in ("report.json", "precision_study.json"):
        p = work / name / rel
        try:
            rep = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if "runs" in rep:  # the precision study: rewritten after each run
            return [str(r.get("label")) + ("" if r.get("ok") else " (failed)") for r in rep["runs"]], None, []
        steps = [str(s.get("step")) for s in rep.get("steps") or []]
        return steps, rep.get("running"), list(rep.get("checks") or [])
    return [], None, []


def verdict(
    work: Path, name: str, rc: int, limit: str, log: Path, run: Path | None, targets: bool = False
) -> tuple[str, str]:
    steps, running, checks = stage_state(work, name, run, targets)
    kept = f"kept: {', '.join(steps)}" if steps else "nothing kept"
    missed = [c for c in checks if c.get("passed") is False]
    said = "; ".join(f"{c['name']} {c['value']:.4g} (target {c['target']})" for c in missed)
    if rc in (124, 137):
        return "timeout", f"killed at its {limit} s limit" + (f" in {running}" if running else "") + f"; {kept}"
    if (rc == 0 or running is None) and missed:  # it ran to its end: a missed bar is a finding, not a crash
        return f"ran, {len(missed)} targets missed", said
    if rc == 0:
        return "ok", kept if steps else ""
    step = running or next((ln.strip() for ln in reversed(_last(log, 400)) if ln.lstrip().startswith("== [")), None)
    tail = (_last(log) or ["(empty log)"])[0]
    return "failed", f"exit {rc}" + (f" in {step}" if step else "") + f": {tail}"[:300] + f"; {kept}"


# -- tails: the last lines of every log, in one file --------------------------------------------------------------
def tails(work: Path, out: Path, lines: int) -> int:
    logs = sorted(p for p in work.rglob("*.log") if p.is_file())
    parts = []
    for p in logs:
        body = _last(p, lines)
        parts.append(f"==> {p.relative_to(work)} (last {len(body)} lines) <==\n" + "\n".join(body) + "\n")
    out.write_text("\n".join(parts) or "no logs\n", encoding="utf-8")
    return len(logs)


def runinfo(out: Path) -> None:
    """run.json: the call as check.sh ran it (its RUN_* variables), for the summary."""
    e = os.environ
    info = {
        "call": e.get("RUN_CALL"),
        "dry": e.get("RUN_DRY", "0") != "0",
        "mode": {
            "0": "GPU",
            "1": "dry: the same commands on the CPU, tiny sizes",
            "rehearse": "rehearsal: each stage sleeps its estimated GPU time",
        }.get(e.get("RUN_DRY", "0")),
        "device": e.get("RUN_DEVICE"),
        "budget_s": int(e.get("RUN_BUDGET", "0")) / 1000,
        "total_s": int(e.get("RUN_TOTAL", "0")) / 1000,
        "scale": float(e.get("RUN_SCALE", "1")),
        "model_note": e.get("RUN_MODEL_NOTE", ""),
        "loadtest_levels": e.get("RUN_LEVELS"),
        "loadtest_level_s": float(e.get("RUN_LEVEL_S", "0")),
    }
    out.write_text(json.dumps(info, indent=2), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks.gpu.stage", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("rehearse", help="a stage that sleeps its estimate in steps, its report kept as it goes")
    a.add_argument("name")
    a.add_argument("out", type=Path)
    a.add_argument("--seconds", type=float, required=True)
    a.add_argument("--steps", type=int, default=4)
    a.add_argument("--since-ms", type=int, help="epoch ms the stage started at (default: now)")
    a = sub.add_parser("preflight", help="import what the call needs; exit 3 naming what is missing")
    a.add_argument("out", type=Path)
    a.add_argument("--need", default="", help="comma-separated modules")
    a.add_argument("--cuda", action="store_true", help="torch must see a GPU")
    a = sub.add_parser("verdict", help="status<TAB>note of a stage that ended with exit status RC")
    a.add_argument("work", type=Path)
    a.add_argument("name")
    a.add_argument("rc", type=int)
    a.add_argument("limit")
    a.add_argument("log", type=Path)
    a.add_argument("--run", type=Path)
    a.add_argument("--targets", action="store_true", help="hold the pipeline to its GPU bars")
    a = sub.add_parser("tails", help="the last lines of every *.log under WORK, in one file")
    a.add_argument("work", type=Path)
    a.add_argument("out", type=Path)
    a.add_argument("--lines", type=int, default=40)
    a = sub.add_parser("runinfo", help="run.json from check.sh's RUN_* variables")
    a.add_argument("out", type=Path)
    args = p.parse_args(argv)
    if args.cmd == "runinfo":
        runinfo(args.out)
        return 0
    if args.cmd == "rehearse":
        return rehearse(args.name, args.out, args.seconds, args.steps, args.since_ms)
    if args.cmd == "preflight":
        return preflight(args.out, [m for m in args.need.split(",") if m], args.cuda)
    if args.cmd == "verdict":
        status, note = verdict(args.work, args.name, args.rc, args.limit, args.log, args.run, args.targets)
        print(f"{status}\t{note}".replace("\n", " ").replace("|", "/"))
        return 0
    print(f"{tails(args.work, args.out, args.lines)} logs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
