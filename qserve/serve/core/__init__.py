"""The serving core: the one serving state and what it needs, below every protocol and knowing none of them.

    python -m pytest tests/integration/test_serve_lifecycle.py -q

state.py (ServeState: the models by name, their loader and lifecycle: warm-up, a model dir's chosen variant
logged, a retired model's memory freed; submit resolves a request once), served_model.py (one served model:
runtime + batcher + version + shadow, the default loader), answer.py (the request every protocol decodes and
the Answer it encodes), batcher.py (dynamic batching on the inference thread; pending.py: a queued text and its
request), pairs.py (one text or a pair, as
the model takes), texts.py (what counts as a valid text), schemas.py (the field types and bodies every
protocol's models are built from), shadow.py (shadow traffic to a candidate) and repository.py (which
directory a model name serves).
"""
