"""Serving: a FastAPI app with dynamic batching around one variant's runtime.

    qserve serve models/minilm-imdb-variants/onnx-int8        # then open http://127.0.0.1:8000/docs

config.py (settings, env), state.py (the models by name, their loader, batchers and
lifecycle; submit resolves a request once), answer.py (the Answer every protocol encodes), app.py (factory, error bodies, OpenAPI), routes.py (/v1, probes), v2.py
(the KServe V2 / Open Inference Protocol, binary tensor data included), texts.py (what
counts as a valid text), batcher.py (dynamic batching), guard.py (auth, limits, early
429, request ids, metrics per request), connections.py (header/body/keep-alive timeouts,
connection cap), metrics.py (Prometheus), loadtest.py + cli.py (`qserve serve`,
`qserve loadtest`), deploy.py (Ray deployment options, `qserve deploy ray`) and
ray_engine.py (`--engine ray`); docs/architecture.md has all of them, by role, and a request's path.
Nothing here is imported by `import qserve`.
"""
