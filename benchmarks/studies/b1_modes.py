"""Is b1 latency bimodal across processes, and which runtime setting decides the mode?

    python -m benchmarks.studies.b1_modes models/x/variants/onnx-int8 models/x/variants/onnx-fp32 \\
        models/x/variants/ov-int8 --procs 20 --out benchmarks/reports/b1-modes

Every process is fresh: it loads one variant with load_runtime (as the bench's child and the server do), times
`--calls` forwards of one b1 x s128 batch of real token ids (qserve.bench.realtext.synthetic_batch) after a
warm-up, and reports their median. Settings change one thing each against qserve's own (`qserve`): ONNX
Runtime's spinning, its intra-op threads, where its threads run (pinned), address-space randomisation. The
processes of all (variant, setting) cells take turns, round after round, so a slow phase of the machine falls
on every cell alike; the report histograms the per-process medians of each cell and counts how many processes
landed in the slow mode (above 1.4x the fastest process of that variant), and whether each process got the CPU
its threads use while it was timed (its CPU seconds per wall second, its involuntary context switches).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import ROOT, code_env, finish, in_turn, reviews, spawn, write_report
from qserve.bench.realtext import synthetic_batch
from qserve.devices import cpu_info
from qserve.files import now_iso
from qserve.runtime import RuntimeOptions, load_runtime, onnx_rt

ONNX_ONLY = {
    "spin=off": "intra-op threads sleep between parallel sections (session.intra_op.allow_spinning 0)",
    "spin=no-stop": "spinning kept after run() returns (no session.force_spinning_stop)",
    "threads=1": "one intra-op thread: the whole forward on the calling thread",
    "pinned": "the caller on CPU 0 and the intra-op worker on CPU 1 (session.intra_op_thread_affinities)",
}
SETTINGS = {
    "qserve": "as qserve loads it (the bench's child, the server)",
    **ONNX_ONLY,
    "no-aslr": "as qserve loads it, address-space randomisation off (setarch -R): the same memory placement "
    "in every process",
}


def apply(setting: str) -> dict[str, Any]:
    """In the child, before loading: the RuntimeOptions keywords for `setting`, and ORT's session config changed."""
    entries: dict[str, str] = {}
    if setting == "spin=off":
        entries["session.intra_op.allow_spinning"] = "0"
    elif setting == "spin=no-stop":
        entries["session.force_spinning_stop"] = "0"
    elif setting == "pinned":
        entries["session.intra_op_thread_affinities"] = "2"  # 1-based logical processors, one per worker thread
    if entries:
        base = onnx_rt.session_options

        def patched(ort, threads):
            so = base(ort, threads)
            for k, v in entries.items():
                so.add_session_config_entry(k, v)
            return so

        onnx_rt.session_options = patched
    return {"threads": 1} if setting == "threads=1" else {}


def child(variant: str, setting: str, calls: int, warmup: int) -> dict[str, Any]:
    """One process's median b1 x s128 latency (ms) of `variant` under `setting`."""
    kw = apply(setting)
    if setting == "pinned":
        os.sched_setaffinity(0, {0})  # this thread only; the pool's worker is placed by ORT
    t0 = time.perf_counter()
    rt = load_runtime(variant, "cpu", RuntimeOptions(**kw))
    load_s = time.perf_counter() - t0
    batch = synthetic_batch(rt, 1, 128, " ".join(reviews(4)))
    for _ in range(warmup):
        rt.run(batch)
    ms = []
    before, pressure0 = switches(), cpu_pressure()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(calls):
        t = time.perf_counter()
        rt.run(batch)
        ms.append((time.perf_counter() - t) * 1e3)
    cpu_s, wall_s = time.process_time() - cpu0, time.perf_counter() - wall0
    after = switches()
    a = np.asarray(ms)
    return {
        # CPU seconds per wall second over the timed calls: about 2 when both intra-op threads ran (spinning
        # included), about 1 or less when the process got one CPU's worth of the machine
        "cpu_per_wall": round(cpu_s / wall_s, 3),
        "involuntary_switches_per_call": round((after[1] - before[1]) / calls, 2),
        "voluntary_switches_per_call": round((after[0] - before[0]) / calls, 2),
        "cpu_pressure_avg10": [pressure0, cpu_pressure()],
        "p50": float(np.median(a)),
        "p10": float(np.percentile(a, 10)),
        "p90": float(np.percentile(a, 90)),
        "first_half_p50": float(np.median(a[: calls // 2])),
        "second_half_p50": float(np.median(a[calls // 2 :])),
        "load_s": load_s,
        "threads": len(os.listdir(f"/proc/{os.getpid()}/task")),
    }


def switches() -> tuple[int, int]:
    """(voluntary, involuntary) context switches of every thread of this process so far."""
    vol = inv = 0
    for task in Path("/proc/self/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if line.startswith("voluntary_ctxt_switches"):
                vol += int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches"):
                inv += int(line.split()[1])
    return vol, inv


def cpu_pressure() -> float | None:
    """The share of the last 10 s some runnable task waited for a CPU (/proc/pressure/cpu), in %."""
    try:
        return float(Path("/proc/pressure/cpu").read_text().split()[1].split("=")[1])
    except (OSError, IndexError, ValueError):
        return None


def one(variant: str, setting: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "benchmarks.studies.b1_modes", "--child", setting, variant]
    cmd += ["--calls", str(args.calls), "--warmup", str(args.warmup)]
    if setting == "no-aslr":
        cmd = ["setarch", os.uname().machine, "-R", *cmd]
    p = spawn(cmd, ROOT, code_env(ROOT), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = p.communicate(timeout=300)
    if p.returncode != 0:
        return {"error": err.strip().splitlines()[-1] if err.strip() else f"exit {p.returncode}"}
    return json.loads(out.strip().splitlines()[-1])


def cells(variants: list[str], settings: list[str], others: list[str]) -> list[tuple[str, str]]:
    """(variant, setting) pairs measured: `settings` on the first variant, `others` on the rest (the variants
    measured beside it for scale); ONNX-only settings on ONNX variants only."""
    out = []
    for i, v in enumerate(variants):
        onnx = (Path(v) / "model.onnx").is_file()
        out += [(v, s) for s in (settings if i == 0 else others) if onnx or s not in ONNX_ONLY]
    return out


def run(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    todo = cells(args.variants, args.settings.split(","), args.others.split(","))
    per: dict[str, list[dict[str, Any]]] = {f"{Path(v).name}|{s}": [] for v, s in todo}
    t0 = time.perf_counter()
    rep: dict[str, Any] = {}
    for rnd in range(args.procs):
        for v, s in in_turn(todo, rnd):
            r = one(v, s, args)
            per[f"{Path(v).name}|{s}"].append(r)
            print(f"round {rnd + 1}/{args.procs} {Path(v).name} {s}: {r.get('p50', r.get('error'))}", flush=True)
        rep = report(args, argv, per, rnd + 1, time.perf_counter() - t0)
        write_report(args.out, rep, render(rep), echo=False)  # every round: a run cut short keeps its rounds
    return rep


def report(
    args: argparse.Namespace, argv: list[str], per: dict[str, list[dict[str, Any]]], rounds: int, wall_s: float
) -> dict[str, Any]:
    info = cpu_info()
    cells_ = {k: summarize(k, rs, per) for k, rs in per.items()}
    return {
        "created": now_iso(),
        "cpu": info.get("model"),
        "cpu_class": args.cpu_class,
        "cores": os.cpu_count(),
        "conditions": args.conditions,
        "calls": args.calls,
        "warmup": args.warmup,
        "procs": rounds,
        "procs_asked": args.procs,
        "shape": {"batch": 1, "seq": 128},
        "settings": {s: SETTINGS[s] for s in dict.fromkeys(f"{args.settings},{args.others}".split(","))},
        "wall_s": round(wall_s, 1),
        "cells": cells_,
        "starved_vs_slow": starved_vs_slow(cells_),
        "slow_above": SLOW,
        "starved_below": STARVED,
        "argv": argv,
    }


SLOW = 1.4
"""A process is in the slow mode when its median is above this multiple of its variant's fastest process (any
setting): the issue's two modes sat about 1.7x apart."""


def summarize(key: str, rs: list[dict[str, Any]], per: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The cell's per-process medians, their spread, and how many fell in the variant's slow mode (SLOW)."""
    variant = key.split("|")[0]
    ok = [r for r in rs if "p50" in r]
    every = [r["p50"] for k, v in per.items() if k.split("|")[0] == variant for r in v if "p50" in r]
    mid = SLOW * min(every) if every else 0.0
    p50s = sorted(round(r["p50"], 3) for r in ok)
    return {
        "p50s": p50s,
        "median": statistics.median(p50s) if p50s else None,
        "min": p50s[0] if p50s else None,
        "max": p50s[-1] if p50s else None,
        "spread": round(p50s[-1] / p50s[0], 3) if p50s else None,
        "slow_mode_ms": round(mid, 3),
        "slow": sum(p > mid for p in p50s),
        "halves_disagree": sum(
            max(r["first_half_p50"], r["second_half_p50"]) / min(r["first_half_p50"], r["second_half_p50"]) > 1.3
            for r in ok
        ),
        "cpu_per_wall": sorted(r["cpu_per_wall"] for r in ok),
        "pressure": sorted(r["cpu_pressure_avg10"][0] for r in ok if r["cpu_pressure_avg10"][0] is not None),
        "errors": [r["error"] for r in rs if "error" in r],
        "runs": ok,
    }


STARVED = 0.6
"""A process is starved when its CPU seconds per wall second over the timed calls fall below this share of
its intra-op threads (2 here, 1 under threads=1): its threads waited for a CPU the machine gave to others."""


def starved_vs_slow(cells: dict[str, dict[str, Any]]) -> dict[str, int]:
    """Every process of every two-thread cell, counted by slow (SLOW) x starved (STARVED). threads=1 is left out:
    one thread is slower when fed, so its "slow" is its speed, not a mode."""
    out = {"slow_starved": 0, "slow_fed": 0, "fast_starved": 0, "fast_fed": 0}
    for key, c in cells.items():
        if key.endswith("|threads=1"):
            continue
        for r in c["runs"]:
            slow = "slow" if r["p50"] > c["slow_mode_ms"] else "fast"
            fed = "starved" if r["cpu_per_wall"] < STARVED * 2 else "fed"
            out[f"{slow}_{fed}"] += 1
    return out


def histogram(p50s: list[float], lo: float, hi: float, bins: int = 12) -> str:
    """The per-process medians as a row of counts over `bins` equal bins from lo to hi."""
    width = (hi - lo) / bins or 1.0
    counts = [0] * bins
    for p in p50s:
        counts[min(bins - 1, int((p - lo) / width))] += 1
    return " ".join(str(c) if c else "." for c in counts)


def render(rep: dict[str, Any]) -> str:
    L = [
        "# b1 x s128 latency per process: is it bimodal, and which setting decides the mode?",
        "",
        f"Created {rep['created']} on {rep['cpu']} ({rep['cpu_class']}), {rep['cores']} logical CPUs. "
        f"{rep['procs']} fresh processes per cell, the cells taking turns round after round; each process "
        f"times {rep['calls']} forwards after {rep['warmup']} warm-up calls and reports their median. "
        f"Conditions: {rep['conditions']}",
        "",
        "| variant | setting | processes | median of medians ms | min ms | max ms | max / min | slow mode (>) | "
        "in the slow mode | CPU s per wall s | histogram |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    by_variant: dict[str, list[float]] = {}
    for k, c in rep["cells"].items():
        by_variant.setdefault(k.split("|")[0], []).extend(c["p50s"])
    for k, c in rep["cells"].items():
        v, s = k.split("|")
        if not c["p50s"]:
            L.append(f"| {v} | {s} | 0 | – | – | – | – | – | – | – | {'; '.join(c['errors'])[:80]} |")
            continue
        lo, hi = min(by_variant[v]), max(by_variant[v])
        L.append(
            f"| {v} | {s} | {len(c['p50s'])} | {c['median']:.2f} | {c['min']:.2f} | {c['max']:.2f} | "
            f"{c['spread']:.2f}x | {c['slow_mode_ms']:.2f} | {c['slow']} | "
            f"{statistics.median(c['cpu_per_wall']):.2f} | `{histogram(c['p50s'], lo, hi)}` |"
        )
    L += [
        "",
        "Every process of the two-thread settings by mode and by whether it got the CPU its threads use (starved: "
        f"CPU s per wall s below {STARVED:g} x 2): "
        + ", ".join(f"{k.replace('_', ' and ')} {v}" for k, v in rep["starved_vs_slow"].items())
        + ".",
        "",
        "Histogram: the per-process medians of the cell in 12 equal bins from the variant's fastest process to "
        "its slowest (across settings). CPU s per wall s: the process's CPU time over the timed calls' wall "
        "time (median over its processes): near 2 when both intra-op threads ran, near 1 or below when the "
        "process got one CPU's worth of the machine. Settings:",
        "",
        *[f"- `{s}`: {why}" for s, why in rep["settings"].items()],
        "",
    ]
    return "\n".join(L)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("variants", nargs="+", help="variant dirs")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--rerender", action="store_true", help="re-summarize --out's report.json, measuring nothing")
    p.add_argument("--settings", default=",".join(SETTINGS), help=f"comma-separated, of {', '.join(SETTINGS)}")
    p.add_argument("--others", default="qserve", help="settings for the variants after the first")
    p.add_argument("--procs", type=int, default=20, help="fresh processes per (variant, setting)")
    p.add_argument("--calls", type=int, default=300, help="timed b1 forwards per process")
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--cpu-class", default="", help="how the report names the machine beside lscpu's model name")
    p.add_argument("--conditions", default="", help="what else ran on the machine, said in the report")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "reports" / "b1-modes")
    args = p.parse_args(argv)
    if args.rerender:  # the summaries and the md again from a run's own per-process records (report.json)
        old = json.loads((args.out / "report.json").read_text(encoding="utf-8"))
        per = {k: c["runs"] + [{"error": e} for e in c["errors"]] for k, c in old["cells"].items()}
        rep = {**old, **report(args, old["argv"], per, old["procs"], old["wall_s"])}
        rep.update({k: old[k] for k in ("created", "argv", "conditions", "cpu_class", "calls", "warmup", "settings")})
        rep["procs_asked"] = old.get("procs_asked", old["procs"])
        write_report(args.out, rep, render(rep))
        return 0
    if args.child:
        print(json.dumps(child(args.variants[0], args.child, args.calls, args.warmup)))
        return 0
    bad = [s for s in f"{args.settings},{args.others}".split(",") if s not in SETTINGS]
    if bad:
        p.error(f"--settings: {', '.join(bad)} unknown; allowed: {', '.join(SETTINGS)}")
    return finish("b1_modes", args, argv, run, render, lambda rep: False)


if __name__ == "__main__":
    raise SystemExit(main())
