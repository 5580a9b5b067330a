"""The torch runtime's graph path on CPU, with the capture replaced by a stand-in that computes exactly what a graph
replays (the model on the staged static block): the wiring, the padding and slicing, one text one answer, the
fallbacks and the execution record. That a real CUDA graph equals eager and is faster is a GPU's to show
(benchmarks/gpu/serving.py).

    python -m pytest tests/integration/test_cuda_graphs_runtime.py -q
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import MIXED_TEXTS

from qserve.bench import invariance
from qserve.runtime import RuntimeOptions, graphs, load_runtime
from qserve.runtime.torch_rt import TorchRuntime

TEXTS = MIXED_TEXTS + ["fine", "A film I will not forget soon, for good reasons and bad ones alike.", "no"]


class StandIn:
    """A 'graph' of one shape on CPU: the eager forward of the static block it is handed, rows sliced."""

    nbytes = 1 << 20
    staging = None

    def __init__(self, rt: TorchRuntime, shape: graphs.Shape, shift: float = 0.0):
        self.rt, self.shape, self.shift = rt, shape, shift
        self.names = rt._graph_inputs()
        self.calls = 0

    def __call__(self, block: np.ndarray, rows: int) -> np.ndarray:
        assert block.shape[1:] == self.shape
        self.calls += 1
        return self.rt._eager({k: block[i] for i, k in enumerate(self.names)})[:rows] + self.shift


@pytest.fixture
def on_cuda(monkeypatch):
    """Graphs allowed on this CPU (as on a CUDA device), captured by StandIn (shift: a wrong 'replay')."""
    made: list[StandIn] = []

    def use(shift: float = 0.0, fail: bool = False):
        def capture_factory(self):
            def capture(shape):
                if fail:
                    raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
                made.append(StandIn(self, shape, shift))
                return made[-1]

            return capture

        monkeypatch.setattr(TorchRuntime, "_graphs_blocked", lambda self: None)
        monkeypatch.setattr(TorchRuntime, "_graph_capture", capture_factory)
        monkeypatch.setattr(TorchRuntime, "_compiled_capture", capture_factory)
        return made

    return use


@pytest.fixture(scope="module")
def eager(tiny_variant):
    return load_runtime(tiny_variant, options=RuntimeOptions(threads=1))


def test_cpu_runs_as_before(eager):
    assert eager.execution == {"asked": "auto", "mode": "eager", "why": "cpu: eager (CUDA graphs need a CUDA device)"}
    assert eager.buckets is None and eager.lanes == 1 and eager._graphs is None


def test_graphs_pad_each_text_to_its_bucket_and_answer_as_eager(tiny_variant, on_cuda, eager):
    made = on_cuda()
    rt = load_runtime(tiny_variant, options=RuntimeOptions(threads=1, cuda_graphs="graphs", max_rows=8))
    ex = rt.execution
    assert ex["mode"] == "graphs" and ex["why"] == "--cuda-graphs graphs" and ex["check_max_abs_dlogit"] == 0.0
    assert rt.buckets == (32, 64) and ex["graphs"]["batches"] == [1, 2, 4, 8]
    assert ex["graphs"]["count"] == 8 and ex["graphs"]["captured"][:2] == ["1x32", "1x64"]
    assert "measured_ms" not in ex  # measured only for auto
    together = rt.predict(TEXTS)
    alone = np.concatenate([rt.predict([t]) for t in TEXTS])
    plain = eager.predict(TEXTS)
    assert np.abs(together - alone).max() <= 1e-5 and np.abs(together - plain).max() <= 1e-5
    assert (together.argmax(1) == plain.argmax(1)).all()
    assert sum(g.calls for g in made) > len(TEXTS)  # the answers came from the 'graphs'
    inv = invariance.compare(rt.predict, TEXTS * 3, sizes=(3, 8))  # the bench's check, on this path
    assert inv["max_abs_dprob"] <= 1e-5 and inv["flips"] == 0
    assert rt._graphs is not None and rt._graphs.eager_rows == 0


def test_the_bench_measures_eager_beside_the_graphs(tiny_variant, on_cuda):
    from qserve.bench.measure import eager_beside_graphs

    made = on_cuda()
    rt = load_runtime(tiny_variant, options=RuntimeOptions(threads=1, cuda_graphs="graphs"))
    job = {"batch_sizes": [1, 4], "seq_lens": [64], "warmup": 1, "time_budget_s": 0.05, "min_iters": 2, "max_iters": 3}
    before = sum(g.calls for g in made)
    got = eager_beside_graphs(rt, job, "a fine film " * 20)
    assert got["execution"]["mode"] == "graphs"
    assert [(r["batch"], r["seq"], r["mode"]) for r in got["fixed_eager"]] == [(1, 64, "eager"), (4, 64, "eager")]
    assert sum(g.calls for g in made) == before  # eager: no replay inside eager_only()
    assert eager_beside_graphs(
        load_runtime(tiny_variant, options=RuntimeOptions(threads=1, cuda_graphs="off")), job, "x"
    ) == {"execution": {"asked": "off", "mode": "eager", "why": "--cuda-graphs off"}}


def test_auto_keeps_what_measures_faster(tiny_variant, on_cuda, monkeypatch):
    on_cuda()
    fast = {"1x32": {"eager": 2.9, "graphs": 0.3}, "32x64": {"eager": 3.2, "graphs": 0.7}}
    monkeypatch.setattr(TorchRuntime, "_timings", lambda self: fast)
    rt = load_runtime(tiny_variant, options=RuntimeOptions(threads=1))
    assert rt.execution["mode"] == "graphs" and rt.execution["measured_ms"] == fast and rt.buckets == (32, 64)
    slow = {"1x32": {"eager": 0.2, "graphs": 0.3}}
    monkeypatch.setattr(TorchRuntime, "_timings", lambda self: slow)
    rt = load_runtime(tiny_variant, options=RuntimeOptions(threads=1))
    assert rt.execution["mode"] == "eager" and rt.execution["why"].startswith("auto: eager measured faster")
    assert rt.execution["measured_ms"] == slow and rt.buckets is None and rt._graphs is None  # unpadded again


def test_a_capture_that_fails_or_differs_leaves_the_variant_eager(tiny_variant, on_cuda, eager):
    on_cuda(fail=True)
    rt = load_runtime(tiny_variant, options=RuntimeOptions(threads=1, cuda_graphs="graphs"))
    assert rt.execution["mode"] == "eager" and rt.buckets is None
    assert rt.execution["why"].startswith("eager: capture failed (QserveError: no shape could be captured")
    assert "operation not permitted" in rt.execution["graphs"]["refused"]["1x32"]
    assert np.array_equal(rt.predict(TEXTS), eager.predict(TEXTS))
    on_cuda(shift=0.5)  # a 'replay' whose answer moved: data-dependent kernels frozen at capture
    rt = load_runtime(tiny_variant, options=RuntimeOptions(threads=1, cuda_graphs="graphs"))
    assert rt.execution["mode"] == "eager" and "differs from the eager forward by |Δlogit| 0.5" in rt.execution["why"]


def test_compile_captures_lazily_on_first_use(tiny_variant, on_cuda):
    made = on_cuda()
    rt = load_runtime(tiny_variant, options=RuntimeOptions(threads=1, cuda_graphs="compile"))
    assert rt.execution["mode"] == "compile" and rt.execution["graphs"]["lazy"] is True
    assert len(made) == 1 and made[0].shape[0] == 1  # the check's shape only, so far (a sentence at batch 1)
    rt.predict(TEXTS[:3])
    assert len(made) > 1


def test_a_gpu_runtime_keeps_two_batches_in_flight(tiny_variant):
    rt = load_runtime(tiny_variant, options=RuntimeOptions(threads=1))
    rt.device = "cuda:0"  # the capability, faked: lanes depend on the device only
    assert rt.lanes == 2
    rt.device = "cpu"
    assert rt.lanes == 1
