"""What loading and releasing a served model needs beside the state's own bookkeeping (state.py): warm-up on the
inference thread, the log line of a model dir's chosen variant, and freeing a retired model's memory.

    python -m pytest tests/integration/test_serve_lifecycle.py -q
"""

from __future__ import annotations

import asyncio
import gc
import logging
from concurrent.futures import Executor

from qserve.serve.core.pairs import takes_pairs
from qserve.serve.core.repository import Selection
from qserve.serve.core.served_model import ModelRuntime, Retired, infer_fn

log = logging.getLogger("qserve.serve")


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


def log_selection(name: str, path: str, selection: Selection) -> None:
    """Say which variant a model dir serves, why, and whether its report was measured on another CPU."""
    log.info("model %s: model dir %s serves %s (%s; from %s)", name, path, selection["variant"], selection["why"],
             selection["report"])
    if selection["same_cpu"] is False:
        log.warning("that report was measured on %s, not on this CPU: the fastest variant here may differ "
                    "(re-run `qserve pipeline` here, or pass a variant dir)", selection["measured_on"])


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
    # pass over the heap (~0.5 s with torch loaded, on 2 cores), so only when refcounting was not enough.
    for attempt in range(3):
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        if retired.released:
            log.info("released %s version %s (a reference cycle: collected)", retired.name, retired.version)
            return
        await asyncio.sleep(0.05)
    log.warning("%s version %s is still referenced after its release; its memory stays in use",
                retired.name, retired.version)
