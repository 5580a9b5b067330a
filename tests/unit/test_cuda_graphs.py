"""The CUDA-graph decisions that need no GPU (qserve/runtime/graphs.py): modes, buckets, which graph serves which
rows, the bounds, the filler rows, auto's choice. The capture itself is CUDA's; here a recording stand-in.

    python -m pytest tests/unit/test_cuda_graphs.py -q
"""

from __future__ import annotations

import numpy as np
import pytest

from qserve import QserveError
from qserve.runtime import RuntimeOptions, graphs
from qserve.runtime.graphs import Graphs, batch_buckets, capture_order, choose, split, stage


class Replay:
    """A stand-in graph: records the blocks it was given and answers each row's token sum (so a row's answer is
    its own tokens' and filler rows are visible)."""

    def __init__(self, shape: graphs.Shape, nbytes: int, calls: list):
        self.shape, self.nbytes, self.calls = shape, nbytes, calls
        self.staging = np.zeros((2, *shape), dtype=np.int64)  # a host buffer run() stages each block into

    def __call__(self, block: np.ndarray, rows: int) -> np.ndarray:
        assert block.shape[1:] == self.shape and block is self.staging  # the static shape, staged in place
        self.calls.append((self.shape, rows, block.copy()))
        return (block[0] * block[1]).sum(axis=1, keepdims=True)[:rows].astype(np.float32)


def _capture(calls: list, nbytes: int = 1 << 20, fail: set | None = None):
    captured: list = []

    def capture(shape):
        if fail and shape in fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        captured.append(shape)
        return Replay(shape, nbytes, calls)

    capture.captured = captured  # type: ignore[attr-defined]
    return capture


def _batch(lengths: list[int], width: int, pad_id: int = 0) -> dict[str, np.ndarray]:
    ids = np.full((len(lengths), width), pad_id, dtype=np.int64)
    mask = np.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, :n] = np.arange(1, n + 1) + 100 * i
        mask[i, :n] = 1
    return {"input_ids": ids, "attention_mask": mask}


def _eager(batch: dict[str, np.ndarray]) -> np.ndarray:
    return (batch["input_ids"] * batch["attention_mask"]).sum(axis=1, keepdims=True).astype(np.float32)


def test_modes_parse_and_name_the_flag():
    assert [graphs.parse_mode(m) for m in (None, "auto", "OFF", " graphs ", "compile")] == [
        "auto",
        "auto",
        "off",
        "graphs",
        "compile",
    ]
    with pytest.raises(QserveError, match="--cuda-graphs must be one of auto, off, graphs, compile"):
        graphs.parse_mode("cudagraph")


def test_runtime_options_check_the_graph_knobs():
    assert RuntimeOptions().cuda_graphs == "auto"
    assert RuntimeOptions(cuda_graphs="Graphs").cuda_graphs == "graphs"
    for bad, words in (
        ({"cuda_graphs": "on"}, "--cuda-graphs"),
        ({"max_graphs": 0}, "max_graphs"),
        ({"max_graphs": True}, "max_graphs"),
        ({"graph_memory_mb": 0}, "graph_memory_mb"),
        ({"graph_memory_mb": "lots"}, "graph_memory_mb"),
    ):
        with pytest.raises(QserveError, match=words):
            RuntimeOptions(**bad)


def test_batch_buckets_and_the_capture_order():
    assert batch_buckets(1) == (1,)
    assert batch_buckets(32) == (1, 2, 4, 8, 16, 32)
    assert batch_buckets(48) == (1, 2, 4, 8, 16, 32, 48)
    with pytest.raises(QserveError):
        batch_buckets(0)
    # every length at batch 1 first: under a tight count bound, every text still has a graph of its own length
    assert capture_order((128, 32, 64), (4, 1, 2), 4) == [(1, 32), (1, 64), (1, 128), (2, 32)]
    assert len(capture_order((32, 64, 128), batch_buckets(256), 64)) == 27


@pytest.mark.parametrize("usable", [(1, 2, 4, 8, 16, 32), (1, 4), (2, 8), (32,), (1,)])
def test_split_covers_every_row_once_in_usable_buckets(usable):
    for n in range(1, 140):
        chunks = split(n, usable)
        assert sum(r for r, _ in chunks) == n
        assert all(b in usable and r <= b for r, b in chunks)
        # whole chunks of the largest bucket, then at most one chunk padded up
        assert all(b == r == max(usable) for r, b in chunks[:-1])
    assert split(45, batch_buckets(32)) == [(32, 32), (13, 16)]
    assert split(5, ()) == [(5, None)] and split(0, (1, 2)) == []


def test_stage_keeps_rows_and_adds_filler_rows_that_attend_to_one_token():
    batch = {**_batch([3, 5], 6, pad_id=7), "token_type_ids": np.ones((2, 6), dtype=np.int64)}
    names = ["input_ids", "attention_mask", "token_type_ids"]
    block = stage(batch, names, 1, 2, 4, pad_id=7)
    assert block.shape == (3, 4, 6) and block.dtype == np.int64
    assert (block[0, 0] == batch["input_ids"][1]).all() and (block[1, 0] == batch["attention_mask"][1]).all()
    assert (block[0, 1:] == 7).all()  # filler: the pad id
    assert (block[1, 1:, 0] == 1).all() and (block[1, 1:, 1:] == 0).all()  # attends to its first token only
    assert (block[2, 1:] == 0).all()
    out = np.full((3, 4, 6), -1, dtype=np.int64)
    assert stage(batch, names, 1, 2, 4, pad_id=7, out=out) is out and (out == block).all()


def test_graphs_serve_rows_from_their_length_and_batch_buckets():
    calls: list = []
    g = Graphs(_capture(calls), ["input_ids", "attention_mask"], 0, lengths=(8, 16), batches=batch_buckets(8))
    g.prepare()
    assert sorted(g.graphs) == [(b, n) for b in (1, 2, 4, 8) for n in (8, 16)]
    batch = _batch([3, 8, 5, 1, 7, 2, 8, 4, 6, 2, 1], 8)  # 11 rows at length 8: one 8-row replay, then 3 in 4
    out = g.run(batch, _eager)
    assert (out == _eager(batch)).all()  # each row its own answer, in order; filler rows dropped
    assert [(shape, rows) for shape, rows, _ in calls] == [((8, 8), 8), ((4, 8), 3)]
    assert g.eager_rows == 0
    summary = g.summary()
    assert summary["count"] == 8 and summary["captured"][0] == "1x8" and summary["refused"] == {}


def test_bounds_refuse_instead_of_evicting_and_rows_use_smaller_graphs():
    calls: list = []
    g = Graphs(_capture(calls), ["input_ids", "attention_mask"], 0, lengths=(8,), batches=(1, 2, 4, 8), max_graphs=2)
    g.prepare()
    assert sorted(g.graphs) == [(1, 8), (2, 8)]
    assert all("count bound" in why for why in g.refused.values()) and set(g.refused) == {(4, 8), (8, 8)}
    batch = _batch([2, 3, 4, 5, 6], 8)
    assert (g.run(batch, _eager) == _eager(batch)).all()
    assert [rows for _, rows, _ in calls] == [2, 2, 1]
    # the memory bound: the capture that crosses it is the last one
    mem = Graphs(
        _capture([], nbytes=3 << 20),
        ["input_ids", "attention_mask"],
        0,
        lengths=(8,),
        batches=(1, 2, 4, 8),
        memory_mb=5,
    )
    mem.prepare()
    assert sorted(mem.graphs) == [(1, 8), (2, 8)] and "memory bound" in mem.refused[(4, 8)]


def test_a_failed_capture_is_recorded_and_a_length_without_graphs_runs_eager():
    calls: list = []
    g = Graphs(
        _capture(calls, fail={(4, 8), (1, 16), (2, 16)}),
        ["input_ids", "attention_mask"],
        0,
        lengths=(8, 16),
        batches=(1, 2, 4),
    )
    g.prepare()
    assert "capture failed: RuntimeError" in g.refused[(4, 8)]
    b8 = _batch([1, 2, 3, 4, 5], 8)
    assert (g.run(b8, _eager) == _eager(b8)).all() and [r for _, r, _ in calls] == [2, 2, 1]
    b16 = _batch([10, 12, 3], 16)  # (4, 16) was captured, so its rows still run on a graph
    calls.clear()
    assert (g.run(b16, _eager) == _eager(b16)).all() and [s for s, _, _ in calls] == [(4, 16)]
    g2 = Graphs(
        _capture([], fail={(1, 16), (2, 16), (4, 16)}),
        ["input_ids", "attention_mask"],
        0,
        lengths=(8, 16),
        batches=(1, 2, 4),
    )
    g2.prepare()
    assert (g2.run(b16, _eager) == _eager(b16)).all() and g2.eager_rows == 3
    b32 = _batch([20], 32)  # a length that is no bucket at all: eager, counted
    assert (g2.run(b32, _eager) == _eager(b32)).all() and g2.eager_rows == 4


def test_when_the_first_capture_fails_the_rest_is_not_tried():
    capture = _capture([], fail={(1, 8)})
    g = Graphs(capture, ["input_ids", "attention_mask"], 0, lengths=(8, 16), batches=(1, 2))
    g.prepare()
    assert capture.captured == [] and not g.graphs
    assert "capture failed" in g.refused[(1, 8)]
    assert g.refused[(2, 16)] == "not tried: the first capture (1x8) failed"
    b = _batch([3, 4], 8)
    assert (g.run(b, _eager) == _eager(b)).all() and g.eager_rows == 2


def test_lazy_graphs_capture_on_first_use_within_the_bounds():
    calls: list = []
    capture = _capture(calls)
    g = Graphs(capture, ["input_ids", "attention_mask"], 0, lengths=(8,), batches=(1, 2, 4), lazy=True, max_graphs=2)
    assert capture.captured == []
    batch = _batch([1, 2, 3], 8)
    assert (g.run(batch, _eager) == _eager(batch)).all()
    # 3 rows want the 4-row bucket; it is captured on first use, then the bound refuses more
    assert capture.captured == [(4, 8)]
    assert (g.run(_batch([1], 8), _eager) == 1).all() and capture.captured == [(4, 8), (1, 8)]
    two = _batch([1, 1], 8)
    calls.clear()
    assert (g.run(two, _eager) == _eager(two)).all() and "count bound" in g.refused[(2, 8)]
    assert [(s, r) for s, r, _ in calls] == [((4, 8), 2)]  # the refused bucket's rows ride the captured 4-row one


def test_auto_chooses_by_the_measurement_and_explicit_modes_are_kept():
    fast = {"1x32": {"eager": 3.0, "graphs": 0.3}, "32x128": {"eager": 3.5, "graphs": 0.8}}
    mode, why = choose("auto", fast)
    assert mode == "graphs" and "b1/s32 0.300 vs 3.000 ms" in why and why.startswith("auto:")
    slow = {"1x32": {"eager": 0.2, "graphs": 0.3}, "32x128": {"eager": 0.5, "graphs": 0.6}}
    assert choose("auto", slow)[0] == "eager"
    assert choose("auto", {})[0] == "eager"
    assert choose("graphs", slow) == ("graphs", "--cuda-graphs graphs")
    assert choose("compile", {}) == ("compile", "--cuda-graphs compile")
    assert choose("off", fast)[0] == "eager"


def test_check_close_is_relative_to_the_logits():
    ok, delta = graphs.check_close(np.array([[1.0, -2.0]]), np.array([[1.0, -2.0005]]))
    assert ok and delta == pytest.approx(5e-4)
    assert not graphs.check_close(np.array([[1.0, 0.0]]), np.array([[1.1, 0.0]]))[0]
    assert graphs.check_close(np.array([[100.0]]), np.array([[100.05]]))[0]  # 5e-4 of 100
