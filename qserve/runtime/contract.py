"""The runtime contract: what serving and the benchmarks use of a loaded variant, checked by mypy.

    python -m mypy qserve/runtime qserve/serve

Every Runtime (base.py) implements it; serve, the shadow and bench hold a ModelRuntime, so a missing attribute or a
wrong type fails the type check (tests/unit/test_types.py), not a request. A test wrapping a real runtime
(tests/integration/test_serve_batching.py) must keep this shape.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Protocol

from qserve.artifact import Manifest
from qserve.longtext import LongTextPolicy, PolicyArg
from qserve.runtime.base import Classification, Phase
from qserve.tokenization import Tokenizer


class ModelRuntime(Protocol):
    """A loaded variant, as everything above qserve.runtime sees it."""

    name: str
    """The variant's spec name (the served name unless --model-name or NAME=DIR overrides it)."""
    labels: list[str]
    problem_type: str
    """How logits become scores: qserve.problemtypes.SINGLE, MULTI or REGRESSION (the manifest's problem_type)."""
    inputs: tuple[str, ...]
    """What one input is: ("text",), or ("text", "text_pair") for a pair model (qserve/textpairs.py)."""
    max_length: int
    """Tokens the model reads at once; a longer text is cut by a long-text policy, and classify() says how."""
    long_text: LongTextPolicy
    """The policy of texts whose request names none (--long-text, else the variant's manifest, else head)."""
    tokenizer: Tokenizer
    """The variant's tokenizer (qserve/tokenization.py; TEI's /tokenize and /decode); not thread-safe: used under
    tokenizer_lock only."""
    tokenizer_lock: threading.Lock
    """Held around every use of the tokenizer: a busy server's lanes (serve/core/batcher.py) tokenize at once."""
    manifest: Manifest
    """The verified manifest.json, typed (qserve/artifact.py)."""
    device: str
    variant_dir: Path
    """The variant's directory (verified when loaded)."""
    row_workers: int
    """Rows of a batch computed side by side (1 unless the backend runs rows on their own threads)."""
    buckets: tuple[int, ...] | None
    """Token lengths each text (each window of one) is padded to (a fixed-shape variant: qserve.runtime.buckets),
    else None."""
    execution: dict[str, Any] | None
    """A torch variant's execution record: mode (eager, graphs, compile), what was asked (--cuda-graphs), why, and
    the graphs captured (qserve/runtime/graphs.py); None for other backends."""

    @property
    def lanes(self) -> int:
        """Batches the runtime can run at once, each whole on one single-threaded worker (narrow()); on a GPU, the
        batches in flight (one tokenizing while another runs on the device)."""
        ...

    def narrow(self, on: bool) -> None:
        """This thread's forwards from now on: whole on one single-threaded worker (True) or as usual."""
        ...

    def resolve_policy(self, policy: str | LongTextPolicy | None, flag: str = "long_text") -> LongTextPolicy:
        """A policy string written out in full for this variant; LongTextError (naming `flag`) if it cannot be."""
        ...

    def classify(
        self,
        texts: list[str],
        policy: PolicyArg = None,
        phases: list[Phase] | None = None,
        pairs: list[str] | None = None,
    ) -> Classification:
        """Probabilities and logits [len(texts), len(labels)] and, per text, whether part of it went unseen, its
        token count and how many windows were scored; `policy` gives each text's policy (None = long_text);
        `phases` (tracing only) gets the call's steps (tokenize, windows when a text was cut, inference) with
        their times; `pairs`: each text's text_pair, for a pair model (its `inputs` are ("text", "text_pair"))."""
        ...

    def close(self) -> None:
        """Release the model (serve calls this when a version is swapped out, unloaded or shut down)."""
        ...
