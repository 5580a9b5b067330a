"""One queued text and the request it answers: what the batcher (batcher.py) queues, fills and hands back.

    python -m pytest tests/integration/test_serve_batching.py -q

A request's texts enter the queue as Items, one per text, each pointing at the request's one Pending; a
batch fills each text's row of its Pending, and the last row resolves the request's future with one
Classification, its rows in the request's order, whatever batches (and lanes) they ran in.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from qserve import problemtypes as problems
from qserve.runtime.base import Classification, Phase


@dataclass(eq=False)
class Pending:
    n: int
    future: asyncio.Future
    rows: list[Any] = field(default_factory=list)
    raw: list[Any] = field(default_factory=list)
    """Each text's logits row."""
    problem_type: str = problems.SINGLE
    trunc: list[bool] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    windows: list[int] = field(default_factory=list)
    remaining: int = 0
    batches: list[list[Phase]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rows = [None] * self.n
        self.raw = [None] * self.n
        self.trunc = [False] * self.n
        self.tokens = [0] * self.n
        self.windows = [0] * self.n
        self.remaining = self.n

    def fill(self, index: int, row: np.ndarray, logits: np.ndarray, truncated: bool, tokens: int, windows: int,
             problem_type: str, phases: list[Phase] | None = None) -> None:
        if self.future.done():  # cancelled (client gone, timeout) or already failed
            return
        self.rows[index] = row
        self.raw[index] = logits
        self.problem_type = problem_type
        self.trunc[index] = truncated
        self.tokens[index] = tokens
        self.windows[index] = windows
        self.remaining -= 1
        if phases is not None and all(b is not phases for b in self.batches):
            self.batches.append(phases)
        if self.remaining == 0:
            self.future.set_result(Classification(np.stack(self.rows), list(self.trunc), list(self.tokens),
                                                  list(self.windows), np.stack(self.raw), self.problem_type,
                                                  [p for b in self.batches for p in b]))

    def fail(self, exc: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(exc)


@dataclass(eq=False)
class Item:
    pending: Pending
    index: int
    text: str
    enqueued: float
    policy: str | None = None
    pair: str | None = None
    """The text's text_pair (a pair model's input), else None."""


def infer_args(batch: list[Item]
                ) -> tuple[list[str], list[str | None]] | tuple[list[str], list[str | None], list[str]]:
    """InferFn's arguments for a batch: texts and policies, plus the pairs when its items carry them (a batch
    holds one model's items, and a model takes pairs for every input or for none)."""
    texts, policies = [it.text for it in batch], [it.policy for it in batch]
    if batch and batch[0].pair is not None:
        return texts, policies, [it.pair or "" for it in batch]
    return texts, policies
