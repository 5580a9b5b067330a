"""Serving infrastructure: settings, the way in, metrics, traces, connections, the engines' plumbing.

    python -c "from qserve.serve.infra.config import ServeConfig; print(ServeConfig(variant_dir='V').port)"

The bottom layer of qserve/serve/: it imports no protocol or core module. docs/architecture.md lists its modules.
"""
