"""Serving: a FastAPI app with dynamic batching around one variant's runtime.

    qserve serve models/minilm-imdb-variants/onnx-int8        # then open http://127.0.0.1:8000/docs

Top to bottom (pyproject.toml's import-linter contract "serve-layers"):

- cli.py + __main__.py: `qserve serve`, `qserve deploy ray`, `qserve loadtest` (its client is
  qserve/bench/loadtest.py).
- ray_engine.py (`--engine ray`: Ray Serve replicas on the same app) and app.py (the FastAPI app
  factory: the serving state in the lifespan, error bodies, OpenAPI): the wiring.
- protocols/: each HTTP protocol one module declaring itself (spec.py), listed in registry.py: /v1 and
  the probes (routes.py), KServe V2 over HTTP (v2.py, v2_repository.py), TEI (tei.py), vLLM (vllm_api.py),
  the served models' page (page.py); V2 over gRPC (grpc_v2.py).
- core/: the one serving state (state.py) and what it needs: served_model.py, answer.py, batcher.py (pending.py),
  outputs.py, pairs.py, texts.py, schemas.py, shadow.py, repository.py, guard.py, errors.py.
- infra/: config.py, metrics.py, tracing.py, connections.py, uvicorn_server.py, deploy.py.

docs/architecture.md has all of them, by role, and a request's path. Nothing here is imported by
`import qserve`.
"""
