"""The serving-overhead suite, `python -m benchmarks.serve_overhead` (__main__.py), and its parts."""
