"""benchmarks/studies/int8_breakdown.py: the profile accounting and the floor arithmetic of its report.

    python -m pytest tests/unit/test_int8_breakdown.py -q

Runs ORT's real profiler on the tiny checkpoint's onnx-int8 export (the same exporter and
session settings as the real run); no timing is asserted, only that every kernel is counted
once, in a class, and that the report's numbers follow from its inputs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.studies import int8_breakdown

OUTSIDE = "outside kernels (executor, allocation)"
GEMMS = "int8 GEMMs (with activation quantization)"


@pytest.fixture(scope="module")
def bd():
    return int8_breakdown


@pytest.fixture(scope="module")
def int8_variant(tiny_checkpoint, tmp_path_factory) -> Path:
    import exporters

    out = tmp_path_factory.mktemp("breakdown") / "onnx-int8"
    exporters.export(tiny_checkpoint, "onnx-int8", out)
    return out


@pytest.fixture(scope="module")
def profiled(bd, int8_variant, tmp_path_factory):
    sess = bd.session(int8_variant / "model.onnx", 1, tmp_path_factory.mktemp("profile"))
    return bd.profile(sess, bd.feed_for(int8_variant, 2, 16, 1), calls=5, warmup=2)


def test_every_kernel_of_the_exported_graph_lands_in_a_named_class(bd, profiled):
    assert profiled["calls"] == 7  # warm-up calls are profiled too
    assert profiled["runs"] == 4  # the faster half (rounded up) is what is counted
    assert not [op for op in profiled["ops"] if bd.op_class(op) == "other"], profiled["ops"]
    assert profiled["classes"][GEMMS]["nodes"] > 0
    assert (
        "DynamicQuantizeMatMul" in profiled["classes"][GEMMS]["ops"]
        or "MatMulIntegerToFloat" in profiled["classes"][GEMMS]["ops"]
    )


def test_classes_and_outside_time_add_up_to_the_profiled_call(profiled):
    kernels = sum(r["ms"] for r in profiled["ops"].values())
    by_class = sum(c["ms"] for name, c in profiled["classes"].items() if name != OUTSIDE)
    assert by_class == pytest.approx(kernels)
    assert kernels <= profiled["profiled_ms_per_run"] * 1.05  # kernels run inside the call, not beside it
    assert profiled["classes"][OUTSIDE]["ms"] == pytest.approx(max(profiled["profiled_ms_per_run"] - kernels, 0.0))


def test_report_numbers_follow_from_flops_peaks_and_profile(bd, profiled):
    # 10 GOP at 1000 GOP/s -> a 10 ms floor; 9 GOP of linear layers -> 9 ms at the int8 peak;
    # 1 GFLOP of attention at 200 GFLOP/s -> 5 ms.
    flops = {"total": 10e9, "linear": 9e9, "attention": 1e9}
    peaks = {
        "int8": {"gflops": 1000.0, "method": "m", "shape": [1, 2, 3]},
        "fp32": {"gflops": 200.0, "method": "m", "shape": [1, 2, 3]},
    }
    prof = {
        "calls": 20,
        "runs": 10,
        "profiled_ms_per_run": 20.0,
        "ops": {},
        "classes": {
            GEMMS: {"ms": 12.0, "nodes": 4, "ops": ["DynamicQuantizeMatMul"]},
            OUTSIDE: {"ms": 8.0, "nodes": 0, "ops": []},
        },
    }
    timing = bd.summarize_rounds(
        {"shipped onnx-int8": [14.0, 16.0], "other": [12.6, 12.0]}, {"shipped onnx-int8": 0.0, "other": 0.01}
    )
    md = bd.render(
        {
            "model": "m",
            "batch": 1,
            "seq": 128,
            "threads": 2,
            "flops": flops,
            "peaks": peaks,
            "timing": timing,
            "calls_per_turn": 20,
            "profile": prof,
            "graphs": {"shipped onnx-int8": "a.onnx"},
            "onnxruntime": "x",
            "environment": {"cpu": {"model": "cpu"}},
            "created": "now",
        }
    )
    assert "**Int8 floor: 10.00 ms**" in md
    assert "**15.00 ms = 1.50× the floor**; its best round 14.00 ms = 1.40×" in md  # median of 14 and 16
    # GEMM share 12/20 of the profiled call, applied to the 14 ms best round -> 8.4 ms = 0.93x their own floor
    assert "share of that best round: 8.40 ms, 0.93× the 9.00 ms their FLOPs need" in md
    assert "they need 5.00 ms" in md and "13.40 ms = 1.34× the floor" in md
    # round 2 (shipped 16 > 1.1 x 14) is a burst round: only round 1 ranks the graphs (12.6 / 14 = 0.9)
    assert "Quiet rounds: 1 of 2." in md and "every graph makes 20 calls in turn" in md
    assert "profiler over 20 calls, the faster 10 of them counted" in md
    assert "Fastest by quiet-round ratio: other (0.900 of the shipped graph); its best round is 1.20× the floor" in md
    assert "| int8 GEMMs (with activation quantization) | 4 | 60.0% | 8.40 | DynamicQuantizeMatMul |" in md
    assert "Profiled call / best round = 1.43; quiet runs here read 1.1-1.2" in md  # 20 / 14: flagged


def test_a_burst_slowed_call_is_left_out_of_the_shares(bd, tmp_path):
    """Calls slowed by a burst of the machine are dropped whole: their kernels do not count."""
    import json

    events, ts = [], 0
    for dur, gemm in [(10_000, 6_000), (10_000, 6_000), (50_000, 40_000), (10_000, 6_000)]:  # µs
        events.append({"cat": "Session", "name": "model_run", "ts": ts, "dur": dur})
        events.append(
            {
                "cat": "Node",
                "name": "a_kernel_time",
                "ts": ts + 10,
                "dur": gemm,
                "args": {"op_name": "DynamicQuantizeMatMul"},
            }
        )
        events.append(
            {"cat": "Node", "name": "b_kernel_time", "ts": ts + gemm + 20, "dur": 2_000, "args": {"op_name": "Gelu"}}
        )
        ts += dur + 100
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps(events))

    class Recorded:  # what ORT's profiler wrote; the calls themselves are already in the trace
        def run(self, *_):
            return None

        def end_profiling(self):
            return str(trace)

    prof = bd.profile(Recorded(), {}, calls=4, warmup=0)
    assert (prof["calls"], prof["runs"]) == (4, 2)
    assert prof["profiled_ms_per_run"] == pytest.approx(10.0)
    assert prof["classes"][GEMMS]["ms"] == pytest.approx(6.0) and prof["classes"][GEMMS]["nodes"] == 1
    assert prof["classes"]["Gelu"]["ms"] == pytest.approx(2.0)
    assert prof["classes"][OUTSIDE]["ms"] == pytest.approx(2.0)


def test_burst_rounds_rank_nothing(bd):
    """A round where the shipped graph ran >10% over its best is left out of the quiet ratio only."""
    t = bd.summarize_rounds(
        {"shipped": [20.0, 30.0, 21.0, 20.5], "b": [19.0, 36.0, 19.95, 19.475]}, {"shipped": 0.0, "b": 0.0}
    )
    assert t["shipped"]["quiet_rounds"] == 3 and t["shipped"]["ratio_quiet"] == pytest.approx(1.0)
    assert t["b"]["ratio_quiet"] == pytest.approx(0.95)  # 19/20, 19.95/21, 19.475/20.5
    assert t["b"]["ratio_to_shipped"] == pytest.approx(0.95)  # the burst round (1.2) is one of four: median
    assert (t["b"]["best_round_ms"], t["b"]["p50_ms"]) == (19.0, pytest.approx((19.475 + 19.95) / 2))
