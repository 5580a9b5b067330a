"""Benchmarks: each variant in its own process, reports as json/csv/md/png.

    qserve bench models/minilm-imdb-variants --threads 2

Importing this package is cheap (no torch): `from qserve.bench import BenchConfig, run_bench` is what
`qserve pipeline` calls.
"""

from __future__ import annotations

from qserve.bench.config import BenchConfig
from qserve.bench.report import write_reports
from qserve.bench.runner import run_bench
from qserve.benchreport import load_report

__all__ = ["BenchConfig", "run_bench", "load_report", "write_reports"]
