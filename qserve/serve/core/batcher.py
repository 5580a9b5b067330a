"""Dynamic batching: texts from concurrent requests are gathered into one forward pass.

    python -m pytest tests/integration/test_serve_batching.py -q

One bounded FIFO of texts, one collector, the single inference thread (lane threads under load). A failing batch of
several requests is re-run request by request, so only the request that breaks the model fails (500) and the
collector never dies; why it is built so: docs/architecture.md ("Batching").
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import TYPE_CHECKING, Protocol

from qserve.runtime.base import Classification
from qserve.runtime.threadnames import named
from qserve.serve.core.pending import Item, Pending, infer_args

if TYPE_CHECKING:
    from qserve.serve.infra.metrics import ModelMetrics

log = logging.getLogger("qserve.serve")


class InferFn(Protocol):
    """What the batcher runs on the inference thread: synchronous, CPU-heavy.

    (texts, their long-text policies (None = the runtime's default)[, their text pairs: only for a pair model's
    batch]) -> the Classification of the texts, in order (when tracing, its phases are the batch's steps, which
    every request in the batch gets in its own Classification.phases)."""

    def __call__(
        self, texts: list[str], policies: list[str | None], pairs: list[str] | None = None
    ) -> Classification: ...


Started = tuple[float, "asyncio.Future[Classification]"]
"""A batch on the inference thread: (perf_counter when it was submitted, the future of InferFn's result)."""


class QueueFull(Exception):
    def __init__(self, depth: int, limit: int, retry_after_s: int):
        super().__init__(f"inference queue is full ({depth} of {limit} texts waiting); retry after {retry_after_s} s")
        self.retry_after_s = retry_after_s


class NotAccepting(Exception):
    """The batcher is draining for shutdown."""


class Batcher:
    def __init__(
        self,
        infer: InferFn,
        executor: Executor | None,
        *,
        max_batch_size: int,
        max_wait_ms: float,
        max_queue: int,
        metrics: ModelMetrics | None = None,
        arriving: Callable[[], int] | None = None,
        lanes: int = 1,
        lane_infer: InferFn | None = None,
        crowded: Callable[[], bool] | None = None,
    ):
        self.infer = infer
        # Lanes (a busy server): up to `lanes` batches at once, each run by `lane_infer` on a lane thread of
        # its own and whole on one single-threaded worker, while `crowded()` says other requests are in the
        # server. Else one batch at a time on every worker (the lone request's lower latency).
        self.lanes = lanes if lane_infer is not None and crowded is not None else 1
        self.lane_infer: InferFn = lane_infer or infer
        self.crowded = crowded
        self._lane_pool: Executor | None = None
        self._lane_tasks: set[asyncio.Task] = set()
        self.executor = executor
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_ms / 1000.0
        self.max_queue = max_queue
        self.metrics = metrics
        self.arriving = arriving  # requests on their way to the queue (see admission.Arrivals)
        self._items: deque[Item] = deque()
        self._wake = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task | None = None
        self._batch_s_ema = 0.05  # seed for Retry-After until real batches are timed
        self._running = False  # a batch is in the inference thread
        self._launched: tuple[list[Item], Started | None] | None = None  # a batch enqueue() already started

    # -- producer side (event loop) ----------------------------------------------------
    @property
    def depth(self) -> int:
        return len(self._items)

    @property
    def idle(self) -> bool:
        """Nothing queued, nothing on the inference thread, not draining."""
        return (
            not self._items
            and not self._running
            and self._launched is None
            and not self._closing
            and not self._lane_tasks
        )

    @property
    def full(self) -> bool:
        """No room for even one more text: a request can be refused before its body is read."""
        return len(self._items) >= self.max_queue

    def start(self) -> None:
        if self.lanes > 1:
            self._lane_pool = ThreadPoolExecutor(
                self.lanes, thread_name_prefix="qserve-lane", initializer=named("qserve-lane")
            )
        self._task = asyncio.get_running_loop().create_task(self._run(), name="qserve-batcher")

    def enqueue(self, texts: list[str], policy: str | None = None, pairs: list[str] | None = None) -> asyncio.Future:
        """Queue texts (each read by `policy`, None = the runtime's default; with its text pair for a pair model)
        at once or raise QueueFull/NotAccepting; never waits."""
        if self._closing:
            raise NotAccepting("server is shutting down")
        if len(self._items) + len(texts) > self.max_queue:
            raise QueueFull(len(self._items), self.max_queue, self.retry_after_s())
        loop = asyncio.get_running_loop()
        pending = Pending(len(texts), loop.create_future())
        now = loop.time()
        self._items.extend(
            Item(pending, i, t, now, policy, None if pairs is None else pairs[i]) for i, t in enumerate(texts)
        )
        self._set_depth()
        if (
            not self._running
            and self._launched is None
            and len(self._items) >= self._fill_target()
            and not self._narrow()
        ):
            # The batch is complete: start its forward pass now, from this very call. Waking the
            # collector instead would start it only after everything else this event-loop turn
            # does, such as refusing a flood of other requests.
            self._launched = self._take_batch(loop)
        self._wake.set()
        return pending.future

    async def submit(
        self,
        texts: list[str],
        timeout_s: float | None = None,
        policy: str | None = None,
        pairs: list[str] | None = None,
        inline: bool = False,
    ) -> Classification:
        """The request's texts answered: their rows of the batches they ran in (Classification.phases: the
        steps of those batches, when tracing). `inline`: the caller found this request alone in the server
        and its work bounded (one forward); if this batcher is idle too, it runs here, on the event loop."""
        if inline and self.idle:
            return await self._run_inline(texts, policy, pairs)
        fut = self.enqueue(texts, policy, pairs)
        if not timeout_s:
            return await fut
        if not hasattr(asyncio, "timeout"):  # Python 3.10
            return await asyncio.wait_for(fut, timeout_s)
        # asyncio.timeout, not wait_for: on 3.11 wait_for awaits a waiter future of its own that the
        # answer's callback resolves, a further turn of the event loop before the request resumes. On
        # timeout the task's cancellation cancels `fut` as wait_for did, so fill() skips it.
        async with asyncio.timeout(timeout_s):
            return await fut

    async def _run_inline(self, texts: list[str], policy: str | None, pairs: list[str] | None) -> Classification:
        """Run a lone request's batch on the calling (event-loop) thread: no hop to the inference thread and
        back, whose thread wake-ups cost a measurable share of a lone request (docs/serving.md). Only for a request
        alone in the server, so nobody waits on the blocked loop but the one client being answered; the
        batch is the same one the inference thread would run (same rows, same answer, same metrics), and
        `_running` keeps the collector and other requests off the runtime meanwhile."""
        loop = asyncio.get_running_loop()
        pending = Pending(len(texts), loop.create_future())
        now = loop.time()
        batch = [Item(pending, i, t, now, policy, None if pairs is None else pairs[i]) for i, t in enumerate(texts)]
        if self.metrics is not None:
            self.metrics.queue_wait.observe(0.0)
            self.metrics.inline.inc()
        done: asyncio.Future = loop.create_future()
        t0 = time.perf_counter()
        self._running = True
        try:
            done.set_result(self.infer(*infer_args(batch)))
        except Exception as e:
            done.set_exception(e)
        finally:
            self._running = False
        await self._run_batch(batch, isolate=False, started=(t0, done))
        return await pending.future

    def retry_after_s(self) -> int:
        batches_ahead = math.ceil(max(1, len(self._items)) / self.max_batch_size)
        return max(1, math.ceil(batches_ahead * self._batch_s_ema))

    async def close(self) -> None:
        """Stop accepting, finish everything already queued, then return."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            await self._task

    # -- collector (one task) -----------------------------------------------------------
    def _set_depth(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_depth.set(len(self._items))

    def _narrow(self) -> bool:
        """Run the next batch in a lane: lanes exist, and a lane is busy or other requests are in the server."""
        return self.lanes > 1 and (bool(self._lane_tasks) or bool(self.crowded and self.crowded()))

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._drop_dead()
            if not self._items and self._launched is None:
                if self._closing:
                    if self._lane_tasks:
                        await asyncio.gather(*self._lane_tasks, return_exceptions=True)
                    if self._lane_pool is not None:
                        self._lane_pool.shutdown(wait=False)
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            if self._launched is None and len(self._lane_tasks) >= self.lanes:
                self._wake.clear()  # every lane busy: a finishing lane wakes this collector
                await self._wake.wait()
                continue
            # Wait for the batch to fill, but never past max_wait after the oldest item queued.
            deadline = self._items[0].enqueued + self.max_wait_s if self._items else 0.0
            target = self._lane_cap() if self._narrow() else self._fill_target()
            while len(self._items) < target and not self._closing and self._launched is None:
                if self.arriving is not None and self.arriving() <= 0:
                    break  # nobody else is on the way: waiting would only add latency
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                # A timer that sets the event, not wait_for: wait_for wraps the wait in a task, which
                # costs extra event-loop turns before this collector sees a full queue.
                self._wake.clear()
                timer = loop.call_later(remaining, self._wake.set)
                try:
                    await self._wake.wait()
                finally:
                    timer.cancel()
            if self._launched is None and self._narrow():
                batch, started = self._take_batch(loop, lane=True)
                if batch:
                    if self.metrics is not None:
                        self.metrics.lane.inc()
                    task = loop.create_task(self._run_lane(batch, started))
                    self._lane_tasks.add(task)
                continue
            # Here no lane is busy (_narrow() would be true): a batch on every worker never runs beside one.
            batch, started = self._launched or self._take_batch(loop)
            self._launched = None
            if batch:
                self._running = True
                try:
                    await self._guarded(batch, started)
                finally:
                    self._running = False

    async def _guarded(self, batch: list[Item], started: Started | None, lane: bool = False) -> None:
        try:
            await self._run_batch(batch, isolate=True, started=started, lane=lane)
        except Exception:  # the collector must outlive any bug in a batch
            log.exception("batch collector error")
            for it in batch:
                it.pending.fail(RuntimeError("internal batching error"))

    async def _run_lane(self, batch: list[Item], started: Started | None) -> None:
        try:
            await self._guarded(batch, started, lane=True)
        finally:
            task = asyncio.current_task()
            if task is not None:
                self._lane_tasks.discard(task)
            self._wake.set()

    def _lane_cap(self) -> int:
        """Texts a lane takes at once: a quarter of a batch with two lanes (8 of 32), so while one lane's
        answers go out and its clients come back, the other lane and the queue keep both workers busy; a
        lane holding half the clients' texts leaves the other lane idle between its small batches."""
        return max(1, self.max_batch_size // (2 * self.lanes))

    def _fill_target(self) -> int:
        # A full queue cannot grow, so waiting for more would only delay the admitted texts.
        return min(self.max_batch_size, self.max_queue)

    def _take_batch(self, loop: asyncio.AbstractEventLoop, lane: bool = False) -> tuple[list[Item], Started | None]:
        """Pop the next batch and submit it to the inference thread at once: (items, (t0, future))."""
        cap = self._lane_cap() if lane else self.max_batch_size
        batch = [self._items.popleft() for _ in range(min(cap, len(self._items)))]
        self._set_depth()
        batch = [it for it in batch if not it.pending.future.done()]
        if not batch:
            return batch, None
        now = loop.time()
        if self.metrics is not None:
            for it in batch:
                self.metrics.queue_wait.observe(now - it.enqueued)
        pool, fn = self._runner(lane)
        return batch, (time.perf_counter(), loop.run_in_executor(pool, fn, *infer_args(batch)))

    def _runner(self, lane: bool) -> tuple[Executor | None, InferFn]:
        """Where a batch runs and by what: a lane thread and lane_infer, or the inference thread and infer."""
        return (self._lane_pool, self.lane_infer) if lane else (self.executor, self.infer)

    def _drop_dead(self) -> None:
        while self._items and self._items[0].pending.future.done():
            self._items.popleft()
            self._set_depth()

    async def _run_batch(
        self, batch: list[Item], isolate: bool, started: Started | None = None, lane: bool = False
    ) -> None:
        loop = asyncio.get_running_loop()
        texts = [it.text for it in batch]
        pool, fn = self._runner(lane)
        t0, fut = started or (time.perf_counter(), loop.run_in_executor(pool, fn, *infer_args(batch)))
        try:
            result: Classification = await fut
            if any(
                len(x) != len(texts)
                for x in (result.probs, result.logits, result.truncated, result.tokens, result.windows)
            ):
                raise RuntimeError(f"runtime returned {len(result.probs)} rows for {len(texts)} texts")
            results = result.results()
        except Exception as e:
            if self.metrics is not None:
                self.metrics.batch_failures.inc()
            owners = list(dict.fromkeys(it.pending for it in batch))
            if isolate and len(owners) > 1:
                log.warning(
                    "batch of %d texts from %d requests failed (%s: %s); re-running each request alone",
                    len(texts),
                    len(owners),
                    type(e).__name__,
                    e,
                )
                for owner in owners:
                    await self._run_batch([it for it in batch if it.pending is owner], isolate=False, lane=lane)
                return
            for owner in owners:
                owner.fail(e)
            return
        elapsed = time.perf_counter() - t0
        self._batch_s_ema = 0.8 * self._batch_s_ema + 0.2 * elapsed
        if self.metrics is not None:
            self.metrics.batch_size.observe(len(texts))
            self.metrics.inference.observe(elapsed)
            self.metrics.texts.inc(len(texts))
            self.metrics.truncated.inc(sum(r.truncated for r in results))
        for it, r in zip(batch, results):
            it.pending.fill(it.index, r, result)
