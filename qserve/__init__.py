"""qserve: fine-tune, quantize, benchmark and serve transformer text classifiers.

    qserve pipeline            # train -> export -> bench -> report on the embedded default

Importing this package must stay cheap: no torch, onnxruntime or bitsandbytes here
(tests/unit/test_imports.py holds us to it), so `qserve --help` answers at once.
"""

__version__ = "0.1.0"


class QserveError(Exception):
    """An error a user can act on: the message says what was wrong and what is allowed."""
