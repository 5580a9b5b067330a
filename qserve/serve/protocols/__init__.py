"""Serving protocols: each decodes its request into the one call the serving state answers and encodes the Answer.

    curl -s -H 'Content-Type: application/json' -d '{"inputs": ["great"]}' 127.0.0.1:8000/v1/classify

Each HTTP protocol is one module that declares itself (spec.py: a Protocol, its routes, error shape, OpenAPI
additions and metrics label): routes.py (the probes and /v1), v2.py with v2_repository.py (KServe V2 / Open
Inference Protocol over HTTP, binary tensor data included, and its model repository), tei.py (Text Embeddings
Inference's HTTP API), vllm_api.py (vLLM's /classify) and page.py + page.html (the served models' page, GET /).
registry.py lists them: the app registers their routes, the guard's fast path, metrics, tracing and the
OpenAPI document derive from that one tuple. grpc_v2.py serves V2 over gRPC. They import the serving core
(qserve.serve.core) and spec.py, never each other's internals beyond V2's shared repository answers.
"""
