"""The serving state: the models a server holds by name, how each is loaded, warmed, swapped and released,
and the checks every route shares.

    python -m pytest tests/integration/test_serve_lifecycle.py -q

Protocols reach a model only through ServeState.model(name) and queue texts only through ServeState.submit, so a
hot swap is one switch and every answer comes from the model that computed it: docs/architecture.md ("Models").
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import gc
import logging
import weakref
from collections.abc import Awaitable, Callable, MutableMapping
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

from qserve import QserveError, longtext, problemtypes
from qserve.artifact import read_manifest
from qserve.gatepolicy import UNGATED, verdict_for
from qserve.rundir import Served
from qserve.runtime.base import Classification
from qserve.serve.core.answer import Answer, InferenceRequest
from qserve.serve.core.batcher import Batcher, NotAccepting, QueueFull
from qserve.serve.core.pairs import check_same_inputs, takes_pairs
from qserve.serve.core.repository import ModelSource, Repository, model_version, resolve
from qserve.serve.core.served_model import Loader, ModelRuntime, Retired, ServedModel, check_gate, infer_fn, load_model
from qserve.serve.core.shadow import Shadow, parse_shadows
from qserve.serve.infra.admission import Admission, Arrivals
from qserve.serve.infra.config import ServeConfig
from qserve.serve.infra.connections import HttpLoad
from qserve.serve.infra.drain import Drain
from qserve.serve.infra.errors import ApiError
from qserve.serve.infra.metrics import Metrics
from qserve.serve.infra.tracing import TRACE_KEY, Tracing

__all__ = ["Answer", "Loader", "ModelRuntime", "Retired", "ServeState", "ServedModel", "load_model"]

log = logging.getLogger("qserve.serve")


async def _single_process_info() -> dict[str, Any]:
    return {"engine": "uvicorn", "replica_count": 1}


async def warm_up(runtime: ModelRuntime, executor: Executor | None, max_batch_size: int) -> None:
    """Run `runtime` once alone and once batched on the inference thread, so first-call costs (allocator, graph
    init) do not land on a client. A batch of one and a batch of several can take different paths (onnx-int8
    runs a batch's rows on their own workers); a pair model warms up on pairs, the path it serves."""
    loop = asyncio.get_running_loop()
    warm = infer_fn(runtime)
    pair = takes_pairs(runtime)
    default: list[str | None] = [None]  # the model's own policy
    await loop.run_in_executor(executor, warm, ["warm-up"], default, ["warm-up"] if pair else None)
    if max_batch_size > 1:
        n = min(max_batch_size, 2 * max(1, runtime.row_workers))
        texts = [f"warm-up {i}" for i in range(n)]
        await loop.run_in_executor(executor, warm, texts, default * n, texts if pair else None)


def log_selection(name: str, path: str, chosen: Served) -> None:
    """Say which variant a model dir serves, why, and whether its report was measured on another CPU."""
    log.info("model %s: model dir %s serves %s (%s; from %s)", name, path, chosen.variant, chosen.why, chosen.report)
    policy = chosen.long_text or "the variant's own"
    log.info("model %s: long-text policy %s: %s", name, policy, chosen.long_text_why)
    if chosen.same_cpu is False:
        log.warning(
            "that report was measured on %s, not on this CPU: the fastest variant here may differ "
            "(re-run `qserve pipeline` here, or pass a variant dir)",
            chosen.measured_on,
        )


async def collect(retired: Retired) -> None:
    """Free a retired model's memory (the caller has dropped its references)."""
    # Most runtimes go with their last reference; handlers that got their answers from it drop theirs
    # within a few loop turns.
    for _ in range(20):
        if retired.released:
            log.info("released %s version %s", retired.name, retired.version)
            return
        await asyncio.sleep(0.01)
    # A reference cycle holds it, and since the post-warm-up gc.freeze() it sits in the permanent
    # generation, where no collection looks: thaw everything, collect, freeze what remains. One full
    # pass over the heap (a large one with torch loaded), so only when refcounting was not enough.
    for _ in range(3):
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        if retired.released:
            log.info("released %s version %s (a reference cycle: collected)", retired.name, retired.version)
            return
        await asyncio.sleep(0.05)
    log.warning(
        "%s version %s is still referenced after its release; its memory stays in use", retired.name, retired.version
    )


@dataclass(eq=False)
class ServeState:
    """Everything a running server knows: settings, metrics, the models by name, and their lifecycle."""

    config: ServeConfig
    metrics: Metrics
    loader: Loader = load_model
    repository: Repository | None = None
    """Where each name loads from; None: the one model config.variant_dir names."""
    selection: Served | None = None
    """Why the default model's variant was chosen, when the caller chose it (a model dir says so itself)."""
    on_load_failure: Callable[[BaseException], None] | None = None
    tracing: Tracing | None = None
    """OpenTelemetry tracing (tracing.py), or None: off, and a request pays one `is None` check for it."""
    arrivals: Arrivals = field(default_factory=Arrivals)
    http_load: HttpLoad = field(default_factory=HttpLoad)
    """uvicorn's open connections and request tasks (infra/connections.py registers them): who else is here."""
    executor: ThreadPoolExecutor | None = None
    models: dict[str, ServedModel] = field(default_factory=dict)
    default: str | None = None
    """The name of the model requests get when they name none: the first one."""
    shadows: dict[str, Shadow] = field(default_factory=dict)
    retired: list[Retired] = field(default_factory=list)
    loading: set[str] = field(default_factory=set)
    load_error: str | None = None
    started: bool = False
    closing: bool = False
    load_task: asyncio.Task | None = field(default=None, repr=False)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)
    # /v1/models' engine block; the Ray engine swaps in one that asks the Serve controller.
    engine_info: Callable[[], Awaitable[dict[str, Any]]] = field(default=_single_process_info, repr=False)
    admission: Admission = field(init=False, repr=False)
    """The one way in for every request, HTTP (qserve/serve/router.py) and gRPC alike (infra/admission.py)."""
    drain: Drain = field(init=False, repr=False)
    """The shutdown's drain (infra/drain.py): while it runs the server answers but is not ready."""

    def __post_init__(self) -> None:
        self.drain = Drain(self.config.drain_seconds, self.metrics)
        self.admission = Admission(
            api_key=self.config.api_key,
            max_body_bytes=self.config.max_body_bytes,
            metrics=self.metrics,
            arrivals=self.arrivals,
            tracing=self.tracing,
            queue_full=self.queue_full_retry_after,
        )
        if self.repository is None:
            self.repository = Repository.from_config(
                self.config.variant_dir, self.config.model_name, self.config.model_repository
            )
        names = [s.name for s in self.repository.initial]
        for name, ref in parse_shadows(self.config.shadow).items():
            if name not in names:
                raise QserveError(
                    f"--shadow {name}={ref}: no model is named {name!r}; this server serves "
                    f"{', '.join(map(repr, names))}"
                )

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        """Load every model and shadow reference (the lifespan runs this as a task, so the server answers
        meanwhile); the first model is the default."""
        repo = self.repository
        assert repo is not None
        try:
            loop = asyncio.get_running_loop()
            for name, ref in parse_shadows(self.config.shadow).items():
                shadow = Shadow(
                    name,
                    ref,
                    self.config.shadow_rate,
                    self.config.shadow_threads,
                    self.metrics,
                    self.config.device,
                    self.config.allow_extra_files,
                    max_windows=self.config.max_windows,
                )
                self.shadows[name] = shadow
                await loop.run_in_executor(None, shadow.load)
            self.default = repo.initial[0].name
            for source in repo.initial:
                await self.load(source.name, initial=True)
        except Exception as e:
            self.load_error = f"{type(e).__name__}: {e}"
            log.error("could not load %s: %s", self.config.model_repository or self.config.variant_dir, self.load_error)
            if self.on_load_failure is not None:
                self.on_load_failure(e)
            return
        self.started = True

    async def load(self, name: str, initial: bool = False) -> ServedModel:
        """Load (or reload: hot swap) model `name` from its directory; returns once it serves.

        A directory that fails verification or warm-up is refused (400, with the reason) and whatever
        served the name before keeps serving."""
        assert self.repository is not None
        async with self._lock:
            if self.closing:
                raise ApiError(503, "server is shutting down", {"Retry-After": "1"})
            source = self.repository.source(name)
            old = self.models.get(name)
            self.loading.add(name)
            try:
                new = await self._prepare(source)
            except Exception as e:
                self.metrics.loads.labels(name, "refused").inc()
                if initial:
                    raise
                keeps = f"; version {old.version} keeps serving" if old else ""
                log.error("load of %s from %s refused: %s: %s%s", name, source.path, type(e).__name__, e, keeps)
                raise ApiError(
                    400, f"load of model {name!r} refused ({source.path}): {type(e).__name__}: {e}{keeps}"
                ) from None
            finally:
                self.loading.discard(name)
            self.models[name] = new  # the switch: every request from here on gets the new model
            self.metrics.ready.labels(name).set(1)
            if old is not None:
                self.metrics.version.remove(name, old.version)
            self.metrics.version.labels(name, new.version).set(1)
            self.metrics.loads.labels(name, "swapped" if old else "loaded").inc()
            log.info(
                "serving %s version %s (%s, %s, labels %s, length buckets %s)%s",
                name,
                new.version,
                new.runtime.manifest.model_name,
                new.variant_dir,
                new.runtime.labels,
                new.runtime.buckets or "none (runs unpadded)",
                f", replacing version {old.version}" if old else "",
            )
            if old is not None:
                retired = await self._retire(old)
                del old  # the last strong reference this frame held: the collection can now free it
                await collect(retired)
            return new

    async def unload(self, name: str) -> None:
        """Stop serving `name`: later requests naming it get 404; what it accepted still finishes."""
        assert self.repository is not None
        async with self._lock:
            if name not in self.models:
                self.repository.source(name)  # 404 for a name this server does not know
            model = self.models.pop(name, None)
            if model is None:
                return
            self.metrics.ready.labels(name).set(0)
            self.metrics.version.remove(name, model.version)
            self.metrics.loads.labels(name, "unloaded").inc()
            log.info("unloading %s version %s", name, model.version)
            retired = await self._retire(model)
            del model
            await collect(retired)

    async def _prepare(self, source: ModelSource) -> ServedModel:
        """Resolve, load (side thread), warm up (inference thread) and start batching one model."""
        loop = asyncio.get_running_loop()
        vdir, selection = await loop.run_in_executor(None, resolve, source.path)
        if selection is None and self.selection is not None and source.name == self.default:
            selection = self.selection
        elif selection is not None:
            log_selection(source.name, source.path, selection)
        # A model dir's report may name the long-text policy to serve (one its gate verified); --long-text wins.
        long_text = self.config.long_text or (selection.long_text if selection else None)
        if self.config.require_gate:  # before seconds of loading: the manifest alone says (load verifies it)
            check_gate(await loop.run_in_executor(None, read_manifest, vdir), str(vdir), long_text)
        policy = None if long_text is None else str(long_text)
        cfg = dataclasses.replace(self.config, variant_dir=str(vdir), model_name=source.name, long_text=policy)
        # A side thread: loading takes seconds, and the inference thread keeps serving the old version.
        runtime = await loop.run_in_executor(None, self.loader, cfg)
        held = verdict_for(runtime.manifest, str(runtime.long_text))
        if held["verdict"] == UNGATED and runtime.manifest.gate:
            log.warning("model %s serves long-text policy %s ungated: %s", source.name, held["long_text"], held["why"])
        try:
            version = model_version(runtime.manifest)
            shadow = self.shadows.get(source.name)
            if shadow is not None:
                shadow.attach(version, list(runtime.labels), runtime.manifest.spec.bits)
            await warm_up(runtime, self.executor, cfg.batch_size)
        except Exception:
            await loop.run_in_executor(None, runtime.close)  # a model that cannot answer is not kept
            raise
        # What is loaded by now (libraries, model) lives as long as the server: move it out of the cyclic
        # GC, so full collections under load walk only what requests create.
        gc.collect()
        gc.freeze()
        offer = None if shadow is None else functools.partial(shadow.offer, version=version)
        mm = self.metrics.for_model(source.name)
        batcher = Batcher(
            infer_fn(runtime, offer, traced=self.tracing is not None),
            self.executor,
            max_batch_size=cfg.batch_size,
            max_wait_ms=cfg.wait_ms,
            max_queue=cfg.max_queue,
            metrics=mm,
            arriving=lambda: self.arrivals.n,
            lanes=runtime.lanes,
            lane_infer=infer_fn(runtime, offer, traced=self.tracing is not None, lane=True),
            crowded=self.http_load.busy,
        )
        batcher.start()
        return ServedModel(
            name=source.name,
            runtime=runtime,
            batcher=batcher,
            version=version,
            variant_dir=str(vdir),
            selection=selection,
            metrics=mm,
            shadow=shadow,
        )

    async def _retire(self, model: ServedModel) -> Retired:
        """Drain a model that no longer serves and close it; a weakref to its runtime says when it is gone."""
        loop = asyncio.get_running_loop()
        await model.batcher.close()  # what it accepted finishes on it
        if model.metrics is not None:
            model.metrics.queue_depth.release()
        await loop.run_in_executor(self.executor, model.runtime.close)
        retired = Retired(model.name, model.version, weakref.ref(model.runtime))
        self.retired = [*self.retired[-7:], retired]
        return retired

    async def stop(self) -> None:
        """Refuse new work, let the load finish, drain every model's queue, release the models."""
        self.closing = True
        for name in self.models:
            self.metrics.ready.labels(name).set(0)
        if self.load_task is not None:
            await self.load_task
        loop = asyncio.get_running_loop()
        async with self._lock:  # a repository load in progress finishes first
            for model in self.models.values():
                await model.batcher.close()
                await loop.run_in_executor(self.executor, model.runtime.close)
        for shadow in self.shadows.values():
            await loop.run_in_executor(None, shadow.close)
        if self.executor is not None:
            self.executor.shutdown(wait=True)

    # -- what routes ask -----------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        """Readiness (the probes): serving, and not draining for shutdown."""
        return self.started and not self.closing and not self.drain.active

    def not_ready_reason(self) -> str:
        if self.closing:
            return "server is shutting down"
        if self.drain.active:
            return f"draining for shutdown: requests are still answered for up to {self.drain.seconds:g} s"
        if self.load_error:
            return f"model failed to load: {self.load_error}"
        return "model is loading; retry when /ready answers 200"

    def queue_full_retry_after(self, name: str | None = None) -> int | None:
        """Retry-After seconds while not one more text fits in the queue of model `name` (None: the body will
        name it, so only when every model's queue is full), else None. router.py asks before reading the body."""
        if name is not None:
            model = self.models.get(name)
            batchers = [model.batcher] if model is not None else []
        else:
            batchers = [m.batcher for m in self.models.values()]
        if not batchers or not all(b.full for b in batchers):
            return None
        return min(b.retry_after_s() for b in batchers)

    def require_ready(self) -> None:
        """Work is answered while serving, through a drain too; 503 while loading or stopped."""
        if not self.started or self.closing:
            if self.closing:
                self.drain.count("refused")
            raise ApiError(503, self.not_ready_reason(), {"Retry-After": "1"})

    def model(self, name: str | None = None, request: Request | None = None) -> ServedModel:
        """The model called `name` (None: the default); 503 while not ready, 404 for a name not served.
        With `request`, the request's metrics carry the model's name."""
        self.require_ready()
        if name is None:
            name = self.default
        model = self.models.get(name)  # type: ignore[arg-type]
        if model is None:
            serving = ", ".join(map(repr, self.models)) or "none"
            if name == self.default:
                raise ApiError(
                    404, f"the default model {name!r} is unloaded; name a model (serving: {serving}) or load it again"
                )
            if len(self.models) == 1:
                raise ApiError(404, f"unknown model {name!r}; this server serves exactly one model: {serving}")
            raise ApiError(404, f"unknown model {name!r}; this server serves {serving}")
        if request is not None:
            request.state.qserve_model = model.name
        return model

    async def submit(self, req: InferenceRequest) -> Answer:
        """Queue the request's texts on the model serving `req.model` now (after a hot swap, the new one) and return
        the Answer; every failure is an ApiError (gRPC maps its status). Resolved once, against that model, in this
        order, each a 422 naming the field as the request's origin names it: the threshold (multi-label only), the
        protocol's outputs, the long-text policy, the inputs' form (pairs for a pair model)."""
        self.require_ready()
        scope = req.scope
        self.arrivals.end(scope)  # from here on this request is queued, not arriving
        # No await between this lookup and the enqueue: a model in self.models is always accepting.
        current = self.models.get(req.model)
        if current is None:
            raise ApiError(404, f"model {req.model!r} was unloaded; serving: {', '.join(map(repr, self.models))}")
        state = scope.setdefault("state", {})
        state["qserve_model"] = current.name  # what request.state.qserve_model reads on HTTP
        rt = current.runtime
        try:
            threshold = problemtypes.threshold_for(
                rt.problem_type,
                req.threshold,
                self.config.threshold,
                rt.manifest.thresholds,
                "threshold",
                f"model {current.name!r}",
            )
        except QserveError as e:
            raise ApiError(422, str(e)) from None
        names = req.outputs(current) if req.outputs is not None else ()
        policy = current.check_policy(req.long_text, req.origin.long_text_field)
        check_same_inputs(current, req.pairs)
        inline = self._alone(scope, current, req.texts, policy)
        trace = state.get(TRACE_KEY) if self.tracing is not None else None  # all tracing costs when it is off
        if trace is None:
            result = await self._submit(current, req, policy, inline)
        else:
            trace.queued()
            result = await self._submit(current, req, policy, inline)
            trace.answered(result.phases)
        return Answer(
            model=current, policy=policy or str(rt.long_text), threshold=threshold, outputs=names, result=result
        )

    def _alone(
        self, scope: MutableMapping[str, Any], current: ServedModel, texts: list[str], policy: str | None
    ) -> bool:
        """May this request run on the event loop (Batcher._run_inline)? Only an HTTP request alone in the
        server (one connection, one request in flight: infra/connections.py counts them), asking one forward
        (one text, not a windows policy), while no model runs or queues anything and no load or swap is under
        way: then nobody waits on the blocked loop but this client, and its answer is the same batch of one."""
        return (
            self.config.inline_lone
            and len(texts) == 1
            and scope.get("type") == "http"
            and self.http_load.alone()
            and not self._lock.locked()
            and longtext.parse(policy or current.runtime.long_text).kind != "windows"
            and all(m.batcher.idle for m in self.models.values())
        )

    async def _submit(
        self, current: ServedModel, req: InferenceRequest, policy: str | None, inline: bool
    ) -> Classification:
        timeout = self.config.request_timeout_s
        if req.timeout_s is not None and req.timeout_s < timeout:
            timeout = max(req.timeout_s, 1e-3)  # a deadline already past still times out (0 is "no timeout")
        try:
            return await current.batcher.submit(req.texts, timeout, policy, req.pairs, inline)
        except QueueFull as e:
            self.metrics.reject("queue_full", current.name)
            raise ApiError(429, str(e), {"Retry-After": str(e.retry_after_s)}) from None
        except NotAccepting:
            raise ApiError(503, "server is shutting down; retry on another replica", {"Retry-After": "1"}) from None
        except TimeoutError:
            why = "--request-timeout-s" if timeout == self.config.request_timeout_s else "the client's deadline"
            raise ApiError(504, f"no answer within {timeout:g} s ({why}); the model may be overloaded") from None
        except Exception as e:
            rid = req.request_id
            log.error("request %s (%s): inference failed: %s: %s", rid, req.origin.protocol, type(e).__name__, e)
            raise ApiError(
                500,
                f"inference failed for this request ({type(e).__name__}); "
                f"quote request id {rid}. Other requests are unaffected",
            ) from None

    def index(self) -> list[dict[str, str]]:
        """The repository index (Triton's shape): every model this server can load, and its state."""
        assert self.repository is not None
        names = [s.name for s in self.repository.known()]
        names += [n for n in self.models if n not in names]
        out = []
        for name in names:
            model = self.models.get(name)
            if model is not None:
                state, reason = "READY", ""
            else:
                state, reason = ("LOADING", "loading") if name in self.loading else ("UNAVAILABLE", "unloaded")
            out.append({"name": name, "version": model.version if model else "", "state": state, "reason": reason})
        return out
