"""Serving: a FastAPI app with dynamic batching around one variant's runtime.

    qserve serve models/minilm-imdb-variants/onnx-int8        # then open http://127.0.0.1:8000/docs

config.py (settings, env), app.py (factory, lifespan), routes.py (/v1, /v2, probes),
batcher.py (dynamic batching), guard.py (auth, limits, request ids, metrics per
request), metrics.py (Prometheus), loadtest.py + cli.py (`qserve serve`,
`qserve loadtest`). Nothing here is imported by `import qserve`.
"""
