"""benchmarks/flood_bench.py: reading histograms out of two /metrics scrapes, and the report table.

python -m pytest tests/unit/test_flood_bench.py -q
"""

from __future__ import annotations

import pytest

from benchmarks import flood_bench


@pytest.fixture(scope="module")
def fb():
    return flood_bench


def _scrape(counts: dict[float, float], total: float, **labels: str) -> dict:
    lab = tuple(sorted(labels.items()))
    d = {("h_bucket", tuple(sorted({**labels, "le": str(le)}.items()))): c for le, c in counts.items()}
    d[("h_count", lab)] = counts[float("inf")]
    d[("h_sum", lab)] = total
    return d


def test_hist_is_the_growth_between_scrapes(fb):
    before = _scrape({0.001: 2, 0.01: 2, float("inf"): 2}, 0.001, route="/v1/classify")
    # 10 new observations: 5 under 1 ms, 4 more under 10 ms, 1 above
    after = _scrape({0.001: 7, 0.01: 11, float("inf"): 12}, 0.001 + 0.1, route="/v1/classify")
    h = fb.hist(before, after, "h", route="/v1/classify")
    assert h["count"] == 10 and h["mean_ms"] == pytest.approx(10.0)
    assert h["p50_le_ms"] == 1.0 and h["p99_le_ms"] == float("inf") and h["max_le_ms"] == float("inf")
    assert fb.hist(before, after, "h", route="/other") is None
    assert fb.hist(before, before, "h", route="/v1/classify") is None


def test_render_names_the_cpu_and_each_side(fb):
    flood = {
        "statuses": {"200": 16, "429": 284},
        "client_200_ms": {"first": 50.0, "last": 80.0},
        "client_429_ms": {},
        "server_200_latency": {"p50_le_ms": 50.0, "max_le_ms": 100.0},
        "server_429_latency": {"p50_le_ms": 1.0},
        "server_queue_wait": None,
        "server_rejection": None,
        "server_inference": {"count": 2},
    }
    rep = {
        "environment": {"cpu": {"model": "Test CPU", "flags": ["amx_int8"]}, "physical_cores": 2},
        "config": {"variant_dir": "v", "max_inputs": 16, "max_queue": 16, "threads": 2, "requests": 300, "rounds": 1},
        "floods": [{"round": 0, "side": "baseline", **flood}, {"round": 0, "side": "current", **flood}],
        "slow_clients": [
            {"round": 0, "condition": "quiet", "p50_ms": 10.0, "max_ms": 12.0},
            {"round": 0, "condition": "slow", "p50_ms": 11.0, "max_ms": 13.0},
        ],
        "connections_closed": {"idle": 100.0},
    }
    md = fb.render(rep)
    assert "Test CPU" in md and "AMX: yes" in md and "shared" in md
    assert "| baseline | 16 | 284 |" in md and "| current | 16 | 284 |" in md
    assert "| 0 | 10.00 | 11.00 | 1.10 |" in md
