"""How a benchmark ends: report.json and the same numbers as markdown under a provenance header, exit status.

    python -c "from benchmarks.harness.report import machine; print(machine())"

Provenance (the command, the git commit, the CPU) is qserve.provenance's, so a benchmark's report names its
code and machine exactly as `qserve bench`'s does.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from qserve import QserveError
from qserve.devices import cpu_info
from qserve.files import write_json_atomic, write_text_atomic
from qserve.provenance import Provenance, provenance, with_header


def machine() -> dict[str, Any]:
    """The CPU as the serving reports' "machine" block names it: model, AMX and its flags, logical cores."""
    info = cpu_info()
    amx = sorted(f for f in info.get("flags", []) if f.startswith("amx"))
    return {"cpu": info.get("model", "unknown"), "amx": bool(amx), "amx_flags": amx, "cores": os.cpu_count()}


def write_report(
    out: Path, rep: dict[str, Any], md: str, stem: str = "report", md_name: str | None = None, echo: bool = True
) -> None:
    """`out`/STEM.json and `out`/MD_NAME (STEM.md unless named), atomically (`out` made if missing), the md under
    the provenance header; then the md on stdout (`echo`). Every benchmark writes its report here. A report that
    carries no provenance gets this run's: every committed number says which code and machine made it."""
    rep.setdefault("provenance", provenance())
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / f"{stem}.json", rep)
    write_markdown(out / (md_name or f"{stem}.md"), md, rep["provenance"])
    if echo:
        print(md)


def write_markdown(path: Path, md: str, prov: Provenance | None) -> None:
    """A report's markdown alone (re-rendered from its JSON), under the provenance header, atomically."""
    write_text_atomic(path, with_header(md, prov))


def finish(
    tag: str,
    args: argparse.Namespace,
    argv: list[str],
    run_fn: Callable[[argparse.Namespace, list[str]], dict],
    render_fn: Callable[[dict], str],
    failed: Callable[[dict], Any],
) -> int:
    """A benchmark's main after its flags: run it, write report.json and report.md under args.out
    (provenance header), print the md. Exit status 2 on a setup error, 1 when `failed(report)` says the run
    missed its bar, else 0."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        rep = run_fn(args, argv)
    except (QserveError, RuntimeError, subprocess.CalledProcessError) as e:
        print(f"{tag}: error: {e}", file=sys.stderr)
        return 2
    write_report(args.out, rep, render_fn(rep))
    return 1 if failed(rep) else 0
