"""The pipeline's stage times (train, export, bench, gate, total), printed at its end and kept in its report.

    qserve pipeline      # ends with "stage times: train <s>s, export <s>s, bench <s>s, gate <s>s, total <m> min"

report.json gets {"pipeline": {"stage_s": {...}}} from the run that measured the report (a re-run that
reuses the whole report leaves it, and its bytes, as they are), and report.md a "Pipeline stages" table.
"""

from __future__ import annotations

import json
from pathlib import Path

from qserve.bench.report import write_reports

STAGES = ("train", "export", "bench", "gate", "repair", "total")


def line(times: dict[str, float]) -> str:
    parts = [f"{k} {times[k]:.0f}s" for k in STAGES[:-1] if k in times]
    return "stage times: " + ", ".join(parts) + (f", total {times['total'] / 60:.1f} min" if "total" in times else "")


def record_stages(report_dir: Path, times: dict[str, float], choices: dict | None = None) -> bool:
    """Add the stage times, and what the run chose for this machine (the training precision and why, what was
    trained on, the variants skipped and why), to a report this run wrote; render every file of it again."""
    path = Path(report_dir) / "report.json"
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if report.get("pipeline"):
        return False  # reused: the times of the run that measured it stay
    report["pipeline"] = {"stage_s": {k: round(times[k], 1) for k in STAGES if k in times}, **(choices or {})}
    write_reports(report, path.parent)
    return True
