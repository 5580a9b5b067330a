"""The serving suite, `python -m benchmarks.serve_bench` (__main__.py), and its parts (benchmarks/__init__.py)."""
