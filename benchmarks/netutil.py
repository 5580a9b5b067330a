"""Network helpers the serving benchmarks share (a module below them, so they never import each other).

    python -c "import sys; sys.path.insert(0, 'benchmarks'); from netutil import free_port; print(free_port())"
"""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
