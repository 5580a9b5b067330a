"""One served model: the runtime contract serve needs, the default loader, the ServedModel unit
(runtime + batcher + version + shadow) and the weak trace a retired version leaves.

    python -c "from qserve.serve.core.served_model import load_model; \\
from qserve.serve.infra.config import ServeConfig; \\
m = load_model(ServeConfig(variant_dir='models/minilm-imdb-variants/onnx-int8', device='cpu')); print(m.name)"

state.py builds and swaps these; routes reach them through ServeState.model(name).
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from qserve import QserveError
from qserve.artifact import Manifest
from qserve.gatepolicy import UNGATED, verdict_for
from qserve.longtext import LongTextError, LongTextPolicy
from qserve.rundir import Served
from qserve.runtime import RuntimeOptions, load_runtime
from qserve.runtime.base import Classification
from qserve.runtime.contract import ModelRuntime
from qserve.serve.core.batcher import Batcher, InferFn
from qserve.serve.core.shadow import Shadow
from qserve.serve.infra.config import ServeConfig
from qserve.serve.infra.errors import ApiError
from qserve.serve.infra.metrics import ModelMetrics

log = logging.getLogger("qserve.serve")

Loader = Callable[[ServeConfig], ModelRuntime]
"""config -> the loaded model; create_app takes one (tests wrap the real runtime through it)."""
Offer = Callable[[list[str], list[str], np.ndarray], None]
"""(texts, the policy each was read by, written out in full, their served probabilities) -> None."""


def gate_summary(manifest: Manifest, policy: str | None = None) -> dict[str, Any] | None:
    """The release gate's verdict for the variant served under `policy` (None: its own) as /v1/models, V2
    metadata and the page show it (None: never gated). `verdict` is passed, failed, undecided, or ungated when the gate
    verified another policy (`gated_long_text`); `passed` is true only for a passing verdict on this policy."""
    g = manifest.gate
    if not g:
        return None
    agreement = g.get("agreement") or {}
    held = verdict_for(manifest, policy)
    return {
        "passed": held["verdict"] == "passed",
        **held,  # verdict, long_text, gated_long_text, why
        "agreement": agreement.get("value"),
        "agreement_lower_bound": agreement.get("lo"),
        "agreement_upper_bound": agreement.get("hi"),
        "bar": (g.get("bar") or {}).get("agreement_lower_bound"),
        "n": (g.get("data") or {}).get("n"),
        "accuracy_delta": (g.get("accuracy") or {}).get("delta"),
        "data": g.get("data"),
        "reference": (g.get("reference") or {}).get("name"),
        "reasons": g.get("reasons") or [],
        "when": g.get("when"),
        "machine": g.get("machine"),
    }


def check_gate(manifest: Manifest, where: str, policy: str | LongTextPolicy | None = None) -> None:
    """--require-gate: refuse a variant without a passing gate verdict in its (verified) manifest for the
    long-text policy it is to serve (`policy`; None: its own), saying why."""
    g = manifest.gate
    if not g:
        raise QserveError(
            f"--require-gate: {where} ({manifest.name}) has never been gated; run `qserve gate {where}` "
            "(it compares the variant with its fp32 export on labelled data) or serve without "
            "--require-gate"
        )
    held = verdict_for(manifest, policy)
    if held["verdict"] == UNGATED:
        raise QserveError(
            f"--require-gate: {where} ({manifest.name}) would serve long-text policy {held['long_text']}, but "
            f"its gate verified {held['gated_long_text']}: run `qserve gate {where} --long-text "
            f"{held['long_text']}`, or serve {held['gated_long_text']} (--long-text)"
        )
    if not g.get("passed"):
        raise QserveError(
            f"--require-gate: {where} ({manifest.name}) did not pass its gate ({held['verdict']}) on {g.get('when')}: "
            + "; ".join(g.get("reasons") or ["no reason recorded"])
            + "; serve a variant that passed, or gate it again on more data"
        )


def load_model(config: ServeConfig) -> ModelRuntime:
    """The default Loader: load_runtime on config.variant_dir (manifest verified) with the serve flags."""
    # max_rows: windows of long texts make more rows than texts; a forward never runs more than a full batch
    options = RuntimeOptions(
        threads=config.threads,
        row_workers=config.row_workers,
        long_text=config.long_text,
        max_windows=config.max_windows,
        max_rows=config.batch_size,
        length_buckets=config.length_buckets,
        max_batch_tokens=config.max_batch_tokens,
        cuda_graphs=config.cuda_graphs,
    )
    started = time.perf_counter()
    runtime = load_runtime(config.variant_dir, config.device, options, allow_extra_files=config.allow_extra_files)
    # its own line: start to ready split into loading and the warm-up that follows (benchmarks/image_report.py)
    log.info("loaded %s from %s in %.2f s; warming up", runtime.name, config.variant_dir, time.perf_counter() - started)
    return runtime


@dataclass(eq=False)
class ServedModel:
    """One model a server answers for: its runtime, its batcher, its name, version and origin."""

    name: str
    runtime: ModelRuntime
    batcher: Batcher
    version: str = ""
    """The manifest's short hash: what every answer of this model carries as model_version."""
    variant_dir: str = ""
    selection: Served | None = None
    metrics: ModelMetrics | None = field(default=None, repr=False)
    shadow: Shadow | None = field(default=None, repr=False)

    def summary(self) -> dict[str, Any]:
        """The model's entry in /v1/models: manifest facts, no file contents."""
        rt = self.runtime
        m = rt.manifest
        files = m.files
        return {
            "id": self.name,
            "version": self.version,
            "model_name": m.model_name,
            "spec": m.spec.to_json(),
            "labels": list(rt.labels),
            "problem_type": rt.problem_type,
            "inputs": list(rt.inputs),
            "max_length": rt.max_length,
            "long_text": str(rt.long_text),
            "length_buckets": list(rt.buckets) if rt.buckets else None,
            "execution": rt.execution,
            "parity": m.parity,
            "gate": gate_summary(m, str(rt.long_text)),
            "calibration": m.calibration,
            "created": m.created,
            "device": rt.device,
            "dir": self.variant_dir,
            "files": len(files),
            "bytes": sum(f.bytes for f in files.values()),
            "versions": m.versions,
            "selection": None if self.selection is None else self.selection.record(),
            "shadow": self.shadow.summary() if self.shadow is not None else None,
        }

    def check_policy(self, policy: str | None, where: str) -> str | None:
        """A request's long-text policy written out in full for this model (None: the model's default);
        422 naming `where` and the allowed forms when it is not one, or does not fit the model."""
        if policy is None:
            return None
        try:
            return str(self.runtime.resolve_policy(policy, where))
        except LongTextError as e:
            raise ApiError(422, str(e)) from None


class Retired(NamedTuple):
    """A model version that was swapped out or unloaded, and a weak reference to its runtime."""

    name: str
    version: str
    runtime: weakref.ref

    @property
    def released(self) -> bool:
        return self.runtime() is None


def infer_fn(runtime: ModelRuntime, offer: Offer | None = None, traced: bool = False, lane: bool = False) -> InferFn:
    """The batcher's InferFn for `runtime`; `traced`: the answer also carries the runtime's steps for traces;
    `lane`: it runs on a lane thread, the whole batch on one single-threaded worker (Runtime.narrow)."""

    def infer(texts: list[str], policies: list[str | None], pairs: list[str] | None = None) -> Classification:
        if lane:
            runtime.narrow(True)
        # Tokenizing happens here, on the inference thread or a lane, under the runtime's tokenizer_lock.
        if pairs is not None:  # a pair model's batch (serve/core/pairs.py)
            r = runtime.classify(texts, policies, [] if traced else None, pairs=pairs)
        else:  # the steps (tokenize, windows, inference) only when traced
            r = runtime.classify(texts, policies, []) if traced else runtime.classify(texts, policies)
        if offer is not None and pairs is None:  # the shadow samples what was served (single texts: its
            # reference is scored on texts), under the policy it was served by; never blocks
            default = str(runtime.long_text)
            offer(texts, [p or default for p in policies], r.probs)
        return r

    return infer
