"""What runs where (qserve.placement), decided on faked capabilities: a GPU machine with and without ONNX Runtime's
CUDA provider, with and without OpenVINO, on CPUs of each class; and on this machine's CPU as it is.

    python -m pytest tests/unit/test_placement.py -q
"""

from __future__ import annotations

import pytest

from qserve import QserveError, placement
from qserve.devices import Capabilities
from qserve.placement import Placement, Plan, mark, place, plan
from qserve.variants import VARIANTS

AMX = Capabilities(
    cpu_model="Xeon (test)",
    cpu_flags=frozenset(["avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8"]),
)
ZEN3 = Capabilities(cpu_model="EPYC (test)", cpu_flags=frozenset(["avx2", "fma"]))
TORCH_BNB = ["torch-fp32", "torch-bf16", "torch-fp16", "bnb-int8", "bnb-nf4", "bnb-fp4"]
ONNX_CUDA = ["onnx-fp32", "onnx-fp16", "onnx-int4"]
OV = ["ov-fp32", "ov-bf16", "ov-int8"]


@pytest.fixture
def no_openvino(monkeypatch):
    """OpenVINO not installed (as on the GPU machine of issue 53)."""
    real = placement.not_installed
    monkeypatch.setattr(
        placement,
        "not_installed",
        lambda spec: (
            "openvino and nncf are not installed: pip install 'qserve[openvino]'"
            if spec.backend == "openvino"
            else real(spec)
        ),
    )


def test_a_gpu_without_the_onnx_provider_runs_onnx_on_the_cpu_and_skips_openvino(fake_gpu, no_openvino):
    from conftest import ORT_CPU_BUILD

    fake_gpu()
    p = plan("auto", caps=AMX)
    assert p.device == "cuda"
    assert p.runs == TORCH_BNB + ["onnx-fp32", "onnx-fp16", "onnx-int8", "onnx-int4"]
    assert {n: p.device_of(n) for n in p.runs} == {
        **{n: "cuda" for n in TORCH_BNB},
        **{n: "cpu" for n in ONNX_CUDA + ["onnx-int8"]},
    }
    assert {n: x.why for n, x in p.elsewhere.items()} == {
        **{n: ORT_CPU_BUILD for n in ONNX_CUDA},
        "onnx-int8": "onnx-int8 has no CUDA kernels (a CPU-only variant)",
    }
    assert set(p.skipped) == set(OV) and "pip install 'qserve[openvino]'" in p.skipped["ov-int8"]
    # what the pipeline prints before it trains: one line per (device, reason)
    assert p.lines() == [
        f"{', '.join(TORCH_BNB)}: cuda",
        f"onnx-fp32, onnx-fp16, onnx-int4: cpu ({ORT_CPU_BUILD})",
        "onnx-int8: cpu (onnx-int8 has no CUDA kernels (a CPU-only variant))",
        f"{', '.join(OV)}: skipped ({p.skipped['ov-fp32']})",
    ]
    # an explicit --device cuda plans the same: a multi-variant run is never lost for a provider
    assert plan("cuda", caps=AMX) == p


def test_a_gpu_with_the_onnx_provider_runs_onnx_there_and_openvino_on_the_cpu(fake_gpu):
    fake_gpu(ort=None)
    p = plan("auto", caps=AMX)
    assert [n for n in p.runs if p.device_of(n) == "cuda"] == TORCH_BNB + ONNX_CUDA
    assert set(p.elsewhere) == {"onnx-int8", *OV} and not p.skipped


def test_cpu_rules_hold_for_what_a_gpu_run_puts_on_the_cpu(fake_gpu):
    """On an AVX2 host CPU, the CPU's fast-path rule skips ov-bf16/ov-int8 as on a CPU run; the bnb variants, off
    their CPU fast path there, run on the GPU, where that rule says nothing."""
    fake_gpu()
    p = plan("cuda", caps=ZEN3)
    assert {"bnb-int8", "bnb-nf4", "torch-bf16"} <= {n for n in p.runs if p.device_of(n) == "cuda"}
    assert set(p.skipped) == {"ov-bf16", "ov-int8"} and "avx2 class" in p.skipped["ov-int8"]
    assert p.device_of("ov-fp32") == p.device_of("onnx-int8") == "cpu"
    # named variants are placed, never skipped for speed
    named = plan("cuda", ["ov-int8", "onnx-fp32", "torch-fp16"], caps=ZEN3)
    assert [(x.variant, x.device) for x in named.placements] == [
        ("ov-int8", "cpu"),
        ("onnx-fp32", "cpu"),
        ("torch-fp16", "cuda"),
    ]


OFF_FAST_PATH_ON_AVX2 = {"torch-bf16", "bnb-int8", "bnb-nf4", "bnb-fp4", "ov-bf16", "ov-int8"}


@pytest.mark.parametrize("caps, off", [(AMX, set()), (ZEN3, OFF_FAST_PATH_ON_AVX2)], ids=["amx", "avx2"])
def test_a_cpu_run_plans_every_cpu_variant_but_the_slow_and_those_off_their_fast_path(caps, off, monkeypatch):
    monkeypatch.setenv("QSERVE_FORCE_CPU", "1")
    p = plan("auto", caps=caps)
    cpu_variants = [n for n, s in VARIANTS.items() if s.cpu and placement.not_installed(s) is None]
    assert p.device == "cpu" and not p.elsewhere
    assert p.runs == [n for n in cpu_variants if n not in off | {"torch-fp16"}]
    # the CPU's skips, the slow ones said too
    assert set(p.skipped) & set(cpu_variants) == off | {"torch-fp16"}
    assert "runs only slowly on a CPU" in p.skipped["torch-fp16"]
    assert plan("cpu", caps=caps, include_slow=True).runs == cpu_variants


def test_place_one_named_variant(fake_gpu):
    fake_gpu()
    assert place("torch-bf16", "auto") == place("bnb-int8", "cuda") == "cuda"
    assert place("onnx-fp32", "auto") == place("onnx-int8", "auto") == place("ov-int8", "auto") == "cpu"
    assert place("onnx-fp32", "cpu") == "cpu"
    with pytest.raises(QserveError) as e:
        place("onnx-fp32", "cuda")
    msg = str(e.value)
    assert msg.startswith("--device cuda: onnx-fp32 cannot run on CUDA here (onnxruntime 1.30.0 is the CPU build")
    assert "use --device cpu, or --device auto (the GPU where a variant runs on it, else the CPU)" in msg
    with pytest.raises(QserveError, match=r"--device cuda:0: ov-fp32 cannot run on CUDA here \(ov-fp32 has no CUDA "):
        place(VARIANTS["ov-fp32"], "cuda:0")
    fake_gpu(ort=None)
    assert place("onnx-fp16", "cuda") == "cuda"


def test_without_a_gpu_every_variant_is_on_the_cpu(monkeypatch):
    monkeypatch.setenv("QSERVE_FORCE_CPU", "1")
    assert {place(n, "auto") for n in VARIANTS} == {"cpu"}
    with pytest.raises(QserveError, match="--device cuda was asked for but no CUDA GPU is available"):
        place("torch-fp32", "cuda")


def test_the_plan_round_trips_and_names_what_it_does_not_run():
    p = Plan(
        "cuda",
        (
            Placement("torch-fp32", "cuda"),
            Placement("onnx-int8", "cpu", "no CUDA kernels"),
            Placement("ov-int8", None, "openvino is not installed"),
        ),
    )
    assert Plan.from_json(p.to_json()) == p
    assert p.runs == ["torch-fp32", "onnx-int8"] and p.skipped == {"ov-int8": "openvino is not installed"}
    assert p.device_of("bnb-nf4") == "cuda"  # not in the plan: the run's device
    with pytest.raises(QserveError, match="ov-int8 is not run here: openvino is not installed"):
        p.device_of("ov-int8")


@pytest.mark.parametrize(
    "device, run, want",
    [
        ("cpu", "cuda", " (cpu)"),
        ("cuda:0", "cuda", ""),
        ("cpu", "cpu", ""),
        (None, "cuda", ""),
        ("cuda", "cpu", " (cuda)"),
    ],
)
def test_mark(device, run, want):
    assert mark(device, run) == want


@pytest.mark.parametrize(
    "variant_device, reference_device, shown",
    [("cpu", "cuda", "onnx-int8 (cpu)"), ("cpu", "cpu", "onnx-int8"), ("cuda:0", "cuda", "onnx-int8")],
)
def test_the_gate_table_marks_a_variant_scored_on_another_device_than_its_reference(
    variant_device, reference_device, shown
):
    from qserve.gate.report import row

    iv = {"value": 0.99, "lo": 0.985, "hi": 0.995}
    g = {
        "agreement": {**iv, "of": 1000},
        "accuracy": {"delta": {"value": 0.0, "lo": -0.004, "hi": 0.004}},
        "passed": True,
        "bar": {"agreement_lower_bound": 0.98},
        "machine": {"device": variant_device},
        "reference": {"name": "torch-fp32", "device": reference_device},
    }
    assert row({"variant": "onnx-int8", "gate": g})["variant"] == shown
