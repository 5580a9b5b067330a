"""Serving infrastructure: settings, the way in, metrics, traces, connections, the engines' plumbing.

    python -c "from qserve.serve.infra.config import ServeConfig; print(ServeConfig(variant_dir='V').port)"

config.py (ServeConfig: settings and env), admission.py (the one way in for a request, HTTP or gRPC: request
id, trace, API key, overload gate, body limit, arrivals, metrics), errors.py (ApiError), metrics.py
(Prometheus), tracing.py (OpenTelemetry traces, on with OTEL_*), connections.py (header/body/keep-alive
timeouts, connection cap), uvicorn_server.py (run an app under a real uvicorn server, foreground or
background thread) and deploy.py (Ray Serve deployment options, `qserve deploy ray`). It imports no protocol
or core module.
"""
