"""Alternating rounds: what is compared takes turns, its order reversed every other round, so drift on a
shared machine (a busy minute, a warming cache) hits every side alike.

    python -c "from benchmarks.harness.rounds import in_turn; print([in_turn('ab', r) for r in range(3)])"
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

T = TypeVar("T")


def in_turn(items: Iterable[T], rnd: int) -> list[T]:
    """The order of round `rnd` (from 0): as given in even rounds, reversed in odd ones."""
    order = list(items)
    return order if rnd % 2 == 0 else order[::-1]
