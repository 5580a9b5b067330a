"""Calibration texts for the exporters that look at activations (onnx-int8 smoothing, bnb 4-bit clipping).

    python -c "from exporters.calibration import calibration_texts; \\
print(calibration_texts('models/minilm-l6-distilbert-imdb/checkpoint', 4))"
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from exporters.core import PROBES, as_context, padded_batches
from qserve.data.datasets import load_dataset
from qserve.textpairs import PAIR, PROBE_PAIRS
from qserve.tokenization import load_tokenizer

if TYPE_CHECKING:
    from exporters.core import ExportContext


def calibration_texts(checkpoint: ExportContext | Path | str, n: int) -> tuple[list[str], str]:
    """`n` texts of the checkpoint's training set (never the split the bench scores), else the parity probes."""
    texts, _, source = calibration_inputs(checkpoint, n)
    return texts, source


def calibration_inputs(checkpoint: ExportContext | Path | str, n: int) -> tuple[list[str], list[str] | None, str]:
    """calibration_texts() with each text's text_pair for a pair model (qserve/textpairs.py), else None:
    a pair model is calibrated on the pairs it will serve, encoded as its tokenizer encodes them."""
    ctx = as_context(checkpoint)
    meta = ctx.info.meta
    dataset = meta.dataset if meta is not None else None

    # the checkpoint's qserve_model.json, or what `qserve export --inputs` declares for it
    pair = ctx.info.inputs == PAIR
    if dataset:
        try:
            seed = meta.seed if meta is not None and meta.seed is not None else 42
            splits = load_dataset(dataset, seed=seed)
            train = splits.train
            keep = [i for i, t in enumerate(train.texts[:n]) if t.strip()]
            texts = [train.texts[i] for i in keep]
            pairs = [train.pairs[i] for i in keep] if pair and train.pairs is not None else None
            if texts and pair == (pairs is not None):
                return texts, pairs, f"{getattr(splits, 'name', dataset)} train split, first {len(texts)} texts"
        except Exception as e:  # noqa: BLE001 - a missing dataset costs calibration quality, not the export
            logging.getLogger(__name__).warning(
                "calibration: could not load dataset %r (%s); using the parity probe texts", dataset, e
            )
    if pair:
        chosen = list(PROBE_PAIRS)[:n]
        return (
            [a for a, _ in chosen],
            [b for _, b in chosen],
            f"the {len(chosen)} parity probe pairs (no pair dataset recorded with the checkpoint)",
        )

    probes = list(PROBES)[:n]
    return probes, None, f"the {len(probes)} parity probe texts (no dataset recorded with the checkpoint)"


def calibration_batches(
    checkpoint: ExportContext | Path | str,
    texts: list[str],
    max_length: int,
    batch_size: int = 16,
    policy: str | None = None,
    pairs: list[str] | None = None,
) -> list[dict]:
    """Tokenized, padded batches of the pieces of `texts` under `policy` (None: the export's), padding rows included,
    as the variant will run them."""
    ctx = as_context(checkpoint)
    return padded_batches(load_tokenizer(ctx.checkpoint), texts, max_length, batch_size, policy or ctx.policy, pairs)[1]


def calibration_set(checkpoint: ExportContext | Path | str, samples: int) -> tuple[list[dict], str]:
    """The calibration batches for `checkpoint` and where their texts came from; one call per export."""
    ctx = as_context(checkpoint)
    texts, pairs, source = calibration_inputs(ctx, samples)
    return calibration_batches(ctx, texts, ctx.info.max_length, pairs=pairs), source


def held_out_set(
    checkpoint: ExportContext | Path | str, samples: int, batches: list[dict], source: str
) -> tuple[list[dict], str]:
    """The `samples` training texts after the calibration ones, batched like them: texts that did not calibrate
    a recipe, to judge it on. Where the checkpoint records no dataset, `batches` (the calibration set) itself."""
    ctx = as_context(checkpoint)
    texts, pairs, more = calibration_inputs(ctx, 2 * samples)
    if len(texts) > samples and "train split" in more:
        return (
            calibration_batches(ctx, texts[samples:], ctx.info.max_length, pairs=pairs[samples:] if pairs else None),
            f"{len(texts) - samples} training texts after the calibration ones ({more})",
        )
    return batches, f"the calibration texts themselves ({source}: no held-out texts recorded)"


def rows_alone(batches: list[dict]) -> list[dict]:
    """Each text of `batches` as a batch of its own, unpadded: how the runtime runs a graph whose
    activation scale spans the batch (onnx-int8), so calibration sees the ranges serving sees."""
    return [
        {k: v[i][b["attention_mask"][i].astype(bool)][None] for k, v in b.items()}
        for b in batches
        for i in range(len(b["input_ids"]))
    ]


def feed(input_names: set[str], batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """An ONNX session's inputs from a calibration batch (zero token types where the graph wants them)."""
    out = {k: v for k, v in batch.items() if k in input_names}
    if "token_type_ids" in input_names and "token_type_ids" not in out:
        out["token_type_ids"] = np.zeros_like(batch["input_ids"])
    return out
