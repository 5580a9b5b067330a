"""Serving protocols: each decodes its request into the one call the serving state answers and encodes the Answer.

    curl -s -H 'Content-Type: application/json' -d '{"inputs": ["great"]}' 127.0.0.1:8000/v1/classify

routes.py (the probes, /v1, and the registration of the HTTP protocols), v2.py and v2_repository.py
(KServe V2 / Open Inference Protocol over HTTP, binary tensor data included, and its model repository),
grpc_v2.py (V2 over gRPC), tei.py (Text Embeddings Inference's HTTP API), vllm_api.py (vLLM's /classify)
and page.py + page.html (the served models' page, GET /). They import the serving core (qserve.serve.core),
never each other's internals beyond V2's shared repository answers.
"""
