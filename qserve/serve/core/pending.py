"""One queued text and the request it answers: what the batcher (batcher.py) queues, fills and hands back.

    python -m pytest tests/integration/test_serve_batching.py -q

A request's texts enter the queue as Items, one per text, each pointing at the request's one Pending; a
batch hands each text its TextResult (qserve/runtime/base.py), which the Pending keeps by reference, and
the last one resolves the request's future with one Classification, its texts in the request's order,
whatever batches (and lanes) they ran in.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import cast

from qserve.runtime.base import Classification, TextResult


@dataclass(eq=False)
class Pending:
    n: int
    future: asyncio.Future
    results: list[TextResult | None] = field(default_factory=list)
    """Each text's result, in the request's order (None until its batch ran)."""
    remaining: int = 0
    batches: list[Classification] = field(default_factory=list)
    """The batches its texts ran in, each once: their problem type and, when tracing, their steps."""

    def __post_init__(self) -> None:
        self.results = [None] * self.n
        self.remaining = self.n

    def fill(self, index: int, result: TextResult, batch: Classification) -> None:
        """Text `index` answered by `result`, one of `batch`'s."""
        if self.future.done():  # cancelled (client gone, timeout) or already failed
            return
        self.results[index] = result
        self.remaining -= 1
        if all(b is not batch for b in self.batches):
            self.batches.append(batch)
        if self.remaining == 0:
            done = cast("list[TextResult]", self.results)  # remaining == 0: every text has its result
            self.future.set_result(
                Classification.of(done, batch.problem_type, [p for b in self.batches for p in b.phases])
            )

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


def infer_args(batch: list[Item]) -> tuple[list[str], list[str | None]] | tuple[list[str], list[str | None], list[str]]:
    """InferFn's arguments for a batch: texts and policies, plus the pairs when its items carry them (a batch
    holds one model's items, and a model takes pairs for every input or for none)."""
    texts, policies = [it.text for it in batch], [it.policy for it in batch]
    if batch and batch[0].pair is not None:
        return texts, policies, [it.pair or "" for it in batch]
    return texts, policies
