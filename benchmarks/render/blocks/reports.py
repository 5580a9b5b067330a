"""The committed reports every block reads, through one loader, and how a block names them and their machine.

    python -c "from benchmarks.render.blocks.reports import MAIN_JOB, on; print(on(f'{MAIN_JOB}/report.json'))"

Every block reads a report's JSON with load() (or maybe(), for a stage that has not run yet) under REPORTS, so
pointing REPORTS elsewhere (a test's tmp_path) reaches every block.
"""

from __future__ import annotations

import json
from typing import Any

from benchmarks.harness import ROOT
from qserve.provenance import recorded_cpu

REPORTS = ROOT / "benchmarks" / "reports"
MAIN_JOB = "pipeline-auto-xeon"
"""The current main job's report (`make demo`'s pipeline, `make reports STAGE=pipeline-auto-xeon`): README's
headline."""
RUN_DIR = "models/minilm-l6-distilbert-imdb"


def load(rel: str) -> dict[str, Any]:
    return json.loads((REPORTS / rel).read_text(encoding="utf-8"))


def rendered_from(*rels: str) -> str:
    """The line under a table naming the JSON it came from and the CPU that measured it."""
    parts = [f"`benchmarks/reports/{r}` ({recorded_cpu(load(r)) or 'CPU not recorded'})" for r in rels]
    return "\n\n<sub>Rendered from " + ", ".join(parts) + " by `benchmarks/render/tables.py`.</sub>"


NOT_MEASURED = "not measured"


def maybe(rel: str) -> dict[str, Any] | None:
    """A report's JSON, or None while its stage has not run (a pending stage's table says "not measured")."""
    return load(rel) if (REPORTS / rel).is_file() else None


def rendered_from_some(rels: list[str]) -> str:
    """rendered_from of the reports that exist, naming the stage that writes each missing one."""
    have = [r for r in rels if (REPORTS / r).is_file()]
    missing = [f"`{r}` (`make reports STAGE={r.split('/')[0]}`)" for r in rels if r not in have]
    src = rendered_from(*have) if have else "\n\n<sub>Rendered by `benchmarks/render/tables.py`.</sub>"
    return src[: -len("</sub>")] + (f" Not measured yet: {', '.join(missing)}.</sub>" if missing else "</sub>")


def cpu_of(rel: str) -> str:
    """The CPU a report's JSON says it was measured on."""
    return recorded_cpu(load(rel)) or "CPU not recorded"


def on(rel: str) -> str:
    """`benchmarks/reports/<its dir>/` on <the CPU it records>: how a prose block names its report and machine."""
    where = rel.rsplit("/", 1)[0] + "/" if "/" in rel else rel
    return f"`benchmarks/reports/{where}` on {cpu_of(rel)}"


def train_metrics(d: str) -> dict[str, Any]:
    """The train_metrics.json a pipeline stage copies beside its report."""
    return load(f"{d}/train_metrics.json")
