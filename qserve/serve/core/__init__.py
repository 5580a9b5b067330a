"""The serving core: the one serving state and what it needs, below every protocol.

    python -m pytest tests/integration/test_serve_lifecycle.py -q

state.py (ServeState: the models by name, their loader and lifecycle: warm-up, a model dir's chosen variant
logged, a retired model's memory freed; submit resolves a request once), served_model.py (one served model:
runtime + batcher + version + shadow, the default loader), answer.py (the Answer every protocol encodes),
batcher.py (dynamic batching on the inference thread; pending.py: a queued text and its request), outputs.py
(thresholds and the V1/V2 outputs), pairs.py (one text or a pair, as the model takes), texts.py (what
counts as a valid text), schemas.py (the request and response models every protocol shares),
shadow.py (shadow traffic to a candidate), repository.py (which directory a model name serves),
guard.py (auth, limits, early 429, request ids, metrics per request) and errors.py (ApiError).
"""
