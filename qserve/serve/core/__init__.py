"""The serving core: the one serving state and what it needs, below every protocol and knowing none of them.

    python -m pytest tests/integration/test_serve_lifecycle.py -q

ServeState (state.py) holds the models by name and answers every request through submit; the other modules
serve it (one served model, batching, answers, texts, pairs, schemas, shadow, repository): docs/architecture.md.
"""
