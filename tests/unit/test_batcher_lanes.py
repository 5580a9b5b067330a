"""The batcher's lanes: under load, small batches run at once on lane threads; alone, one batch on every worker.

    python -m pytest tests/unit/test_batcher_lanes.py -q

The real Batcher on a real event loop and real threads; what it runs is a recording InferFn (each text's row
is made from the text itself, so a row handed to the wrong request shows), because what is checked here is
the scheduling: which function ran each batch, on which thread, how many at once, of what size. That lanes
give the same answers on the real runtimes is tests/integration/test_serve_invariance.py (onnx-int8) and
test_serve_buckets.py (ov-int8, bit for bit).
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from qserve.runtime.base import Classification
from qserve.serve.core.batcher import Batcher


class Recorder:
    """Two InferFns (wide, lane) that record each batch: (kind, thread name, texts); `active` counts the batches
    running now by kind, `peak` the most lane batches at once; `meet` lane batches wait on a barrier first
    (which only that many batches running at once can pass); a text "boom" raises."""

    def __init__(self, meet: int = 0):
        self.lock = threading.Lock()
        self.calls: list[tuple[str, str, list[str]]] = []
        self.active = {"wide": 0, "lane": 0}
        self.overlap = False  # a wide batch ever ran beside a lane
        self.peak = 0
        self.barrier = threading.Barrier(meet) if meet else None
        self.release = threading.Event()
        self.release.set()

    def fn(self, kind: str):
        def infer(texts, policies, pairs=None):
            with self.lock:
                self.active[kind] += 1
                self.calls.append((kind, threading.current_thread().name, list(texts)))
                self.overlap |= self.active["wide"] > 0 and self.active["lane"] > 0
                self.peak = max(self.peak, self.active["lane"])
            try:
                if (
                    kind == "lane"
                    and self.barrier is not None
                    and sum(k == "lane" for k, _, _ in self.calls) <= self.barrier.parties
                ):
                    self.barrier.wait(timeout=30)  # BrokenBarrierError unless `meet` lane batches run at once
                self.release.wait(timeout=30)
                if "boom" in texts and len(texts) > 1:
                    raise RuntimeError("a bad text in the batch")
                if texts == ["boom"]:
                    raise RuntimeError("the bad text alone")
                rows = np.array(
                    [[len(t), float(t.split()[-1]) if t[-1].isdigit() else -1.0] for t in texts], dtype=np.float32
                )
                n = len(texts)
                return Classification(probs=rows, truncated=[False] * n, tokens=[1] * n, windows=[1] * n, logits=rows)
            finally:
                with self.lock:
                    self.active[kind] -= 1

        return infer


def _batcher(rec: Recorder, crowded: list[bool], executor, lanes: int = 2, max_batch_size: int = 32) -> Batcher:
    return Batcher(
        rec.fn("wide"),
        executor,
        max_batch_size=max_batch_size,
        max_wait_ms=0,
        max_queue=256,
        lanes=lanes,
        lane_infer=rec.fn("lane"),
        crowded=lambda: crowded[0],
    )


def _check_rows(texts: list[str], results: list[Classification]) -> None:
    for t, r in zip(texts, results):  # each request got its own text's row
        assert r.probs.tolist() == [[len(t), float(t.split()[-1])]]


def _twenty_at_once(rec: Recorder, crowded: bool, executor) -> list[str]:
    """20 one-text requests submitted together, each answered its own row; the texts."""
    texts = [f"review {i}" for i in range(20)]

    async def go():
        b = _batcher(rec, [crowded], executor)
        b.start()
        results = await asyncio.gather(*(b.submit([t]) for t in texts))
        await b.close()
        return results

    _check_rows(texts, asyncio.run(go()))
    return texts


@pytest.fixture
def executor():
    with ThreadPoolExecutor(1, thread_name_prefix="qserve-infer") as ex:
        yield ex


def test_a_crowded_server_runs_small_batches_two_at_once_on_lane_threads(executor):
    rec = Recorder(meet=2)  # the first two lane batches must be running at the same time to pass
    texts = _twenty_at_once(rec, crowded=True, executor=executor)
    assert {k for k, _, _ in rec.calls} == {"lane"} and rec.peak == 2
    assert all(name.startswith("qserve-lane") for _, name, _ in rec.calls)
    assert max(len(t) for _, _, t in rec.calls) == 8  # a lane takes a quarter of a batch of 32
    assert sorted(t for _, _, batch in rec.calls for t in batch) == sorted(texts)


def test_a_server_with_one_request_at_a_time_runs_one_batch_on_every_worker(executor):
    rec = Recorder()
    _twenty_at_once(rec, crowded=False, executor=executor)
    assert [(k, len(t)) for k, _, t in rec.calls] == [("wide", 20)]  # one batch, all queued texts
    assert rec.calls[0][1].startswith("qserve-infer")


def test_without_a_lane_runner_or_with_one_worker_there_are_no_lanes(executor):
    rec = Recorder()
    one = _batcher(rec, [True], executor, lanes=1)
    none = Batcher(rec.fn("wide"), executor, max_batch_size=32, max_wait_ms=0, max_queue=256, lanes=2)
    assert one.lanes == 1 and none.lanes == 1


def test_a_batch_on_every_worker_never_runs_beside_a_lane(executor):
    """The load drops while a lane runs: new texts take the free lane (a lane is busy, so the workers are
    shared); only once every lane is done does a batch take every worker."""
    rec = Recorder()
    crowded = [True]

    async def go():
        b = _batcher(rec, crowded, executor)
        b.start()
        rec.release.clear()  # hold the lanes until the load has dropped
        first = [asyncio.ensure_future(b.submit([f"early {i}"])) for i in range(4)]
        for _ in range(500):
            await asyncio.sleep(0.01)
            if rec.active["lane"]:
                break
        crowded[0] = False
        second = [asyncio.ensure_future(b.submit([f"second {i}"])) for i in range(4)]
        for _ in range(500):
            await asyncio.sleep(0.01)
            if rec.active["lane"] == 2:
                break
        rec.release.set()
        done = await asyncio.gather(*first, *second)
        last = await asyncio.gather(*(b.submit([f"last {i}"]) for i in range(4)))
        await b.close()
        return done + last

    results = asyncio.run(go())
    _check_rows([f"{w} {i}" for w in ("early", "second", "last") for i in range(4)], results)
    assert [(k, len(t)) for k, _, t in rec.calls] == [("lane", 4), ("lane", 4), ("wide", 4)] and not rec.overlap


def test_a_failing_lane_batch_fails_only_the_request_that_breaks_it(executor):
    rec = Recorder()

    async def go():
        b = _batcher(rec, [True], executor)
        b.start()
        texts = ["review 1", "boom", "review 3", "review 4"]
        out = await asyncio.gather(*(b.submit([t]) for t in texts), return_exceptions=True)
        await b.close()
        return out

    out = asyncio.run(go())
    assert isinstance(out[1], RuntimeError) and "alone" in str(out[1])
    _check_rows(["review 1", "review 3", "review 4"], [out[0], out[2], out[3]])
    assert {k for k, _, _ in rec.calls} == {"lane"}  # the re-runs stay in the lanes


def test_close_answers_what_the_lanes_hold_then_returns(executor):
    rec = Recorder()

    async def go():
        b = _batcher(rec, [True], executor)
        b.start()
        rec.release.clear()
        futs = [asyncio.ensure_future(b.submit([f"review {i}"])) for i in range(12)]
        await asyncio.sleep(0.05)
        closing = asyncio.ensure_future(b.close())
        await asyncio.sleep(0.05)
        assert not closing.done()  # lanes still hold texts
        rec.release.set()
        await closing
        assert not b._lane_tasks  # every lane batch finished before close() returned
        return await asyncio.gather(*futs)

    results = asyncio.run(go())
    _check_rows([f"review {i}" for i in range(12)], results)
