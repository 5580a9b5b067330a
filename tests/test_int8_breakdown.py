"""benchmarks/int8_breakdown.py: the profile accounting and the floor arithmetic of its report.

    python -m pytest tests/test_int8_breakdown.py -q

Runs ORT's real profiler on the tiny checkpoint's onnx-int8 export (the same exporter and
session settings as the real run); no timing is asserted, only that every kernel is counted
once, in a class, and that the report's numbers follow from its inputs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import load_benchmark

OUTSIDE = "outside kernels (executor, allocation)"
GEMMS = "int8 GEMMs (with activation quantization)"


@pytest.fixture(scope="module")
def bd():
    return load_benchmark("int8_breakdown")


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
    assert profiled["runs"] == 7  # warm-up calls are profiled too, and divided out alike
    assert not [op for op in profiled["ops"] if bd.op_class(op) == "other"], profiled["ops"]
    assert profiled["classes"][GEMMS]["nodes"] > 0
    assert "DynamicQuantizeMatMul" in profiled["classes"][GEMMS]["ops"] or \
        "MatMulIntegerToFloat" in profiled["classes"][GEMMS]["ops"]


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
    peaks = {"int8": {"gflops": 1000.0, "method": "m", "shape": [1, 2, 3]},
             "fp32": {"gflops": 200.0, "method": "m", "shape": [1, 2, 3]}}
    prof = {"runs": 10, "profiled_ms_per_run": 20.0, "ops": {},
            "classes": {GEMMS: {"ms": 12.0, "nodes": 4, "ops": ["DynamicQuantizeMatMul"]},
                        OUTSIDE: {"ms": 8.0, "nodes": 0, "ops": []}}}
    timing = {"shipped onnx-int8": {"p50_ms": 15.0, "best_round_ms": 14.0, "ratio_to_shipped": 1.0,
                                    "max_abs_logit_diff": 0.0, "rounds_ms": [15.0, 14.0]},
              "other": {"p50_ms": 13.0, "best_round_ms": 12.0, "ratio_to_shipped": 0.9,
                        "max_abs_logit_diff": 0.01, "rounds_ms": [13.0, 12.0]}}
    md = bd.render({"model": "m", "batch": 1, "seq": 128, "threads": 2, "flops": flops, "peaks": peaks,
                    "timing": timing, "profile": prof, "graphs": {"shipped onnx-int8": "a.onnx"},
                    "onnxruntime": "x", "environment": {"cpu": {"model": "cpu"}}, "created": "now"})
    assert "**Int8 floor: 10.00 ms**" in md
    assert "**15.00 ms = 1.50× the floor**; its best round 1.40×" in md
    # GEMM share 12/20 of the profiled call, applied to the 15 ms p50 -> 9 ms = 1.00x their own floor
    assert "int8 GEMM kernels alone (activation quantization included): 9.00 ms, 1.00× the 9.00 ms" in md
    assert "they need 5.00 ms" in md and "14.00 ms = 1.40× the floor" in md
    assert "Fastest by same-round ratio: other (0.900 of the shipped graph); its best round is 1.20× the floor" in md
    assert "| int8 GEMMs (with activation quantization) | 4 | 60.0% | 9.00 | DynamicQuantizeMatMul |" in md
