"""Serving protocols: each decodes its request into the one call the serving state answers and encodes the Answer.

    curl -s -H 'Content-Type: application/json' -d '{"inputs": ["great"]}' 127.0.0.1:8000/v1/classify

Each protocol is one module (or one package) that declares itself (spec.py: a ProtocolSpec, its routes, error
shape, OpenAPI additions, metrics label and any server beside HTTP): probes.py (health, ready, metrics), v1.py
(/v1 and OpenAI's model list), v2/ (KServe V2 / Open Inference Protocol over HTTP, binary tensor data included,
its model repository, and over gRPC), tei.py (Text Embeddings Inference's HTTP API), vllm_api.py (vLLM's
/classify) and page.py + page.html (the served models' page, GET /). registry.py lists them: the app registers
their routes, the guard's route table and inference answers, metrics, tracing and the OpenAPI document derive from that
one tuple. They import the serving core (qserve.serve.core) and spec.py, never each other's internals.
"""
