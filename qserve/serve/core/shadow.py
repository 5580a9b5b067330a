"""Shadow agreement: does a served (quantized) model still agree with its reference on live traffic?

    qserve serve int8=models/m/variants/onnx-int8 --shadow int8=models/m/variants/onnx-fp32 --shadow-rate 0.05
    curl -s 127.0.0.1:8000/metrics | grep qserve_shadow

A Shadow re-scores sampled texts with the reference on a thread of its own; offering a sample never blocks the
inference thread (one that does not fit the bounded queue is dropped and counted). See docs/serving.md.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import random
import threading
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

from qserve import QserveError
from qserve import problemtypes as problems
from qserve.artifact import read_manifest, read_model_meta
from qserve.runtime import RuntimeOptions, load_runtime
from qserve.runtime.contract import ModelRuntime
from qserve.serve.core.repository import resolve
from qserve.serve.infra.metrics import Metrics
from qserve.variants import TORCH_THREADS, bar_for

log = logging.getLogger("qserve.serve")

WINDOW = 1000
"""Samples in the rolling window (agreement and quantiles are over these)."""
QUEUE_TEXTS = 256
"""Sampled texts waiting for the reference; beyond it samples are dropped (and counted)."""
BATCH = 16
"""Most texts the reference scores at once."""
MIN_SAMPLES = 50
"""Samples in the window before agreement is compared with the bar."""
QUANTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))


def parse_shadows(entries: list[str] | None) -> dict[str, str]:
    """--shadow NAME=REFERENCE_DIR entries -> {name: reference dir}; one reference per model."""
    out: dict[str, str] = {}
    for entry in entries or []:
        name, _, ref = entry.partition("=")
        name, ref = name.strip(), ref.strip()
        if name in out:
            raise QserveError(f"--shadow {entry}: model {name!r} already has the reference {out[name]}; one per model")
        out[name] = ref
    return out


class Shadow:
    """One served model's reference, its sampling queue, its thread and its rolling agreement."""

    def __init__(
        self,
        model: str,
        reference_dir: str,
        rate: float,
        threads: int,
        metrics: Metrics,
        device: str = "cpu",
        allow_extra_files: bool = False,
        seed: int = 0,
        max_windows: int | None = None,
    ):
        self.model = model
        self.reference_dir = reference_dir
        self.rate = rate
        self.threads = threads
        self.device = device
        self.allow_extra_files = allow_extra_files
        self.max_windows = max_windows
        """The served model's --max-windows: a windowed text gets the same windows from the reference."""
        self.reference: ModelRuntime | None = None
        self.reference_spec: str | None = None
        self._rng = random.Random(seed)  # drawn from on the inference thread and the lanes (GIL-atomic draws)
        self._queue: queue.Queue[tuple[str, str, np.ndarray, str] | None] = queue.Queue(QUEUE_TEXTS)
        self._lock = threading.Lock()
        self._window: deque[tuple[bool, float]] = deque(maxlen=WINDOW)
        self._thread: threading.Thread | None = None
        self.version: str | None = None
        self.bar: float | None = None
        self.samples = 0  # since the current version was attached
        self.dropped = 0
        self.failures = 0
        self._below = False
        self.m_agreement = metrics.shadow_agreement.labels(model)
        self.m_dprob = {q: metrics.shadow_dprob.labels(model, str(p)) for q, p in QUANTILES + (("max", 1.0),)}
        self.m_samples = metrics.shadow_samples.labels(model)
        self.m_dropped = metrics.shadow_dropped.labels(model)
        self.m_bar = metrics.shadow_bar.labels(model)

    # -- lifecycle (the server's loader thread, then the event loop) -----------------------
    def load(self) -> None:
        """Load the reference (manifest verified) with its own thread budget; start the shadow thread."""
        vdir, _ = resolve(self.reference_dir)
        backend = read_manifest(vdir).backend
        # torch's intra-op pool is process-wide: a torch reference must not resize the served model's.
        threads = None if backend in TORCH_THREADS else self.threads
        options = RuntimeOptions(threads=threads, row_workers=1, max_rows=BATCH)
        if self.max_windows is not None:
            options.max_windows = self.max_windows
        self.reference = load_runtime(vdir, self.device, options, allow_extra_files=self.allow_extra_files)
        self.reference_spec = self.reference.name
        self._thread = threading.Thread(target=self._run, name=f"qserve-shadow-{self.model}", daemon=True)
        self._thread.start()

    def attach(self, version: str, labels: list[str], bits: int | None) -> None:
        """The model now serves `version`: start a new window, held to the bar for its bits."""
        if self.reference is not None and list(self.reference.labels) != list(labels):
            raise QserveError(
                f"--shadow {self.model}={self.reference_dir}: the reference's labels "
                f"{self.reference.labels} differ from the model's {labels}; shadow a model with "
                "the reference it was exported from"
            )
        with self._lock:
            self.version, self.bar = version, bar_for(bits)
            self._window.clear()
            self.samples, self._below = 0, False
        self.m_bar.set(self.bar)
        self.m_agreement.set(float("nan"))
        for g in self.m_dprob.values():
            g.set(float("nan"))

    def close(self) -> None:
        """Stop the thread (what is queued is dropped) and release the reference."""
        if self._thread is not None:
            while True:  # make room for the stop signal without blocking on a full queue
                try:
                    self._queue.put_nowait(None)
                    break
                except queue.Full:
                    with contextlib.suppress(queue.Empty):
                        self._queue.get_nowait()
            self._thread.join(60)
        if self.reference is not None:
            self.reference.close()
            self.reference = None

    # -- the inference thread --------------------------------------------------------------
    def offer(self, texts: list[str], policies: list[str], probs: np.ndarray, version: str) -> None:
        """Sample served texts (with the policy each was read by) for the reference; never blocks (a full
        queue drops and counts)."""
        for i, text in enumerate(texts):
            if self.rate < 1.0 and self._rng.random() >= self.rate:
                continue
            try:
                self._queue.put_nowait((text, policies[i], np.array(probs[i], dtype=np.float32), version))
            except queue.Full:
                self.dropped += 1
                self.m_dropped.inc()

    # -- the shadow thread -----------------------------------------------------------------
    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            batch, stop = [item], False
            while len(batch) < BATCH:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                batch.append(nxt)
            batch = [b for b in batch if b[3] == self.version]  # samples of a swapped-out version describe it
            if batch:
                reference = self.reference
                try:
                    assert reference is not None, "the reference is closed"
                    # the served text's own policy: a windowed text is compared with the reference's windows
                    ref = reference.classify([t for t, _, _, _ in batch], [p for _, p, _, _ in batch]).probs
                except Exception as e:  # noqa: BLE001 - the shadow must never take the server down
                    self.failures += 1
                    log.error(
                        "shadow %s: reference %s failed on %d texts: %s: %s",
                        self.model,
                        self.reference_dir,
                        len(batch),
                        type(e).__name__,
                        e,
                    )
                else:
                    self._record(
                        np.stack([p for _, _, p, _ in batch]), np.asarray(ref, dtype=np.float32), batch[0][3], reference
                    )
            if stop:
                return

    def _record(self, served: np.ndarray, ref: np.ndarray, version: str, reference: ModelRuntime) -> None:
        agree = row_agreement(served, ref, reference.problem_type, reference.variant_dir)
        dprob = np.abs(served - ref).max(axis=1)
        with self._lock:
            if version != self.version:
                return
            self._window.extend(zip(agree.tolist(), dprob.tolist()))
            self.samples += len(agree)
            stats = self._stats_locked()
        self.m_samples.inc(len(agree))
        self.m_agreement.set(stats["agreement"])
        for q, v in stats["abs_dprob"].items():
            self.m_dprob[q].set(v)
        self._check_bar(stats)

    def _check_bar(self, stats: dict[str, Any]) -> None:
        if stats["window"] < min(MIN_SAMPLES, WINDOW) or self.bar is None:
            return
        below = stats["agreement"] < self.bar
        if below and not self._below:
            log.warning(
                "shadow %s (version %s): rolling agreement with %s is %.2f%% over the last %d sampled "
                "texts, under the bar of %.0f%% for its bits; max |dprob| p99 %.4f",
                self.model,
                self.version,
                self.reference_dir,
                100 * stats["agreement"],
                stats["window"],
                100 * self.bar,
                stats["abs_dprob"]["p99"],
            )
        elif self._below and not below:
            log.info(
                "shadow %s: rolling agreement back to %.2f%% (bar %.0f%%)",
                self.model,
                100 * stats["agreement"],
                100 * self.bar,
            )
        self._below = below

    def _stats_locked(self) -> dict[str, Any]:
        n = len(self._window)
        if not n:
            return {"window": 0, "agreement": None, "abs_dprob": None}
        agree = np.fromiter((a for a, _ in self._window), dtype=np.float64, count=n)
        dprob = np.fromiter((d for _, d in self._window), dtype=np.float64, count=n)
        qs = {q: float(v) for (q, _), v in zip(QUANTILES, np.quantile(dprob, [p for _, p in QUANTILES]))}
        return {"window": n, "agreement": float(agree.mean()), "abs_dprob": {**qs, "max": float(dprob.max())}}

    def summary(self) -> dict[str, Any]:
        """The model's `shadow` entry in /v1/models."""
        with self._lock:
            stats = self._stats_locked()
            samples, below = self.samples, self._below
        return {
            "reference": str(Path(self.reference_dir)),
            "reference_spec": self.reference_spec,
            "rate": self.rate,
            "version": self.version,
            "samples": samples,
            **stats,
            "bar": self.bar,
            "below_bar": below if stats["window"] >= min(MIN_SAMPLES, WINDOW) else None,
            "dropped": self.dropped,
            "failures": self.failures,
            "window_size": WINDOW,
        }


def row_agreement(served: np.ndarray, ref: np.ndarray, problem: str, variant_dir: Path) -> np.ndarray:
    """Per text, how far the served answer agrees with the reference's, as the bench measures it
    (qserve.problemtypes.agreement): same top label (single-label), share of labels with the same on/off at 0.5
    (multi-label), 1 - |Δvalue| / the training labels' range from qserve_model.json, else 1 (regression)."""
    if problem == problems.MULTI:
        return ((served >= 0.5) == (ref >= 0.5)).mean(axis=1)
    if problem == problems.REGRESSION:
        meta = read_model_meta(Path(variant_dir))
        span = meta.label_range if meta is not None else None
        return 1.0 - np.abs(served - ref).mean(axis=1) / float(span or 1.0)
    return (served.argmax(axis=1) == ref.argmax(axis=1)).astype(np.float64)
