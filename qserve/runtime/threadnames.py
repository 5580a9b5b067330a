"""OS-level names for qserve's worker threads, so `top -H`, perf and /proc/PID/task show which is which.

    python -c "from qserve.runtime.threadnames import name_thread; name_thread('qserve-x')"

Python 3.11 keeps thread names inside Python; a ThreadPoolExecutor given `initializer=named("qserve-infer")` sets
each thread's kernel name (15 bytes at most; benchmarks/serve_overhead/ reads them). Best effort: no prctl, no name.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import sys
from collections.abc import Callable

_PR_SET_NAME = 15


def name_thread(name: str) -> None:
    """Give the calling thread the OS name `name` (cut to the kernel's 15 bytes)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)


def named(name: str) -> Callable[[], None]:
    """An executor initializer: each worker thread names itself `name`."""
    return lambda: name_thread(name)
