"""Finished one-off studies, each named after the question it answered; the index is README.md beside this file.

    python -m benchmarks.studies.serve_windows models/minilm-l6-distilbert-imdb/variants/onnx-fp32 --threads 2

Each study still reruns (its `make reports` stage, benchmarks/render/stages.py) and writes its report under
benchmarks/reports/, where the docs' blocks (benchmarks/render/blocks/) read it; no maintained suite imports one.
"""
