"""Benchmark suites and the committed reference reports; every script runs as a module of this package.

    python -m benchmarks.rebuild_reports          # the `make reports` stages (benchmarks/report_stages.py)

What the scripts share (servers, review texts, /metrics, load clients, alternating rounds, report
writing) lives in benchmarks.harness. Nothing outside tests imports this package (the import contracts
in pyproject.toml); it imports qserve and exporters.
"""
