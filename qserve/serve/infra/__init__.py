"""Serving infrastructure: settings, metrics, traces, connections and the engines' plumbing; imports no protocol or core module.

    python -c "from qserve.serve.infra.config import ServeConfig; print(ServeConfig(variant_dir='V').port)"

config.py (ServeConfig: settings and env), metrics.py (Prometheus), tracing.py (OpenTelemetry traces,
on with OTEL_*), connections.py (header/body/keep-alive timeouts, connection cap), uvicorn_server.py
(run an app under a real uvicorn server, foreground or background thread) and deploy.py (Ray Serve
deployment options, `qserve deploy ray`).
"""
