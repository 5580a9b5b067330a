"""Serving: a FastAPI app with dynamic batching around one variant's runtime.

    qserve serve models/minilm-imdb-variants/onnx-int8        # then open http://127.0.0.1:8000/docs

Top to bottom (pyproject.toml's import-linter contract "serve-layers"):

- cli.py + __main__.py: `qserve serve`, `qserve deploy ray`, `qserve loadtest` (its client is
  qserve/bench/loadtest.py).
- ray_engine.py (`--engine ray`: Ray Serve replicas on the same app) and app.py (the FastAPI app
  factory: the serving state in the lifespan, error bodies, OpenAPI): the wiring.
- guard.py: the HTTP front of every route (the ASGI middleware): each request matched once in the route
  table and taken through the admission layer; the one entrance of every inference route.
- protocols/: each protocol one module (or package) declaring itself (spec.py), listed in registry.py: the
  probes (probes.py), /v1 (v1.py), KServe V2 over HTTP and gRPC (v2/), TEI (tei.py), vLLM (vllm_api.py),
  the served models' page (page.py).
- core/: the one serving state (state.py) and what it needs: served_model.py, answer.py, batcher.py (pending.py),
  pairs.py, texts.py, schemas.py, shadow.py, repository.py; nothing of any one protocol.
- infra/: config.py, admission.py (the one way in for a request, HTTP or gRPC), errors.py, metrics.py,
  tracing.py, connections.py, uvicorn_server.py, deploy.py.

docs/architecture.md has all of them, by role, and a request's path. Nothing here is imported by
`import qserve`.
"""
