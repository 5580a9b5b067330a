"""Serving protocols: each decodes its request into the one call the serving state answers and encodes the Answer.

    curl -s -H 'Content-Type: application/json' -d '{"inputs": ["great"]}' 127.0.0.1:8000/v1/classify

Each is one module or package declaring a ProtocolSpec (spec.py): probes, /v1, KServe V2 over HTTP and gRPC (v2/),
Text Embeddings Inference, vLLM's /classify and the models' page. registry.py lists them in one tuple, which the route
table, metrics, tracing and the OpenAPI document (docs.py, with its pages) read; they import the core and spec.py,
never each other's internals.
"""
