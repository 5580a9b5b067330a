"""The Runtime base class: tokenization and softmax shared by all backends.

    python -m pytest tests/test_runtime.py -q
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass
class RuntimeOptions:
    """Knobs that change how a variant runs, not what it computes."""

    threads: int | None = None
    """Intra-op threads (torch.set_num_threads / ORT intra_op_num_threads); None = library default."""
    max_length: int | None = None
    """Truncation length; None = the variant's own max_length from its manifest."""


class Runtime:
    """A loaded variant. Subclasses implement `_load()` and `forward(batch) -> logits`."""

    def __init__(self, variant_dir: Path, manifest: dict[str, Any], device: str, options: RuntimeOptions):
        from transformers import AutoTokenizer

        self.variant_dir = Path(variant_dir)
        self.manifest = manifest
        self.device = device
        self.options = options
        self.name: str = manifest["spec"]["name"]
        self.labels: list[str] = list(manifest["labels"])
        self.max_length: int = int(options.max_length or manifest["max_length"])
        self.tokenizer = AutoTokenizer.from_pretrained(self.variant_dir)
        self._load()

    # -- backend hooks -------------------------------------------------------------
    def _load(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def forward(self, batch: dict[str, np.ndarray]) -> np.ndarray:  # pragma: no cover - abstract
        """input_ids/attention_mask (int64, [B, S]) -> float32 logits [B, num_labels]."""
        raise NotImplementedError

    def synchronize(self) -> None:
        """Wait for queued device work (CUDA) so timings are honest; no-op on CPU."""

    # -- shared path -----------------------------------------------------------------
    def _encode(self, texts: list[str]):
        return self.tokenizer(list(texts), truncation=True, max_length=self.max_length, padding=True,
                              return_tensors="np")

    @staticmethod
    def _batch(enc) -> dict[str, np.ndarray]:
        return {"input_ids": enc["input_ids"].astype(np.int64),
                "attention_mask": enc["attention_mask"].astype(np.int64)}

    def tokenize(self, texts: list[str]) -> dict[str, np.ndarray]:
        return self._batch(self._encode(texts))

    def truncated(self, texts: list[str]) -> list[bool]:
        """Which texts are longer than max_length tokens (and so were cut)."""
        lens = self.tokenizer(list(texts), truncation=False, add_special_tokens=True)["input_ids"]
        return [len(ids) > self.max_length for ids in lens]

    def logits(self, texts: list[str]) -> np.ndarray:
        return self.forward(self.tokenize(texts)).astype(np.float32)

    def predict(self, texts: list[str]) -> np.ndarray:
        """Class probabilities [len(texts), num_labels] (float32, rows sum to 1)."""
        return softmax(self.logits(texts))

    def classify(self, texts: list[str]) -> tuple[np.ndarray, list[bool]]:
        """predict() plus, per text, whether it was cut to max_length, from ONE tokenization (the
        server's path: tokenizing a second time just for the flags cost every request)."""
        enc = self._encode(texts)
        probs = softmax(self.forward(self._batch(enc)).astype(np.float32))
        if enc.encodings is None:  # a slow (Python) tokenizer keeps no overflow record
            return probs, self.truncated(texts)
        return probs, [len(e.overflowing) > 0 for e in enc.encodings]

    def close(self) -> None:
        """Release the model (bench children exit anyway; serve calls this on shutdown)."""


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)
