"""Serving: an HTTP app with one router and dynamic batching around one variant's runtime.

    qserve serve models/minilm-imdb-variants/onnx-int8        # then open http://127.0.0.1:8000/docs

Layers, top to bottom (import-linter contract "serve-layers"): cli, the wiring (ray_engine, app), router, protocols/,
core/, infra/; docs/architecture.md has each module by role. Nothing here is imported by `import qserve`.
"""
