"""Corpus scoring: `qserve predict TARGET INPUT --out OUTPUT`, in constant memory, resumable, locally or on Ray Data.

    qserve predict models/minilm-l6-distilbert-imdb reviews.jsonl --out scored.parquet
    qserve predict models/m/variants/onnx-int8 corpus/ --out scored.jsonl --engine ray --replicas auto

corpus.py (reading INPUT in chunks, writing complete parts, the ledger, the final merge), job.py (the
settings, the model a TARGET names, scoring one chunk exactly as /v1/classify answers it, the local
engine), ray_data.py (`--engine ray`: the same chunk scorer in a Ray Data actor pool) and cli.py
(the flags). Nothing here is imported by `import qserve`.
"""
