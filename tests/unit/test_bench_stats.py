"""Percentile maths, FLOP counting, floor selection and config parsing (no processes, no timing).

python -m pytest tests/unit/test_bench_stats.py -q
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from qserve import QserveError
from qserve.bench.config import BenchConfig, parse_int_list
from qserve.bench.floor import floor_ms, flops_per_sequence, peak_for
from qserve.bench.stats import percentile, stdev, summarize, throughput


def test_percentiles_on_known_inputs():
    xs = list(range(1, 101))  # 1..100
    assert percentile(xs, 50) == pytest.approx(50.5)
    assert percentile(xs, 90) == pytest.approx(90.1)
    assert percentile(xs, 99) == pytest.approx(99.01)
    assert percentile(xs, 0) == 1 and percentile(xs, 100) == 100
    assert percentile([7.0], 99) == 7.0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0  # order of input does not matter


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_percentiles_match_numpy(seed):
    xs = np.random.default_rng(seed).lognormal(size=37).tolist()
    for q in (50, 90, 95, 99):
        assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))
    assert stdev(xs) == pytest.approx(float(np.std(xs, ddof=1)))


def test_summarize_fields_and_edge_cases():
    s = summarize([10.0, 20.0, 30.0, 40.0])
    assert set(s) == {"count", "mean", "p50", "p90", "p95", "p99", "stdev", "min", "max"}
    assert s["count"] == 4 and s["mean"] == 25.0 and s["p50"] == 25.0 and s["min"] == 10.0 and s["max"] == 40.0
    assert s["stdev"] == pytest.approx(math.sqrt(500 / 3))
    assert summarize([]) == {"count": 0}
    assert summarize([5.0])["stdev"] == 0.0
    assert throughput(32, 0.5) == 64.0 and throughput(1, 0.0) == 0.0
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_flops_distilbert_base_dims():
    cfg = {"dim": 768, "n_layers": 6, "hidden_dim": 3072, "n_heads": 12, "id2label": {"0": "a", "1": "b"}}
    f = flops_per_sequence(cfg, 128)
    assert f["params_linear"] == 6 * (4 * 768 * 768 + 2 * 768 * 3072) == 42_467_328
    assert f["linear"] == 2 * 42_467_328 * 128
    assert f["attention"] == 2 * 2 * 128 * 128 * 768 * 6
    assert f["head"] == 2 * (768 * 768 + 768 * 2)
    assert f["total"] == pytest.approx(11_174_808_576)
    # BERT-layout names give the same count
    bert = {"hidden_size": 768, "num_hidden_layers": 6, "intermediate_size": 3072, "num_attention_heads": 12}
    assert flops_per_sequence(bert, 128)["total"] == pytest.approx(f["total"])
    with pytest.raises(ValueError, match="cannot count FLOPs"):
        flops_per_sequence({"vocab_size": 10}, 128)


def test_floor_uses_the_peak_of_the_compute_type():
    peaks = {"fp32": {"gflops": 100.0}, "bf16": {"gflops": 200.0}, "int8": {"gflops": 400.0}}
    assert peak_for("fp32", peaks) == ("fp32", 100.0)
    assert peak_for("bf16", peaks) == ("bf16", 200.0)
    assert peak_for("int8", peaks) == ("int8", 400.0)
    assert peak_for("int4", peaks) == ("int8", 400.0)  # low-bit: the fastest measured
    assert peak_for("fp16", {"fp32": {"gflops": 50.0}}) == ("fp32", 50.0)  # fallback chain
    assert peak_for("fp32", {}) is None
    assert floor_ms(1e9, 2, 100.0) == pytest.approx(20.0)  # 2 GFLOP at 100 GFLOP/s


def test_config_parsing_and_validation():
    assert parse_int_list("1,8, 32", "--batch-sizes") == [1, 8, 32]
    with pytest.raises(QserveError, match="--seq-lens"):
        parse_int_list("32,abc", "--seq-lens")
    with pytest.raises(QserveError, match="--batch-sizes"):
        parse_int_list("0,1", "--batch-sizes")
    cfg = BenchConfig(batch_sizes=[8, 1, 8], seq_lens=[256, 32]).validate()
    assert cfg.batch_sizes == [1, 8] and cfg.seq_lens == [32, 256]
    assert cfg.headline() == (1, 32)  # nearest measured length to 128
    assert BenchConfig().validate().headline() == (1, 128)
    with pytest.raises(QserveError, match="--device"):
        BenchConfig(device="tpu").validate()
    with pytest.raises(QserveError, match="--threads"):
        BenchConfig(threads=0).validate()
    rt = BenchConfig.from_json(BenchConfig(out=None, threads=2).to_json())
    assert rt.threads == 2 and rt.batch_sizes == [1, 8, 32]
