"""Benchmarks: each variant in its own process, reports as json/csv/md/png.

    qserve bench models/minilm-imdb-variants --threads 2

Python API (what `qserve pipeline` calls):

    from qserve.bench import BenchConfig, run_bench
    report = run_bench([Path("models/minilm-imdb-variants/onnx-int8")], BenchConfig(out=Path("out/bench")))

Importing this package is cheap (no torch); the names resolve on first use.
"""

from __future__ import annotations

__all__ = ["BenchConfig", "run_bench", "load_report", "write_reports"]


def __getattr__(name: str):
    if name == "BenchConfig":
        from qserve.bench.config import BenchConfig

        return BenchConfig
    if name == "run_bench":
        from qserve.bench.runner import run_bench

        return run_bench
    if name in ("load_report", "write_reports"):
        from qserve.bench import report

        return getattr(report, name)
    raise AttributeError(f"module 'qserve.bench' has no attribute {name!r}")
