"""The review texts a benchmark sends: the one loader, from the embedded dataset (or any) via qserve.data.

python -c "from benchmarks.harness.data import reviews; print(reviews(2))"
"""

from __future__ import annotations

from dataclasses import dataclass

from qserve.data.datasets import load_dataset


@dataclass(frozen=True)
class Reviews:
    texts: list[str]
    labels: list[int | float | tuple[int, ...]]
    """each text's target: a class id, a regression value, or a multi-label set"""
    dataset: str
    """the dataset's canonical name (load_dataset(dataset, seed, max_eval_samples) rebuilds the same split)"""


def review_split(
    n: int | None, dataset: str = "default", *, pool: int | None = None, seed: int = 42, split: str = "test"
) -> Reviews:
    """The first `n` texts (None: all) of `dataset`'s seeded test split (or `split`: train, val) and their labels,
    as qserve.data splits it. `pool`: validation and test first subsampled (stratified, seeded) to that many
    texts, as `qserve bench --max-eval-samples POOL` scores them; a different pool picks different texts, so a
    script keeps its own."""
    splits = load_dataset(dataset, seed=seed, max_eval_samples=pool)
    part = getattr(splits, split)
    return Reviews(list(part.texts)[:n], list(part.labels)[:n], splits.name)


def reviews(n: int | None, dataset: str = "default", *, pool: int | None = None, seed: int = 42) -> list[str]:
    """review_split's texts alone."""
    return review_split(n, dataset, pool=pool, seed=seed).texts
