"""The accuracy pass of a bench child: score test texts in length-sorted batches, tokenize each text once per tokenizer.

    python -m pytest tests/integration/test_bench_fast.py -q

`score` runs predict() over batches of similar length and returns answers in the texts' order (one text, one
answer makes them the unsorted path's); `piece_stats` (windows, unseen tokens, tokens per text) is cached in the
report dir by tokenizer hash, policy and texts, so variants of one checkpoint tokenize once.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from pathlib import Path
from typing import Any

from qserve import problemtypes as problems
from qserve.files import write_json_atomic

TOKENIZER_FILES = ("tokenizer", "vocab", "special_tokens", "added_tokens", "merges", "spiece", "sentencepiece")


def tokenizer_key(manifest_files: dict[str, Any]) -> str:
    """sha256 over the tokenizer files' own hashes, as the manifest lists them."""
    parts = sorted((r, (i or {}).get("sha256")) for r, i in manifest_files.items() if r.startswith(TOKENIZER_FILES))
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def piece_stats(
    rt: Any,
    texts: list[str],
    policy: Any,
    cache_dir: str | Path | None,
    tok_key: str | None,
    pairs: list[str] | None = None,
) -> dict[str, list]:
    """{"windows", "truncated", "tokens"} per text under `policy` (resolved), from the cache when present."""
    path = None
    if cache_dir and tok_key:
        key = hashlib.sha256(
            json.dumps([tok_key, str(policy), rt.max_length, rt.options.max_windows, texts, pairs]).encode()
        ).hexdigest()[:32]
        path = Path(cache_dir) / f"pieces-{key}.json"
        with contextlib.suppress(OSError, ValueError):
            return json.loads(path.read_text(encoding="utf-8"))
    pieces = rt.split(texts, policy, pairs)
    stats = {
        "windows": list(pieces.windows),
        "truncated": [bool(t) for t in pieces.truncated],
        "tokens": [int(t) for t in pieces.tokens],
    }
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, stats)
    return stats


def sorted_batches(lengths: list[int], batch: int) -> list[list[int]]:
    """Text indices in batches of `batch`, longest first, so each batch pads to lengths that are alike."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    return [order[i : i + batch] for i in range(0, len(order), batch)]


def score(
    rt: Any, texts: list[str], policy: Any, lengths: list[int] | None, batch: int = 32, pairs: list[str] | None = None
) -> tuple[list[Any], float]:
    """(predictions in the texts' order, seconds spent in predict()); sorted by `lengths` when given."""
    groups = (
        sorted_batches(lengths, batch)
        if lengths is not None
        else [list(range(i, min(i + batch, len(texts)))) for i in range(0, len(texts), batch)]
    )
    preds: list[Any] = [None] * len(texts)
    seconds = 0.0
    for idx in groups:
        chunk = [texts[i] for i in idx]
        t0 = time.perf_counter()
        probs = rt.predict(chunk, policy, pairs=None if pairs is None else [pairs[i] for i in idx])
        rt.synchronize()
        seconds += time.perf_counter() - t0
        for i, p in zip(idx, problems.predictions(probs, rt.problem_type)):
            preds[i] = p
    return preds, seconds
