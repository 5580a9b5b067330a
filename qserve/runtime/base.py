"""The Runtime base class: tokenization, the long-text policy, the row-by-row path and the scores every backend shares.

    python -c "import numpy as np; from qserve.problemtypes import scores; \\
print(scores(np.array([[0.0, 1.0]]), 'single_label_classification'))"

Texts are tokenized once, cut by their long-text policy (longtext.Reader) into pieces forwarded `max_rows` at a time;
each text's logits aggregate its own pieces only (batchmates never move it), then scores() applies the problem type.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from qserve import QserveError, longtext, textpairs
from qserve import problemtypes as problems
from qserve.artifact import Manifest, VariantError
from qserve.longtext import LongTextPolicy, PolicyArg
from qserve.runtime.buckets import fit_rows, plan, resolve
from qserve.runtime.options import RuntimeOptions
from qserve.tokenization import load_tokenizer

Phase = tuple[str, int, int, dict[str, Any]]
"""(name, start time.time_ns(), end time.time_ns(), attributes): one step of a classify() call, for traces."""


@dataclass(frozen=True, eq=False)
class TextResult:
    """What classify() answers for one text (one pair): made only by Classification.results(), and carried by
    reference from there through serve's batcher and Pending to the request's Answer."""

    probs: np.ndarray
    """[num_labels] float32 scores by the problem type (a row of Classification.probs)."""
    logits: np.ndarray
    """[num_labels] float32 raw outputs (a row of Classification.logits)."""
    truncated: bool
    tokens: int
    windows: int


@dataclass
class Classification:
    """What classify() answers for N texts."""

    probs: np.ndarray
    """[N, num_labels] float32 scores by `problem_type`: softmax rows (sum to 1), a sigmoid per label
    (multi-label), or the values (regression, [N, 1])."""
    truncated: list[bool]
    """Per text: was part of it unseen (longer than max_length under head/tail/head-tail, or capped windows)."""
    tokens: list[int]
    """Per text: its token count, special tokens included."""
    windows: list[int]
    """Per text: how many pieces were scored (1 unless a windows policy cut it)."""
    logits: np.ndarray
    """[N, num_labels] float32: the model's raw outputs (a windowed text's aggregated), before `probs` were made
    of them (softmax, sigmoid or the value): what a protocol with raw scores (TEI's raw_scores) answers."""
    problem_type: str = problems.SINGLE
    """What `probs` holds: qserve.problemtypes.SINGLE, MULTI or REGRESSION."""
    phases: list[Phase] = field(default_factory=list)
    """When tracing: the steps of the classify() call (serve: of every batch these texts ran in); else empty."""

    def results(self) -> list[TextResult]:
        """Each text's TextResult, in order (its rows are views of probs and logits)."""
        return [
            TextResult(probs=p, logits=z, truncated=t, tokens=n, windows=w)
            for p, z, t, n, w in zip(self.probs, self.logits, self.truncated, self.tokens, self.windows)
        ]

    @staticmethod
    def of(results: Sequence[TextResult], problem_type: str, phases: list[Phase]) -> Classification:
        """The answer of texts that ran in different batches (serve's Pending): their results, in order."""
        return Classification(
            probs=np.stack([r.probs for r in results]),
            truncated=[r.truncated for r in results],
            tokens=[r.tokens for r in results],
            windows=[r.windows for r in results],
            logits=np.stack([r.logits for r in results]),
            problem_type=problem_type,
            phases=phases,
        )


class Runtime:
    """A loaded variant. Subclasses implement `_load()` and `forward(batch) -> logits`.

    Invariant, one text, one answer: a backend whose rows can see each other sets `batch_invariant = False` in `_load`,
    and `run()` then computes it one row at a time (unless RuntimeOptions.batch_dependent == "batched").
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
    execution: dict[str, Any] | None = None
    """How a torch variant runs on its device (eager, CUDA graphs or torch.compile) and why (torch_rt.py); None for
    backends it does not apply to."""

    def __init__(self, variant_dir: Path, manifest: Manifest, device: str, options: RuntimeOptions):
        self.variant_dir = Path(variant_dir)
        self.manifest = manifest
        self.device = device
        self.options = options
        self.name: str = manifest.name
        self.labels: list[str] = list(manifest.labels)
        self.problem_type: str = manifest.problem
        """How logits become scores (qserve/problemtypes.py); a manifest without one is single-label."""
        self.max_length: int = int(options.max_length or manifest.max_length)
        self.tokenizer = load_tokenizer(self.variant_dir)
        self.template = longtext.template(self.tokenizer)
        self.reader = longtext.Reader(self.template, self.max_length, options.max_windows)
        """Every long-text decision for this model: resolving a policy, one per text, cutting texts (longtext.py)."""
        # One lock around the tokenizer: a busy server tokenizes on two lane threads at once (narrow()), and the
        # fast tokenizer refuses (RuntimeError: Already borrowed) a call while another changes its settings.
        self.tokenizer_lock = threading.Lock()
        encode = longtext.encoder(self.tokenizer)

        def locked(texts: list[str]) -> list[list[int]]:
            with self.tokenizer_lock:
                return encode(texts)

        self._encode = locked
        self._lane = threading.local()
        self.pad_id = int(self.tokenizer.pad_token_id or 0)
        # Segment ids where the tokenizer makes them (BERT, ALBERT, ELECTRA, DeBERTa): one text is segment 0.
        self.segments = "token_type_ids" in getattr(self.tokenizer, "model_input_names", ())
        self.inputs: tuple[str, ...] = manifest.takes
        """What one input of this model is: ("text",), or ("text", "text_pair") for a pair model (textpairs.py)."""
        recorded = manifest.long_text
        try:
            self.recorded_long_text = self.resolve_policy(recorded or longtext.DEFAULT, "manifest long_text")
        except longtext.LongTextError as e:
            raise VariantError(f"{self.variant_dir}/manifest.json: {e}") from None
        self.long_text: LongTextPolicy = (
            self.resolve_policy(options.long_text, "--long-text") if options.long_text else self.recorded_long_text
        )
        """The policy of texts that name none: --long-text, else the manifest's, else head."""
        self._load()

        self.buckets = resolve(options.length_buckets, self.max_length, self.fixed_shapes)

    @property
    def lanes(self) -> int:
        """Batches this runtime can run at once, each on one single-threaded worker (narrow()): its row workers
        when the backend can give a thread one of them, else 1."""
        return self.row_workers if self.can_narrow() else 1

    def can_narrow(self) -> bool:
        return False

    def narrow(self, on: bool) -> None:
        """From now on, this thread's forwards run whole on one single-threaded worker (on=True: a lane of a
        busy server, beside another lane's batch) or as usual (a lone row on every thread, a batch's rows
        spread over the workers). The answers are the same either way (each row is computed alone)."""
        self._lane.narrow = bool(on)

    def narrowed(self) -> bool:
        return getattr(self._lane, "narrow", False)

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

    def graph_feed(
        self, batch: dict[str, np.ndarray], input_names: list[str], model_file: str
    ) -> dict[str, np.ndarray]:
        """The int64 feed an exported graph (ONNX, OpenVINO IR) asks for, by its input names."""
        feed = {}
        for name in input_names:
            if name in batch:
                feed[name] = np.ascontiguousarray(batch[name], dtype=np.int64)
            elif name == "token_type_ids":  # a graph with segment ids fed by a tokenizer that makes none: segment 0
                feed[name] = np.zeros_like(batch["input_ids"], dtype=np.int64)
            else:
                raise QserveError(
                    f"{self.variant_dir / model_file} expects input {name!r}, which the tokenizer "
                    f"does not produce (it gives {', '.join(batch)})"
                )
        return feed

    def synchronize(self) -> None:
        """Wait for queued device work (CUDA) so timings are honest; no-op on CPU."""

    # -- shared path -----------------------------------------------------------------
    def resolve_policy(self, policy: str | LongTextPolicy | None, flag: str = "long_text") -> LongTextPolicy:
        """A policy string for this variant, written out in full (None = the runtime's default)."""
        return self.long_text if policy is None else self.reader.resolve(policy, flag)

    def _pair_pieces(self, texts: list[str], pairs: list[str], policy: PolicyArg) -> longtext.Pieces:
        """The pieces of text pairs: the tokenizer's own pair encoding and truncation (never windowed; the
        policy is still checked). A pair model also scores a lone text (pairs=None), as its tokenizer encodes
        one; the server refuses that (serve/core/pairs.py). Pairs for a one-text model are refused here."""
        if self.inputs != textpairs.PAIR:
            raise textpairs.PairError(
                f"{self.name} takes one text per input (manifest inputs {list(self.inputs)}); "
                "text_pair is for a model trained on text pairs"
            )
        self.reader.per_text(policy, len(texts), self.long_text)
        with self.tokenizer_lock:
            return textpairs.split_pairs(self.tokenizer, texts, pairs, self.max_length)

    def split(self, texts: list[str], policy: PolicyArg = None, pairs: list[str] | None = None) -> longtext.Pieces:
        """Cut `texts` (with their `pairs`, for a pair model) into the pieces the model scores under `policy`
        (see qserve/longtext.py, qserve/textpairs.py)."""
        if pairs is not None:
            return self._pair_pieces(list(texts), list(pairs), policy)
        return self.reader.split(self._encode, list(texts), policy, self.long_text)

    def pad(self, rows: list[list[int]], types: list[list[int]] | None = None) -> dict[str, np.ndarray]:
        """Pieces (with special tokens) -> an int64 input_ids/attention_mask batch, padded as the tokenizer pads
        (token_type_ids too where it makes them: `types`, a text pair's segments, else 0)."""
        return longtext.pad(rows, self.pad_id, getattr(self.tokenizer, "padding_side", "right"), self.segments, types)

    def tokenize(
        self, texts: list[str], policy: PolicyArg = None, pairs: list[str] | None = None
    ) -> dict[str, np.ndarray]:
        """The padded batch of every piece of `texts` (one row per text unless a text is windowed)."""
        pieces = self.split(texts, policy, pairs)
        return self.pad(pieces.ids, pieces.types)

    def truncated(self, texts: list[str], policy: PolicyArg = None, pairs: list[str] | None = None) -> list[bool]:
        """Which texts (pairs) have tokens the model does not see under `policy`."""
        return self.split(texts, policy, pairs).truncated

    def forward_pieces(self, rows: list[list[int]], types: list[list[int]] | None = None) -> np.ndarray:
        """Logits [len(rows), k] of padded pieces, at most options.max_rows per forward (shortest together)."""
        cap = self.options.max_rows
        if not cap or len(rows) <= cap:
            return self.run(self.pad(rows, types)).astype(np.float32)
        order = sorted(range(len(rows)), key=lambda j: len(rows[j]))  # similar lengths share a forward
        out: np.ndarray | None = None
        for start in range(0, len(order), cap):
            idx = order[start : start + cap]
            got = self.run(self.pad([rows[j] for j in idx], None if types is None else [types[j] for j in idx])).astype(
                np.float32
            )
            if out is None:
                out = np.empty((len(rows), got.shape[1]), dtype=np.float32)
            out[idx] = got
        assert out is not None  # len(rows) > cap >= 1: the loop ran
        return out

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
            return np.concatenate(
                [self.forward({k: v[i : i + step] for k, v in batch.items()}) for i in range(0, n, step)]
            )
        if not self.row_by_row or n == 1:
            return self.forward(batch)
        rows = []
        for i, mask in enumerate(batch["attention_mask"]):
            keep = mask.astype(bool)  # the row as it is tokenized alone: no padding
            rows.append({k: v[i][keep][None] for k, v in batch.items()})
        return np.concatenate(self.forward_rows(rows))

    def _run_bucketed(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        lengths = batch["attention_mask"].sum(axis=1)
        pad_id = self.tokenizer.pad_token_id or 0
        parts = [
            (rows, self.forward(fit_rows(batch, rows, bucket, pad_id)))
            for bucket, rows in plan(lengths, self.buckets or (), self.options.max_batch_tokens)
        ]
        out = np.empty((len(lengths), parts[0][1].shape[1]), dtype=parts[0][1].dtype)
        for rows, logits in parts:
            out[rows] = logits  # back in the batch's order
        return out

    def forward_rows(self, rows: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
        """forward() of each single-row batch, in order. A backend that can run rows side by side
        (each on its own thread, nothing shared between them) overrides this; the answers must not change."""
        return [self.forward(r) for r in rows]

    def logits(self, texts: list[str], policy: PolicyArg = None, pairs: list[str] | None = None) -> np.ndarray:
        """Text logits [len(texts), num_labels] under `policy`, a windowed text's aggregated; with `pairs`
        (a pair model), the logits of each (text, pair)."""
        pieces = self.split(texts, policy, pairs)
        return longtext.aggregate(self.forward_pieces(pieces.ids, pieces.types), pieces)

    def scores(self, logits: np.ndarray) -> np.ndarray:
        """Text logits -> scores by the variant's problem type: the one place predict and classify make them,
        with the manifest's calibrated temperature when `qserve gate` fitted one (the logits stay raw)."""
        return problems.scores(logits, self.problem_type, self.manifest.temperature)

    def predict(self, texts: list[str], policy: PolicyArg = None, pairs: list[str] | None = None) -> np.ndarray:
        """Scores [len(texts), num_labels] (float32): class probabilities (rows sum to 1) for a single-label
        variant, a sigmoid per label for multi-label, the values for regression; with `pairs` (a pair model),
        those of each (text, pair)."""
        return self.scores(self.logits(texts, policy, pairs))

    def _classify_pairs(
        self, texts: list[str], pairs: list[str], policy: PolicyArg, phases: list[Phase] | None
    ) -> Classification:
        t0 = time.time_ns()
        pieces = self.split(texts, policy, pairs)
        t1 = time.time_ns()
        logits = longtext.aggregate(self.forward_pieces(pieces.ids, pieces.types), pieces)
        probs = self.scores(logits)
        if phases is not None:
            phases += [
                ("tokenize", t0, t1, {"qserve.texts": len(texts), "qserve.text_pairs": len(texts)}),
                self._inference(len(texts), pieces, t1, time.time_ns()),
            ]
        return self.answer(pieces, logits, probs, phases)

    def classify(
        self,
        texts: list[str],
        policy: PolicyArg = None,
        phases: list[Phase] | None = None,
        pairs: list[str] | None = None,
    ) -> Classification:
        """predict() plus, per text, its token count, the windows scored and whether part of it was unseen,
        from ONE tokenization (the server's path). `phases`, when given (tracing), gets (name, start ns, end ns,
        attributes) for tokenize, windows (only when a text was cut into several) and inference. `pairs`: the
        second text of each input, for a pair model (qserve/textpairs.py: never windowed)."""
        if pairs is not None:
            return self._classify_pairs(list(texts), list(pairs), policy, phases)
        if phases is None:
            pieces = self.split(texts, policy)
            logits = longtext.aggregate(self.forward_pieces(pieces.ids), pieces)
            return self.answer(pieces, logits, self.scores(logits))
        t0 = time.time_ns()
        ids = self._encode(list(texts))
        t1 = time.time_ns()
        # the cut, timed apart from the tokenizer: a windows step when it made more pieces than texts
        pieces = self.reader.split(lambda _: ids, list(texts), policy, self.long_text)
        t2 = time.time_ns()
        logits = longtext.aggregate(self.forward_pieces(pieces.ids), pieces)
        probs = self.scores(logits)
        t3 = time.time_ns()
        windowed = sum(w > 1 for w in pieces.windows)
        if windowed:
            cut = {"qserve.texts": len(texts), "qserve.windowed_texts": windowed, "qserve.pieces": len(pieces.ids)}
            phases += [("tokenize", t0, t1, {"qserve.texts": len(texts)}), ("windows", t1, t2, cut)]
        else:
            phases.append(("tokenize", t0, t2, {"qserve.texts": len(texts)}))
        phases.append(self._inference(len(texts), pieces, t2, t3))
        return self.answer(pieces, logits, probs, phases)

    def _inference(self, texts: int, pieces: longtext.Pieces, start: int, end: int) -> Phase:
        """The inference step of a classify() call, for traces: its texts, pieces, padded shape and buckets."""
        n, width = len(pieces.ids), max((len(r) for r in pieces.ids), default=0)
        shape = {
            "qserve.tokenized_shape": f"{n}x{width}",
            "qserve.buckets": ",".join(map(str, self.buckets or ())) or "none",
        }
        return "inference", start, end, {"qserve.texts": texts, "qserve.pieces": n, **shape}

    def answer(
        self, pieces: longtext.Pieces, logits: np.ndarray, probs: np.ndarray, phases: list[Phase] | None = None
    ) -> Classification:
        """The one place classify() builds its answer: the texts' scores and logits (float32), and per text what
        `pieces` say of it; `phases`, when tracing, the steps this call appended to it."""
        return Classification(
            probs=np.asarray(probs, dtype=np.float32),
            truncated=[bool(t) for t in pieces.truncated],
            tokens=[int(n) for n in pieces.tokens],
            windows=[int(w) for w in pieces.windows],
            logits=np.asarray(logits, dtype=np.float32),
            problem_type=self.problem_type,
            phases=[] if phases is None else phases,
        )

    def close(self) -> None:
        """Release the model (bench children exit anyway; serve calls this on shutdown)."""
