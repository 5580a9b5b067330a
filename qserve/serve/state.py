"""The serving state: the models a server holds by name, how one is loaded and warmed, and the checks
every route shares.

    python -c "from qserve.serve.state import load_model; from qserve.serve.config import ServeConfig; \\
m = load_model(ServeConfig(variant_dir='models/minilm-imdb-variants/onnx-int8', device='cpu')); print(m.name, m.labels)"

A Loader turns a ServeConfig into a ModelRuntime (the default, load_model, is load_runtime on
config.variant_dir with the manifest verified). ServeState.add() warms that runtime up, starts
its Batcher and keeps the three together as a ServedModel under the model's name, with the
Selection that says why this variant was chosen (when a model dir picked it). Routes, the V2
protocol and the Ray engine reach a model only through ServeState.model(name). Today a server
holds exactly one model, the default, loaded by ServeState.start() in the app's lifespan.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

import numpy as np
from starlette.requests import Request

from qserve.serve.batcher import Batcher, BatchResult, InferFn, NotAccepting, QueueFull
from qserve.serve.config import ServeConfig
from qserve.serve.errors import ApiError
from qserve.serve.guard import Arrivals
from qserve.serve.metrics import Metrics
from qserve.serve.texts import text_problem
from qserve.serve.tracing import TRACE_KEY

if TYPE_CHECKING:
    from qserve.runtime.base import Phase
    from qserve.serve.tracing import Tracing

log = logging.getLogger("qserve.serve")


class ModelRuntime(Protocol):
    """What serve needs from a loaded variant; qserve.runtime.Runtime (load_runtime's result) is one."""

    name: str
    """The variant's spec name (the served name unless --model-name overrides it)."""
    labels: list[str]
    max_length: int
    """Token limit; longer texts are truncated, and classify() says which were."""
    manifest: dict[str, Any]
    device: str
    row_workers: int
    """Rows of a batch computed side by side (1 unless the backend runs rows on their own threads)."""
    buckets: tuple[int, ...] | None
    """Token lengths each text is padded to (a fixed-shape variant: qserve.runtime.buckets), else None."""

    def classify(self, texts: list[str], phases: list[Phase] | None = None) -> tuple[np.ndarray, list[bool]]:
        """Probabilities [len(texts), len(labels)] and, per text, whether it was truncated; `phases` (tracing
        only) gets the call's steps (tokenize, inference) with their times."""
        ...

    def close(self) -> None: ...


Loader = Callable[[ServeConfig], ModelRuntime]
"""config -> the loaded model; create_app takes one (tests wrap the real runtime through it)."""


class Selection(TypedDict):
    """Why a model dir's variant was served (qserve.bench.recommend.from_model_dir): /v1/models' `selection`."""

    variant: str
    why: str
    report: str
    measured_on: str | None
    same_cpu: bool | None


def load_model(config: ServeConfig) -> ModelRuntime:
    """The default Loader: load_runtime on config.variant_dir (manifest verified) with the serve flags."""
    from qserve.runtime import RuntimeOptions, load_runtime

    options = RuntimeOptions(threads=config.threads, row_workers=config.row_workers,
                             length_buckets=config.length_buckets, max_batch_tokens=config.max_batch_tokens)
    return load_runtime(config.variant_dir, config.device, options, allow_extra_files=config.allow_extra_files)


@dataclass(eq=False)
class ServedModel:
    """One model a server answers for: its runtime, its batcher, its name and why it was chosen."""

    name: str
    runtime: ModelRuntime
    batcher: Batcher
    selection: Selection | None = None

    def summary(self) -> dict[str, Any]:
        """The model's entry in /v1/models: manifest facts, no file contents."""
        rt = self.runtime
        m = rt.manifest
        files = m.get("files") or {}
        return {"id": self.name, "model_name": m.get("model_name"), "spec": m.get("spec"), "labels": list(rt.labels),
                "max_length": rt.max_length, "length_buckets": list(rt.buckets) if rt.buckets else None,
                "parity": m.get("parity"), "created": m.get("created"),
                "device": rt.device, "files": len(files),
                "bytes": sum(int(f.get("bytes", 0)) for f in files.values() if isinstance(f, dict)),
                "versions": m.get("versions"), "selection": self.selection}


async def _single_process_info() -> dict[str, Any]:
    return {"engine": "uvicorn", "replica_count": 1}


def _infer_fn(runtime: ModelRuntime, traced: bool = False) -> InferFn:
    def infer(texts: list[str]) -> tuple[np.ndarray, list[bool]]:
        # Tokenizing happens here, on the inference thread: the fast tokenizer is not thread-safe.
        probs, truncated = runtime.classify(texts)
        return np.asarray(probs, dtype=np.float32), [bool(t) for t in truncated]

    def infer_traced(texts: list[str]) -> tuple[np.ndarray, list[bool], list[Phase]]:
        phases: list[Phase] = []  # the runtime's steps (tokenize, inference, ...) for the batch's traces
        probs, truncated = runtime.classify(texts, phases=phases)
        return np.asarray(probs, dtype=np.float32), [bool(t) for t in truncated], phases

    return infer_traced if traced else infer


@dataclass(eq=False)
class ServeState:
    """Everything a running server knows: settings, metrics, the models by name, and its lifecycle."""

    config: ServeConfig
    metrics: Metrics
    loader: Loader = load_model
    selection: Selection | None = None
    """Why the default model's variant was chosen, when a model dir chose it."""
    on_load_failure: Callable[[BaseException], None] | None = None
    tracing: Tracing | None = None
    """OpenTelemetry tracing (tracing.py), or None: off, and a request pays one `is None` check for it."""
    arrivals: Arrivals = field(default_factory=Arrivals)
    executor: ThreadPoolExecutor | None = None
    models: dict[str, ServedModel] = field(default_factory=dict)
    default: str | None = None
    """The name of the model requests get when they name none."""
    load_error: str | None = None
    closing: bool = False
    load_task: asyncio.Task | None = field(default=None, repr=False)
    # /v1/models' engine block; the Ray engine swaps in one that asks the Serve controller.
    engine_info: Callable[[], Awaitable[dict[str, Any]]] = field(default=_single_process_info, repr=False)

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        """Load the default model (the lifespan runs this as a task, so the server answers meanwhile)."""
        try:
            await self.add(self.config, self.selection)
        except Exception as e:
            self.load_error = f"{type(e).__name__}: {e}"
            log.error("could not load %s: %s", self.config.variant_dir, self.load_error)
            if self.on_load_failure is not None:
                self.on_load_failure(e)
            return
        self.metrics.ready.set(1)

    async def add(self, cfg: ServeConfig, selection: Selection | None = None) -> ServedModel:
        """Load, warm up and start batching one model; it serves as soon as this returns."""
        loop = asyncio.get_running_loop()
        runtime = await loop.run_in_executor(self.executor, self.loader, cfg)
        infer = _infer_fn(runtime, traced=self.tracing is not None)
        try:
            # Warm-up, so first-call costs (allocator, graph init) do not land on a client. A batch of one and
            # a batch of several can take different paths (onnx-int8 runs a batch's rows on their own workers).
            await loop.run_in_executor(self.executor, infer, ["warm-up"])
            if cfg.max_batch_size > 1:
                n = min(cfg.max_batch_size, 2 * max(1, runtime.row_workers))
                await loop.run_in_executor(self.executor, infer, [f"warm-up {i}" for i in range(n)])
        except Exception:
            await loop.run_in_executor(self.executor, runtime.close)  # a model that cannot answer is not kept
            raise
        # What is loaded by now (libraries, model) lives as long as the server: move it out of the cyclic
        # GC, so full collections under load walk only what requests create.
        gc.collect()
        gc.freeze()
        name = cfg.model_name or runtime.name
        batcher = Batcher(infer, self.executor, max_batch_size=cfg.max_batch_size, max_wait_ms=cfg.max_wait_ms,
                          max_queue=cfg.max_queue, metrics=self.metrics, arriving=lambda: self.arrivals.n)
        batcher.start()
        model = ServedModel(name=name, runtime=runtime, batcher=batcher, selection=selection)
        self.models[name] = model
        if self.default is None:
            self.default = name
        log.info("serving %s (%s, labels %s) with max batch %d, max wait %.1f ms, length buckets %s", name,
                 runtime.manifest.get("model_name"), runtime.labels, cfg.max_batch_size, cfg.max_wait_ms,
                 runtime.buckets or "none (runs unpadded)")
        return model

    async def stop(self) -> None:
        """Refuse new work, let the load finish, drain every model's queue, release the models."""
        self.closing = True
        self.metrics.ready.set(0)
        if self.load_task is not None:
            await self.load_task
        loop = asyncio.get_running_loop()
        for model in self.models.values():
            await model.batcher.close()
            await loop.run_in_executor(self.executor, model.runtime.close)
        if self.executor is not None:
            self.executor.shutdown(wait=True)

    # -- what routes ask -----------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self.default is not None and not self.closing

    def not_ready_reason(self) -> str:
        if self.closing:
            return "server is shutting down"
        if self.load_error:
            return f"model failed to load: {self.load_error}"
        return "model is loading; retry when /ready answers 200"

    def queue_full_retry_after(self) -> int | None:
        """Retry-After seconds while not one more text fits in the default model's queue, else None
        (guard.py asks before the body names a model)."""
        if self.default is None:
            return None
        b = self.models[self.default].batcher
        if not b.full:
            return None
        return b.retry_after_s()

    def require_ready(self) -> None:
        if not self.ready:
            raise ApiError(503, self.not_ready_reason(), {"Retry-After": "1"})

    def model(self, name: str | None = None) -> ServedModel:
        """The model called `name` (None: the default); 503 while not ready, 404 for a name not served."""
        self.require_ready()
        if name is None:
            name = self.default
        model = self.models.get(name)
        if model is None:
            if len(self.models) == 1:
                raise ApiError(404, f"unknown model {name!r}; this server serves exactly one model: {self.default!r}")
            raise ApiError(404, f"unknown model {name!r}; this server serves {', '.join(map(repr, self.models))}")
        return model

    def check_texts(self, texts: list[Any], where: str) -> None:
        cfg = self.config
        if not texts:
            raise ApiError(422, f"{where} is empty; send 1..{cfg.max_inputs} texts")
        if len(texts) > cfg.max_inputs:
            raise ApiError(422, f"{where} has {len(texts)} texts; at most {cfg.max_inputs} per request "
                                "(--max-inputs); split the request")
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise ApiError(422, f"{where}[{i}] is {type(t).__name__}; every input must be a string")
            problem = text_problem(t)
            if problem:
                raise ApiError(422, f"{where}[{i}] {problem}")
            if len(t) > cfg.max_chars:
                raise ApiError(422, f"{where}[{i}] has {len(t)} characters; at most {cfg.max_chars} "
                                    "(--max-chars). Texts over the model's token limit are truncated, "
                                    "but the character limit bounds the work per request")

    async def classify(self, model: ServedModel, texts: list[str], request: Request) -> BatchResult:
        """Queue texts on the model's batcher; map every failure to an HTTP answer."""
        return await self.submit(model, texts, request.scope, request.state.request_id)

    async def submit(self, model: ServedModel, texts: list[str], scope: dict[str, Any], request_id: str) -> BatchResult:
        """classify() for any protocol: `scope` (an ASGI scope, or the gRPC service's stand-in) carries the
        request's arrival mark and, with tracing on, its RequestTrace."""
        self.require_ready()
        self.arrivals.end(scope)  # from here on this request is queued, not arriving
        if self.tracing is None:  # all that tracing costs a request when it is off
            return await self._submit(model, texts, request_id)
        trace = (scope.get("state") or {}).get(TRACE_KEY)
        if trace is None:
            return await self._submit(model, texts, request_id)
        trace.queued()
        result = await self._submit(model, texts, request_id)
        trace.answered(result.phases)
        return result

    async def _submit(self, model: ServedModel, texts: list[str], rid: str) -> BatchResult:
        try:
            return await model.batcher.submit(texts, self.config.request_timeout_s)
        except QueueFull as e:
            self.metrics.rejected.labels("queue_full").inc()
            raise ApiError(429, str(e), {"Retry-After": str(e.retry_after_s)}) from None
        except NotAccepting:
            raise ApiError(503, "server is shutting down; retry on another replica", {"Retry-After": "1"}) from None
        except TimeoutError:
            raise ApiError(504, f"no answer within {self.config.request_timeout_s} s "
                                "(--request-timeout-s); the model may be overloaded") from None
        except Exception as e:
            log.error("request %s: inference failed: %s: %s", rid, type(e).__name__, e)
            raise ApiError(500, f"inference failed for this request ({type(e).__name__}); "
                                f"quote request id {rid}. Other requests are unaffected") from None
