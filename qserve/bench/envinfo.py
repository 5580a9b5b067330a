"""The environment block of a report: machine, threads, library versions, GPU.

    python -c "from qserve.bench.envinfo import environment; print(environment(2, 'cpu'))"

Collected in the parent without torch; the children add what only a loaded library can say, merged by the runner.
"""

from __future__ import annotations

import os
import platform
import sys
from typing import Any

import psutil

from qserve.devices import cpu_info
from qserve.variants import LIBRARIES, library_versions


def physical_cores() -> int:
    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


def environment(threads: int, device: str) -> dict[str, Any]:
    versions = library_versions((*LIBRARIES, "numpy", "psutil", "matplotlib"))
    env: dict[str, Any] = {"python": sys.version.split()[0], "platform": platform.platform(), "cpu": cpu_info()}
    env.update(physical_cores=physical_cores(), threads=threads, device=device, versions=versions, gpu=None)
    return {**env, "load_avg_start": load_avg()}


def load_avg() -> list[float] | None:
    """1/5/15-minute load averages: other work on the machine inflates p50/p99, so the report says."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return None


def merge_child_env(env: dict[str, Any], results: list[dict[str, Any]]) -> dict[str, Any]:
    """Fill in what the children saw: torch/ORT thread counts, GPU name."""
    seen: dict[str, Any] = {}
    for r in results:
        for k, v in (r.get("env") or {}).items():
            seen.setdefault(k, v)
    return {**env, "child": seen, "gpu": seen.get("gpu") or env.get("gpu")}
