"""benchmarks/lifecycle_bench.py end to end on the tiny variant, with very short cells (a smoke test:
the numbers mean nothing here, the report's shape and the zero-error checks do).

    python -m pytest tests/integration/test_lifecycle_bench.py -q
"""

from __future__ import annotations

import json
import shutil

import pytest

from benchmarks import lifecycle_bench

pytest.importorskip("httpx2")
pytest.importorskip("psutil")


def test_the_benchmark_runs_on_the_tiny_variant(tiny_variant, tmp_path):
    from qserve.provenance import with_header

    bench = lifecycle_bench
    other = tmp_path / "v2"
    shutil.copytree(tiny_variant, other)  # the dir m is swapped to (same content: a reload)
    out = tmp_path / "report"
    rc = bench.main(
        [
            str(tiny_variant),
            "--swap-to",
            str(other),
            "--reference",
            str(tiny_variant),
            "--shadow-rate",
            "0.5",
            "--duration",
            "0.5",
            "--rounds",
            "1",
            "--concurrency",
            "4",
            "--swap-concurrency",
            "4",
            "--swap-before-s",
            "1",
            "--swap-after-s",
            "0.5",
            "--settle-s",
            "0.2",
            "--threads",
            "1",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    rep = json.loads((out / "report.json").read_text())
    s = rep["summary"]
    assert s["errors"] == s["lost"] == s["other_versions"] == 0
    assert s["rps_plain"] > 0 and s["rps_shadowed"] > 0 and s["rss_before_mb"] > 0 and s["swap_load_s"] > 0
    assert [r["target"] for r in rep["swap_rounds"]] == [str(other)]
    assert rep["swap_rounds"][0]["latency"]["during"]["requests"] > 0
    assert rep["shadow_state"]["reference_spec"] == "torch-fp32" and rep["shadow_state"]["samples"] > 0
    md = (out / "report.md").read_text()
    assert md.startswith("# Model lifecycle") and "Produced by" in md and "shadow cost" in md
    assert md == with_header(bench.render(rep), rep["provenance"])  # md is a pure function of the JSON
