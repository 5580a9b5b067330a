"""Where a report came from: the command, the commit and the CPU that produced it.

    python -c "from qserve.provenance import provenance, md_line; print(md_line(provenance()))"

Every committed report records this block in its JSON (`"provenance"`) and as the first line
under its md title, so a number can be traced to a command and a machine, and `make reports`
can refuse to regenerate a report on a CPU other than the one that measured it.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path
from typing import TypedDict

from qserve.devices import cpu_info
from qserve.files import repository_root

REPO = repository_root()


class Provenance(TypedDict, total=False):
    command: str
    commit: str
    cpu: str
    amx: bool
    note: str


def command_line(argv: list[str] | None = None) -> str:
    """The command as a user would retype it: `qserve ...`, `python -m benchmarks.x ...` (a benchmark runs as a
    module of its package, a suite with parts as its own package) or `python path/to/script.py ...`."""
    argv = list(sys.argv if argv is None else argv)
    if not argv:
        return "unknown"
    prog = argv[0]
    p = Path(prog)
    if p.name in ("qserve", "__main__.py") and (p.name == "qserve" or p.parent.name == "qserve"):
        head = ["qserve"]
    elif p.suffix == ".py":
        try:
            rel = p.resolve().relative_to(REPO)
        except ValueError:
            rel = p
        if not rel.is_absolute() and rel.parts[0] == "benchmarks":
            head = ["python", "-m", ".".join(rel.with_suffix("").parts).removesuffix(".__main__")]
        else:
            head = ["python", str(rel)]
    else:
        head = [prog]
    return " ".join(shlex.quote(a) for a in head + argv[1:])


def git_commit(repo: Path = REPO) -> str:
    """`git rev-parse HEAD` of the checkout the code runs from, or "unknown" outside git."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    sha = out.stdout.strip()
    return sha if out.returncode == 0 and sha else "unknown"


def cpu_now() -> tuple[str, bool]:
    """(CPU model name, has AMX) from /proc/cpuinfo."""
    info = cpu_info()
    return info.get("model", "unknown"), any(f.startswith("amx") for f in info.get("flags", []))


def provenance(argv: list[str] | None = None) -> Provenance:
    """The block a report stores under "provenance"."""
    cpu, amx = cpu_now()
    return {"command": command_line(argv), "commit": git_commit(), "cpu": cpu, "amx": amx}


def md_line(prov: Provenance | None) -> str:
    """One markdown line for the report's header (empty when the report has no provenance)."""
    if not prov:
        return ""
    line = (
        f"Produced by `{prov.get('command', 'unknown')}` at commit `{prov.get('commit', 'unknown')}` "
        f"on {prov.get('cpu', 'unknown')}, AMX {'yes' if prov.get('amx') else 'no'}."
    )
    return line + (f" {prov['note']}" if prov.get("note") else "")


def with_header(md: str, prov: Provenance | None) -> str:
    """md with the provenance line after its first `# ` title (or on top when it has none)."""
    line = md_line(prov)
    if not line or line in md:  # idempotent: re-rendering a report never stacks headers
        return md
    lines = md.split("\n")
    for i, text in enumerate(lines):
        if text.startswith("# "):
            return "\n".join(lines[: i + 1] + ["", line] + lines[i + 1 :])
    return "\n".join([line, ""] + lines)


def recorded_cpu(report: dict) -> str | None:
    """The CPU model a report says it was measured on, whatever layout its script used."""
    prov = report.get("provenance")
    if isinstance(prov, dict) and prov.get("cpu"):
        return str(prov["cpu"])
    for holder in (report.get("environment"), report):
        cpu = holder.get("cpu") if isinstance(holder, dict) else None
        if isinstance(cpu, dict) and cpu.get("model"):
            return str(cpu["model"])
        if isinstance(cpu, str) and cpu:
            # cpu_label() strings: "<model>, AMX (...)" / "<model>, no AMX"
            return cpu.rsplit(", AMX", 1)[0].rsplit(", no AMX", 1)[0]
    machine = report.get("machine")
    if isinstance(machine, dict) and isinstance(machine.get("cpu"), str):
        return machine["cpu"]
    results = report.get("results")  # `qserve gate --out`: each verdict names its machine
    if isinstance(results, list) and results and isinstance(results[0], dict):
        machine = (results[0].get("gate") or {}).get("machine")
        if isinstance(machine, dict) and isinstance(machine.get("cpu"), str):
            return machine["cpu"]
    return None
