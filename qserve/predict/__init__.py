"""Corpus scoring: `qserve predict TARGET INPUT --out OUTPUT`, in constant memory, resumable, locally or on Ray Data.

    qserve predict models/minilm-l6-distilbert-imdb reviews.jsonl --out scored.parquet
    qserve predict models/m/variants/onnx-int8 corpus/ --out scored.jsonl --engine ray --replicas auto

corpus.py (INPUT in chunks, parts, ledger, merge), job.py (settings, model, one chunk as /v1 answers it, the local
engine), ray_data.py (`--engine ray`), cli.py (the flags). Nothing here is imported by `import qserve`.
"""
