"""The two values every protocol speaks to the serving state in: the one request it decodes, the one answer it encodes.

    python -m pytest tests/integration/test_serve_api.py tests/integration/test_serve_grpc.py -q

ServeState.submit resolves an InferenceRequest once, against the model that runs its texts, and returns an Answer:
no check runs twice, and no part of an answer comes from another model than the one that computed it.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from qserve.problemtypes import Threshold
from qserve.runtime.base import Classification, Phase
from qserve.serve.core.served_model import ModelRuntime, ServedModel

Outputs = Callable[[ServedModel], tuple[str, ...]]
"""A protocol's outputs resolved against the model that runs the request (checked there: a 422 names the field)."""


@dataclass(frozen=True)
class Origin:
    """Where a request came from: each protocol module declares its own (the core names no protocol)."""

    protocol: str
    long_text_field: str = "long_text"
    """What its body calls the long-text policy (a 422 names it)."""


@dataclass(eq=False, slots=True)  # built per request: slots, not frozen, for the cheapest construction
class InferenceRequest:
    """One request, as every protocol decodes it: texts (or pairs) for the model `model` names, and its options."""

    model: str
    """The served name the request reached (ServeState.model looked it up; submit takes whoever serves it now)."""
    texts: list[str]
    origin: Origin
    scope: MutableMapping[str, Any]
    """The ASGI scope (or the gRPC service's stand-in): the arrival mark, the metrics' model label, the trace."""
    request_id: str
    pairs: list[str] | None = None
    """Each text's text_pair, for a pair model (serve/core/pairs.py checked them); None: one text per input."""
    long_text: str | None = None
    """The long-text policy asked for; None: the model's default."""
    threshold: float | None = None
    """Multi-label only; None: the variant's calibrated thresholds, else --threshold."""
    outputs: Outputs | None = None
    """What the protocol answers, resolved against the model that runs it (KServe V2's output names); None: no such."""
    timeout_s: float | None = None
    """The client's deadline (gRPC's), when shorter than --request-timeout-s; None: --request-timeout-s."""


@dataclass(frozen=True, eq=False)
class Answer:
    """One request's answer: the model that computed it, what the request asked resolved for that model, and
    the texts' Classification (their scores and how each was read), held as the batcher handed it back."""

    model: ServedModel
    """The model that answered: the one serving the name when the texts were queued."""
    policy: str
    """The long-text policy the texts were read by, written out in full: the request's, else the model's default."""
    threshold: Threshold | None
    """The multi-label threshold in effect: the request's, else the variant's calibrated one per label (a tuple),
    else --threshold; None for any other problem type."""
    outputs: tuple[str, ...]
    """What the protocol's `outputs` (ServeState.submit) resolved against this model, in order (KServe V2: the
    output names to answer); empty for a protocol without."""
    result: Classification
    """The request's texts as the model answered them, in order (qserve/runtime/base.py)."""

    @property
    def name(self) -> str:
        """The model's served name."""
        return self.model.name

    @property
    def version(self) -> str:
        """The model's version, the manifest's short hash: every answer carries it as model_version."""
        return self.model.version

    @property
    def probs(self) -> np.ndarray:
        """[n, labels] float32 scores by the model's problem type (softmax, a sigmoid per label, or the value)."""
        return self.result.probs

    @property
    def logits(self) -> np.ndarray:
        """[n, labels] float32 raw model outputs before softmax/sigmoid (a windowed text's aggregated)."""
        return self.result.logits

    @property
    def truncated(self) -> list[bool]:
        """Per text: whether part of it went unseen under `policy`."""
        return self.result.truncated

    @property
    def tokens(self) -> list[int]:
        """Per text: its token count, special tokens included."""
        return self.result.tokens

    @property
    def windows(self) -> list[int]:
        """Per text: how many pieces were scored (1 unless a windows policy cut it)."""
        return self.result.windows

    @property
    def phases(self) -> list[Phase]:
        """When tracing: the steps (tokenize, windows, inference) of every batch the texts ran in; else empty."""
        return self.result.phases

    @property
    def runtime(self) -> ModelRuntime:
        return self.model.runtime

    @property
    def problem_type(self) -> str:
        return self.model.runtime.problem_type

    @property
    def labels(self) -> list[str]:
        return self.model.runtime.labels

    @property
    def max_length(self) -> int:
        return self.model.runtime.max_length
