"""What qserve decides from the machine: the training precision (`auto`), the variants `--all` and the pipeline
skip, each on faked capabilities (every branch), and the probe's real choice on the machine the test runs on.

    python -m pytest tests/unit/test_machine_choices.py -q -rP      # -rP prints this machine's recorded choice
"""

from __future__ import annotations

import pytest

from qserve import QserveError
from qserve.devices import Capabilities
from qserve.placement import plan
from qserve.training.precision import AUTO, choose_precision, probe_bf16
from qserve.variantflags import off_fast_path
from qserve.variants import VARIANTS

AMX = "avx2 fma avx512f avx512_vnni avx512_bf16 amx_bf16 amx_int8"
ZEN4 = "avx2 fma avx512f avx512_vnni avx512_bf16"
ZEN3 = "avx2 fma"
VNNI_ONLY = "avx2 fma avx512f avx512_vnni"


def cpu(flags: str | None) -> Capabilities:
    return Capabilities(cpu_model="test CPU", cpu_flags=None if flags is None else frozenset(flags.split()))


def probe_says(slowdown: float):
    """A probe that measured bf16-mixed `slowdown` times fp32's time (and counts its calls)."""
    calls = []

    def probe():
        calls.append(1)
        return {"fp32_s": 0.01, "bf16_mixed_s": 0.01 * slowdown, "slowdown": slowdown}

    probe.calls = calls  # type: ignore[attr-defined]
    return probe


@pytest.mark.parametrize(
    "flags, slowdown, want, words",
    [
        (AMX, 0.5, "bf16-mixed", "this CPU has amx_bf16: bf16-mixed measured 2.0x faster"),
        (ZEN4, 0.6, "bf16-mixed", "this CPU has avx512_bf16: bf16-mixed measured 1.7x faster"),
        (ZEN3, 9.5, "32-true", "this CPU has no bf16 instructions: bf16-mixed measured 9.5x slower"),
        (VNNI_ONLY, 6.0, "32-true", "this CPU has no bf16 instructions: bf16-mixed measured 6.0x slower"),
        # flags that can be read decide; a noisy reading on a loaded machine is said, not obeyed
        (
            ZEN4,
            1.2,
            "bf16-mixed",
            "this CPU has avx512_bf16: bf16-mixed measured 1.2x slower (the probe disagrees with "
            "the instruction set: a probe of seconds on a busy machine can, so the instruction set "
            "decides; --precision overrides)",
        ),
        (
            ZEN3,
            0.9,
            "32-true",
            "this CPU has no bf16 instructions: bf16-mixed measured 1.1x faster (the probe disagrees "
            "with the instruction set: a probe of seconds on a busy machine can, so the instruction "
            "set decides; --precision overrides)",
        ),
        # flags unreadable (not Linux): the probe decides
        (None, 0.5, "bf16-mixed", "this CPU's flags are unknown: bf16-mixed measured 2.0x faster"),
        (None, 0.95, "32-true", "this CPU's flags are unknown: bf16-mixed measured 1.1x faster"),
        (None, 4.0, "32-true", "this CPU's flags are unknown: bf16-mixed measured 4.0x slower"),
    ],
    ids=[
        "amx",
        "avx512-bf16",
        "avx2",
        "vnni-no-bf16",
        "flags-over-a-noisy-probe",
        "flags-over-a-noisy-probe-avx2",
        "unknown-fast",
        "unknown-marginal",
        "unknown-slow",
    ],
)
def test_auto_on_a_cpu(flags, slowdown, want, words):
    probe = probe_says(slowdown)
    choice = choose_precision(AUTO, "cpu", cpu(flags), probe)
    assert (choice.precision, choice.asked, choice.reason) == (want, AUTO, words)
    assert choice.probe["slowdown"] == slowdown and len(probe.calls) == 1
    assert choice.line == f"precision: {want} ({words})"


@pytest.mark.parametrize("bf16, cc, want", [(True, (8, 0), "bf16-mixed"), (False, (7, 5), "16-mixed")])
def test_auto_on_cuda_follows_the_gpu_and_does_not_probe_the_cpu(bf16, cc, want):
    caps = Capabilities(
        cpu_model="x",
        cpu_flags=frozenset(ZEN3.split()),
        cuda=True,
        cuda_name="Test GPU",
        cuda_bf16=bf16,
        cuda_capability=cc,
    )
    probe = probe_says(9.0)
    choice = choose_precision(AUTO, "cuda", caps, probe)
    assert choice.precision == want and f"Test GPU, sm_{cc[0]}{cc[1]}" in choice.reason and not probe.calls


@pytest.mark.parametrize("asked", ["32-true", "bf16-mixed", "bf16-true", "16-mixed"])
def test_an_explicit_precision_always_wins(asked):
    probe = probe_says(9.0)
    choice = choose_precision(asked, "cpu", cpu(ZEN3), probe)
    assert (choice.precision, choice.reason, choice.probe) == (asked, "asked for with --precision", None)
    assert not probe.calls


def test_a_bad_precision_names_the_allowed_ones():
    with pytest.raises(
        QserveError,
        match=r"--precision must be one of auto, 32-true, 16-mixed, bf16-mixed, "
        r"bf16-true \(got 'fp16'\)",
    ):
        choose_precision("fp16", "cpu", cpu(ZEN3))


def test_the_probe_on_this_machine_is_recorded_and_explained(record_property):
    """The real probe and the real capabilities: what `--precision auto` chooses where this test runs, and why."""
    m = probe_bf16()
    assert (
        m["fp32_s"] > 0
        and m["bf16_mixed_s"] > 0
        and m["slowdown"] == pytest.approx(m["bf16_mixed_s"] / m["fp32_s"], rel=1e-2)
    )
    from qserve.devices import capabilities

    caps = capabilities(with_cuda=False)
    choice = choose_precision(AUTO, "cpu")
    record_property("cpu", caps.describe())
    record_property("precision_auto", choice.line)
    print(f"{caps.describe()}\n{choice.line}\nprobe: {choice.probe}")
    has = caps.has("bf16")
    if has is False:
        assert choice.precision == "32-true" and "no bf16 instructions" in choice.reason
    elif has:
        assert choice.precision == "bf16-mixed" and "this CPU has " in choice.reason
    assert "measured" in choice.reason


def test_capabilities_read_once_and_overridable(cpu_flags):
    from qserve.devices import capabilities, cpu_info, cpu_supports_bf16

    caps = cpu_flags(ZEN3)
    assert capabilities(with_cuda=False) is caps  # cached: one read per process
    assert caps.flags_source == "QSERVE_CPU_FLAGS" and caps.cpu_class == "avx2"
    assert (caps.has("bf16"), caps.has("vnni"), cpu_supports_bf16()) == (False, False, False)
    assert cpu_info()["class"] == "avx2" and cpu_info()["flags_source"] == "QSERVE_CPU_FLAGS"
    assert "avx2 class: bf16 no" in caps.describe()
    assert cpu_flags(AMX).cpu_class == "amx" and cpu_flags(ZEN4).cpu_class == "avx512-bf16" and cpu_supports_bf16()
    assert cpu(None).has("bf16") is None and cpu(None).cpu_class == "unknown"


def test_variants_off_their_fast_path_are_skipped_on_an_avx2_cpu_and_kept_on_bf16_cpus():
    off = {"torch-bf16", "bnb-int8", "bnb-nf4", "bnb-fp4", "ov-bf16", "ov-int8"}
    slow = {"torch-fp16"}  # SLOW_ON: skipped on every CPU, whatever its flags

    def skipped(caps):
        return set(plan("cpu", caps=caps).skipped) - slow

    assert skipped(cpu(ZEN3)) == off
    names = set(plan("cpu", caps=cpu(ZEN3)).runs)
    assert not names & off and {"torch-fp32", "onnx-fp32", "onnx-int8", "onnx-int4", "ov-fp32"} <= names
    # the fast CPUs keep today's set; a VNNI CPU without bf16 keeps the int8 ones
    assert skipped(cpu(AMX)) == skipped(cpu(ZEN4)) == set()
    assert plan("cpu", caps=cpu(AMX)).runs == plan("cpu", caps=cpu(ZEN4)).runs
    assert skipped(cpu(VNNI_ONLY)) == {"torch-bf16", "bnb-nf4", "bnb-fp4", "ov-bf16"}
    # unknown flags skip nothing (the bench measures); include_slow keeps everything
    assert skipped(cpu(None)) == set()
    assert set(plan("cpu", caps=cpu(ZEN3), include_slow=True).runs) >= off | slow
    why = off_fast_path(VARIANTS["ov-int8"], "cpu", cpu(ZEN3))
    assert why and "needs VNNI (avx512_vnni, avx_vnni, amx_int8)" in why and "avx2 class" in why
