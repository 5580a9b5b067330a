"""How a benchmark writes its report: JSON, and the same numbers as markdown under a provenance header.

    python -c "import sys; sys.path.insert(0, 'benchmarks'); import reportio; help(reportio.write_report)"
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def write_report(out: Path, rep: dict[str, Any], md: str, stem: str = "report") -> None:
    """`out`/STEM.json and `out`/STEM.md (atomically, `out` made if missing), then the md on stdout. A report
    that carries no provenance gets this run's: every committed number says which code and machine made it."""
    from qserve.files import write_json_atomic, write_text_atomic
    from qserve.provenance import provenance, with_header

    rep.setdefault("provenance", provenance())
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / f"{stem}.json", rep)
    write_text_atomic(out / f"{stem}.md", with_header(md, rep["provenance"]))
    print(md)
