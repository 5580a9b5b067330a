"""The Runtime base class: tokenization, the row-by-row path and softmax shared by all backends.

    python -c "import numpy as np; from qserve.runtime.base import softmax; print(softmax(np.array([[0.0, 1.0]])))"
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

Phase = tuple[str, int, int, dict[str, Any]]
"""(name, start time.time_ns(), end time.time_ns(), attributes): one step of a classify() call, for traces."""


@dataclass
class RuntimeOptions:
    """Knobs that change how a variant runs, not what it computes."""

    threads: int | None = None
    """Intra-op threads (torch.set_num_threads / ORT intra_op_num_threads); None = library default."""
    max_length: int | None = None
    """Truncation length; None = the variant's own max_length from its manifest."""
    batch_dependent: str | None = None
    """How to run a variant whose kernels let a row see its batchmates (onnx-int8's one activation
    scale per batch): "rows" runs each text alone, unpadded, inside the one call, so its answer is the
    one it gets alone; "batched" runs the batch as one forward (answers then move with batchmates and
    padding; for side-by-side measurements). None = what the variant's manifest asks (rows, unless it
    was exported with row_by_row=false to rebuild the graph of before)."""
    row_workers: int | None = None
    """How many rows of a row-by-row batch run side by side, each single-threaded (backends that can:
    ONNX Runtime on CPU). None = as many as intra-op threads (`threads`, else the cores); 1 = one row
    at a time on the full intra-op pool. Never changes an answer: each row is still computed alone."""
    length_buckets: str | tuple[int, ...] = "auto"
    """Token lengths a variant that needs fixed shapes (ov-int8) pads each text to (qserve.runtime.buckets):
    "auto" (powers of two from 32, then max_length), "off" (max_length for every text) or e.g. (32, 64, 128).
    A text's bucket depends on its own length only. Variants that run unpadded ignore it."""
    max_batch_tokens: int | None = None
    """Cap on rows x padded length per forward; a larger batch runs as several forwards. None = no cap."""

    def __post_init__(self) -> None:
        from qserve import QserveError

        if self.batch_dependent is not None and self.batch_dependent not in BATCH_DEPENDENT:
            raise QserveError(f"batch_dependent must be one of {', '.join(BATCH_DEPENDENT)} "
                              f"(got {self.batch_dependent!r})")
        if self.row_workers is not None and (isinstance(self.row_workers, bool) or not isinstance(
                self.row_workers, int) or self.row_workers < 1):
            raise QserveError(f"row_workers must be an integer >= 1 or None (got {self.row_workers!r})")
        from qserve.runtime.buckets import parse

        parse(self.length_buckets)  # a bad value fails here, naming --length-buckets
        if self.max_batch_tokens is not None and (isinstance(self.max_batch_tokens, bool) or not isinstance(
                self.max_batch_tokens, int) or self.max_batch_tokens < 2):
            raise QserveError(f"--max-batch-tokens must be an integer >= 2 or unset (got {self.max_batch_tokens!r})")


BATCH_DEPENDENT = ("rows", "batched")


class Runtime:
    """A loaded variant. Subclasses implement `_load()` and `forward(batch) -> logits`.

    Invariant: one text, one answer. A backend whose forward lets rows see each other
    sets `batch_invariant = False` in `_load`; `run()` then computes such a variant one row at a
    time (unless RuntimeOptions.batch_dependent == "batched"), so bench, serve and every engine
    that calls predict/classify get answers that do not depend on batchmates or padding.
    """

    batch_invariant: bool = True
    """Whether forward() computes every row independently of the others (up to float rounding)."""
    row_workers: int = 1
    """How many rows of a row-by-row batch forward_rows() runs at once (backends that can set more)."""
    default_batch_dependent: str = "rows"
    """How the variant asks to be run when batch_invariant is False (RuntimeOptions.batch_dependent overrides)."""
    fixed_shapes: bool = False
    """Whether a text's answer depends on the padded length it runs at, so each text must always run at a
    length fixed by itself alone (set in _load; ov-int8). Such a variant runs length-bucketed."""
    buckets: tuple[int, ...] | None = None
    """The lengths run() pads each text to (qserve.runtime.buckets), or None: batches run as tokenized."""

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
        from qserve.runtime.buckets import resolve

        self.buckets = resolve(options.length_buckets, self.max_length, self.fixed_shapes)

    @property
    def row_by_row(self) -> bool:
        """Whether run() splits batches into single unpadded rows (a batch-dependent variant, by default)."""
        return not self.batch_invariant and (self.options.batch_dependent or self.default_batch_dependent) == "rows"

    # -- backend hooks -------------------------------------------------------------
    def _load(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def forward(self, batch: dict[str, np.ndarray]) -> np.ndarray:  # pragma: no cover - abstract
        """input_ids/attention_mask (int64, [B, S]) -> float32 logits [B, num_labels]."""
        raise NotImplementedError

    def graph_feed(self, batch: dict[str, np.ndarray], input_names: list[str], model_file: str) -> dict[str, np.ndarray]:
        """The int64 feed an exported graph (ONNX, OpenVINO IR) asks for, by its input names."""
        feed = {}
        for name in input_names:
            if name in batch:
                feed[name] = np.ascontiguousarray(batch[name], dtype=np.int64)
            elif name == "token_type_ids":  # BERT-layout graphs; DistilBERT declares none
                feed[name] = np.zeros_like(batch["input_ids"], dtype=np.int64)
            else:
                from qserve import QserveError

                raise QserveError(f"{self.variant_dir / model_file} expects input {name!r}, which the tokenizer "
                                  f"does not produce (it gives {', '.join(batch)})")
        return feed

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

    def run(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        """forward() under the invariant: a fixed-shape variant runs each text padded to its length bucket
        (one forward per bucket), a batch-dependent one one unpadded row at a time (forward_rows), a
        batch-invariant one, or a single row, in one forward (split by --max-batch-tokens if set)."""
        if self.buckets is not None:
            return self._run_bucketed(batch)
        n, width = batch["input_ids"].shape
        cap = self.options.max_batch_tokens
        if not self.row_by_row and cap and n > 1 and n * width > cap:
            step = max(1, cap // width)
            return np.concatenate([self.forward({k: v[i:i + step] for k, v in batch.items()})
                                   for i in range(0, n, step)])
        if not self.row_by_row or n == 1:
            return self.forward(batch)
        rows = []
        for i, mask in enumerate(batch["attention_mask"]):
            keep = mask.astype(bool)  # the row as it is tokenized alone: no padding
            rows.append({k: v[i][keep][None] for k, v in batch.items()})
        return np.concatenate(self.forward_rows(rows))

    def _run_bucketed(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        from qserve.runtime.buckets import fit_rows, plan

        lengths = batch["attention_mask"].sum(axis=1)
        pad_id = self.tokenizer.pad_token_id or 0
        parts = [(rows, self.forward(fit_rows(batch, rows, bucket, pad_id)))
                 for bucket, rows in plan(lengths, self.buckets or (), self.options.max_batch_tokens)]
        out = np.empty((len(lengths), parts[0][1].shape[1]), dtype=parts[0][1].dtype)
        for rows, logits in parts:
            out[rows] = logits  # back in the batch's order
        return out

    def forward_rows(self, rows: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
        """forward() of each single-row batch, in order. A backend that can run rows side by side
        (each on its own thread, nothing shared between them) overrides this; the answers must not change."""
        return [self.forward(r) for r in rows]

    def logits(self, texts: list[str]) -> np.ndarray:
        return self.run(self.tokenize(texts)).astype(np.float32)

    def predict(self, texts: list[str]) -> np.ndarray:
        """Class probabilities [len(texts), num_labels] (float32, rows sum to 1)."""
        return softmax(self.logits(texts))

    def classify(self, texts: list[str], phases: list[Phase] | None = None) -> tuple[np.ndarray, list[bool]]:
        """predict() plus, per text, whether it was cut to max_length, from ONE tokenization (the
        server's path: tokenizing a second time just for the flags cost every request). `phases`, when
        given (tracing), gets (name, start ns, end ns, attributes) for tokenize and inference."""
        if phases is None:
            enc = self._encode(texts)
            probs = softmax(self.run(self._batch(enc)).astype(np.float32))
        else:
            t0 = time.time_ns()
            enc = self._encode(texts)
            batch = self._batch(enc)
            t1 = time.time_ns()
            probs = softmax(self.run(batch).astype(np.float32))
            t2 = time.time_ns()
            shape = f"{len(texts)}x{batch['input_ids'].shape[1]}"
            phases += [("tokenize", t0, t1, {"qserve.texts": len(texts)}),
                       ("inference", t1, t2, {"qserve.texts": len(texts), "qserve.tokenized_shape": shape,
                                              "qserve.buckets": ",".join(map(str, self.buckets or ())) or "none"})]
        if enc.encodings is None:  # a slow (Python) tokenizer keeps no overflow record
            return probs, self.truncated(texts)
        return probs, [len(e.overflowing) > 0 for e in enc.encodings]

    def close(self) -> None:
        """Release the model (bench children exit anyway; serve calls this on shutdown)."""


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)
