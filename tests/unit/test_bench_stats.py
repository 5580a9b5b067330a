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


def _ranked(name: str, rounds: list[float], size: int, lb: float | None = None) -> dict:
    """A report variant measured in made-up rounds (its real-text b1 p50 per round)."""
    from qserve.bench.rounds import merge_real

    real = merge_real(
        [{"id": str(k), "real_text": [{"batch": 1, "samples": [x], "texts": 1}]} for k, x in enumerate(rounds)], 0.1
    )
    v = {
        "name": name,
        "dir": f"/r/{name}",
        "status": "ok",
        "spec": {"name": name, "bits": 8},
        "agreement": 0.995,
        "weights_bytes": size,
        "fixed": [],
        "real_text": real,
    }
    if lb is not None:
        v["gate"] = {"passed": True, "agreement": 0.995, "agreement_lower_bound": lb, "bar": 0.99, "n": 1000}
    return v


def _report(*variants) -> dict:
    return {"headline": {"batch": 1, "seq": 128}, "agreement_reference": "torch-fp32", "variants": list(variants)}


def test_median_interval_by_order_statistics():
    from qserve.bench.stats import median_ci

    assert median_ci([5.0, 1.0, 3.0, 2.0, 4.0])[:2] == (1.0, 5.0)  # n=5: min..max, 94% coverage
    lo, hi, cov = median_ci(list(range(1, 10)))
    assert (lo, hi) == (2, 8) and cov >= 0.95  # n=9: the 2nd and 8th values, 96%
    assert median_ci([7.0]) == (7.0, 7.0, 0.0)


def test_a_clear_difference_is_called_a_difference():
    from qserve.bench.recommend import recommend

    # the machine has a slow phase in round 2; it falls on both, and both are ranked by their fast mode (the
    # other four rounds), paired round by round, so the ratio stays clear of 1
    fast = _ranked("ov-int8", [7.0, 7.1, 12.6, 7.0, 7.2], size=30)
    slow = _ranked("onnx-int8", [8.6, 8.8, 15.4, 8.5, 8.9], size=20)
    rec = recommend(_report(slow, fast))
    assert rec["variant"] == "ov-int8" and rec["runner_up"] == "onnx-int8" and rec["tied"] is False
    r = rec["ratio"]
    assert r["paired"] and r["rounds"] == 4 and 1.0 < r["lo"] <= r["value"] <= r["hi"]
    assert rec["p50_ms"] == 7.05  # the fast mode's median
    assert rec["ratio_text"] == f"{r['value']:.2f}x [{r['lo']:.2f}, {r['hi']:.2f}]"
    assert f"{rec['ratio_text']} faster than onnx-int8 at b1 on real texts (paired over 4 rounds)" in rec["why"]


def test_a_ratio_is_paired_only_where_its_shared_rounds_cover_more_than_the_unpaired_interval():
    from qserve.bench.recommend import ratio_ci

    slow = {str(k): 10.0 + k / 10 for k in range(8)}
    fast = {str(k): 7.0 + k / 10 for k in range(5)}
    assert ratio_ci(slow, fast).paired  # five shared rounds: the paired coverage beats the unpaired intervals' product
    few = {str(k): 7.0 + k / 10 for k in (0, 1, 8, 9, 10, 11)}  # two shared rounds: 50% paired
    r = ratio_ci(slow, few)
    assert not r.paired and r.rounds == 2 and r.level > 0.5 and r.lo <= r.value <= r.hi
    assert (r.value, r.lo, r.hi) == pytest.approx((10.35 / 7.85, 10.0 / 8.1, 10.7 / 7.0))


def _steady(name: str, ms: float, size: int, lb: float | None = None) -> dict:
    return _ranked(name, [ms, ms * 1.01, ms * 0.99, ms * 1.02, ms], size, lb)


def test_the_runner_up_is_the_reference_only_when_no_other_candidate_qualifies():
    from qserve.bench.recommend import recommend

    ref, best = _steady("torch-fp32", 20.0, 90), _steady("onnx-int8", 7.0, 20)
    slow = _steady("bnb-nf4", 30.0, 50)  # slower than the reference, but it qualifies: a real alternative
    rec = recommend(_report(ref, best, slow))
    assert rec["variant"] == "onnx-int8" and rec["runner_up"] == "bnb-nf4" and "reference" not in rec["why"]
    slow["agreement"] = 0.95  # below its bar: nothing else qualifies, and the sentence says whom it compares with
    rec = recommend(_report(ref, best, slow))
    assert (
        rec["runner_up"] == "torch-fp32"
        and "faster than the reference torch-fp32 (nothing else qualified)" in (rec["why"])
    )
    # gated: the runner-up is the next that passed its gate, never the reference while one did
    gated = recommend(_report(ref, _steady("onnx-int8", 7.0, 20, lb=0.993), _steady("ov-bf16", 9.0, 45, lb=0.992)))
    assert gated["runner_up"] == "ov-bf16" and gated["ratio"]["paired"] and gated["ratio"]["rounds"] == 5


def test_every_verdict_says_why_and_a_raced_out_variant_is_never_recommended():
    from qserve.bench.recommend import recommend

    raced = _steady(
        "torch-bf16", 5.0, 45, lb=0.995
    )  # the fastest, passed its gate, yet measured once: it decides nothing
    raced["raced_out"] = {"screen_ms": 5.0, "of_best": 1.4}
    failed = _steady("ov-int8", 6.0, 20, lb=0.985)
    failed["gate"].update(passed=False, reasons=["lower bound 98.50% < 99%"])
    undecided = _steady("onnx-int4", 6.5, 30, lb=0.989)
    undecided["gate"].update(passed=False, decision="undecided", reasons=["the interval holds the bar"])
    repaired = _steady("ov-int8-repaired", 7.5, 25, lb=0.991)
    repaired["repair"] = {"of": "ov-int8", "kept": ["layer.0.ffn", "layer.5.ffn"], "trace": []}
    below, ungated = _steady("bnb-nf4", 4.0, 50), _steady("onnx-fp32", 15.0, 90)
    below["agreement"] = 0.95
    variants = [raced, failed, undecided, repaired, below, ungated, _steady("onnx-int8", 7.0, 20, lb=0.993)]
    variants += [_steady("ov-bf16", 9.0, 45, lb=0.992), _steady("torch-fp32", 20.0, 90)]
    rec = recommend(_report(*variants))
    assert rec["variant"] == "onnx-int8" and rec["runner_up"] == "ov-int8-repaired"
    verdicts = {r["variant"]: (r["verdict"], r["verdict_why"]) for r in rec["ranking"]}
    assert verdicts == {
        "bnb-nf4": ("below bar", "agreement 95.00% < 99%"),
        "torch-bf16": ("raced out", "1.40x"),
        "ov-int8": ("failed gate", "lower bound 98.50% < 99%"),
        "onnx-int4": ("undecided at 1000", "the interval holds the bar"),
        "onnx-int8": ("recommended", None),
        "ov-int8-repaired": ("repaired", "2 layer(s) kept in higher precision"),
        "ov-bf16": ("passed", None),
        "onnx-fp32": (
            "not a candidate",
            "not gated; once a gate ran, only a passed variant or the reference is recommended",
        ),
        "torch-fp32": ("passed", "the reference"),
    }


@pytest.mark.parametrize(
    "runner, lb, paired",
    [("ov-bf16", 0.992, True), ("torch-fp32", None, True), ("ov-bf16", 0.992, False), ("onnx-int8-x", 0.993, True)],
)
def test_the_verdict_is_one_sentence_of_at_most_40_words(runner, lb, paired):
    from qserve.bench.recommend import recommend

    best = _steady("onnx-int8-repaired", 7.0, 20, lb=0.991)
    best["repair"] = {"of": "onnx-int8", "kept": ["a"], "trace": []}
    other = _steady(runner, 7.05 if runner.endswith("-x") else 9.0, 45, lb)  # -x: a tie
    if not paired:
        other["real_text"][0]["round_p50"] = {f"other-{k}": v for k, v in other["real_text"][0]["round_p50"].items()}
    ref = _steady("torch-fp32", 20.0, 90)
    rec = recommend(_report(*([best, ref] if runner == "torch-fp32" else [best, other, ref])))
    why = rec["why"]
    assert why.startswith("Serve onnx-int8-repaired: ") and why.endswith(".") and why.count(". ") == 0
    assert len(why.split()) <= 40, (len(why.split()), why)
    assert rec["ratio_text"] in why and "repaired, then release gate passed: agreement lower bound 99.10%" in why


def test_racing_keeps_every_variant_within_the_factor_and_the_fastest_candidates():
    import random

    from qserve.bench.recommend import RACE_KEEP, race

    screen = {"ov-int8": 7.36, "onnx-int8": 8.48, "ov-bf16": 9.76, "ov-fp32": 15.4, "onnx-fp32": 16.6}
    screen |= {"torch-fp32": 23.3, "bnb-int8": 31.9}
    assert race(screen, list(screen), 1.3, "torch-fp32") == {"ov-int8", "onnx-int8", "ov-bf16", "torch-fp32"}
    assert race(screen, list(screen), 0, "torch-fp32") == set(screen)  # racing off: every variant to the end
    # the bound is the fastest CANDIDATE's: a variant whose gate failed (not a candidate) sets none
    assert race(screen, ["onnx-int8", "ov-fp32", "torch-fp32"], 1.3, "torch-fp32") == {
        "ov-int8",
        "onnx-int8",
        "ov-bf16",
        "ov-fp32",
        "torch-fp32",
    }
    rng = random.Random(0)
    for _ in range(200):
        shot = {f"v{i}": rng.uniform(1, 40) for i in range(rng.randint(1, 12))}
        cands = [v for v in shot if rng.random() < 0.7]
        factor = rng.choice([1.0, 1.1, 1.3, 2.0])
        keep = race(shot, cands, factor, "v0")
        best = min((shot[c] for c in cands), default=None)
        assert "v0" in keep and keep <= set(shot)
        if best is not None:  # never raced out within the factor; the fastest candidates always kept
            assert {v for v, p in shot.items() if p <= factor * best} <= keep
            assert set(sorted(cands, key=shot.__getitem__)[:RACE_KEEP]) <= keep


def test_a_tie_is_called_a_tie_and_the_rule_breaks_it():
    from qserve.bench.recommend import TIE_RULE, recommend

    a = _ranked("ov-int8", [7.0, 7.6, 7.2, 7.5, 7.1], size=30)
    b = _ranked("onnx-int8", [7.3, 7.2, 7.4, 7.1, 7.3], size=20)  # within the noise of a: its ratio holds 1
    rec = recommend(_report(a, b))
    assert rec["tied"] is True and rec["ratio"]["lo"] <= 1.0 <= rec["ratio"]["hi"]
    assert rec["variant"] == "onnx-int8"  # the smaller footprint wins the tie
    assert rec["runner_up"] == "ov-int8" and rec["tie_break"] == TIE_RULE and "tied with ov-int8" in rec["why"]
    # gated: the higher agreement lower bound comes first
    gated = recommend(
        _report(
            _ranked("ov-int8", [7.0, 7.6, 7.2, 7.5, 7.1], 30, lb=0.993),
            _ranked("onnx-int8", [7.3, 7.2, 7.4, 7.1, 7.3], 20, lb=0.991),
        )
    )
    assert gated["variant"] == "ov-int8" and gated["tied"]
    # the same tie whatever the order the rounds came in
    again = recommend(
        _report(_ranked("onnx-int8", [7.1, 7.3, 7.3, 7.2, 7.4], 20), _ranked("ov-int8", [7.1, 7.5, 7.0, 7.6, 7.2], 30))
    )
    assert again["variant"] == "onnx-int8" and again["tied"]


def test_two_modes_are_split_and_the_fast_one_is_ranked_whatever_share_the_slow_phase_took():
    from qserve.bench.recommend import ranked, two_modes
    from qserve.bench.rounds import ci_cell, merge_fixed

    def rec(rounds):
        (r,) = merge_fixed(
            [{"id": str(k), "fixed": [{"batch": 1, "seq": 128, "samples": [x, x]}]} for k, x in enumerate(rounds)], 0.10
        )
        return r

    mostly_fast, mostly_slow = rec([7.4, 12.5, 7.3, 12.6, 7.5]), rec([12.4, 7.3, 12.5, 7.4, 12.6])
    assert mostly_fast["p50"] == 7.5 and mostly_slow["p50"] == 12.4  # the median lands in whichever mode has more
    assert ranked(mostly_fast)[0] == 7.4 and ranked(mostly_slow)[0] == 7.35  # the fast mode either way
    m = mostly_fast["modes"]
    assert (m["fast_p50"], m["slow_p50"], m["slow_share"], m["fast_rounds"]) == (7.4, 12.55, 0.4, ["0", "2", "4"])
    assert mostly_fast["stable"] is True and mostly_fast["count"] == 10
    assert (
        ci_cell(mostly_fast) == "7.50 [7.30, 12.60] (two modes: fast 7.40 [7.30, 7.50], slow 12.55 ms in 40% of rounds)"
    )
    assert two_modes([7.0, 7.1, 7.2, 7.3, 7.2], 0.10) is None  # one mode
    assert two_modes([7.0, 7.1, 12.0], 0.10) == ([7.0, 7.1], [12.0])
    assert two_modes([7.0, 12.0, 12.1], 0.10) is None  # a fast "mode" of one round is an outlier, not a mode


def test_unstable_rounds_are_said_beside_the_number():
    from qserve.bench.rounds import ci_cell, merge_fixed

    rounds = [
        {"id": str(k), "fixed": [{"batch": 1, "seq": 128, "samples": [x, x]}]}
        for k, x in enumerate([7.0, 7.6, 7.3, 7.8, 7.45])
    ]
    (rec,) = merge_fixed(rounds, 0.10)  # one mode, but its interval wider than 10% of its median
    assert "modes" not in rec and rec["p50"] == 7.45 and rec["p50_ci"] == [7.0, 7.8] and rec["stable"] is False
    assert ci_cell(rec) == "7.45 [7.00, 7.80] (unstable: rounds 7.00-7.80 ms)"
    steady = merge_fixed(
        [{"id": str(k), "fixed": [{"batch": 1, "seq": 128, "samples": [7.0 + k / 100]}]} for k in range(5)], 0.10
    )
    assert steady[0]["stable"] is True and "unstable" not in ci_cell(steady[0])


def test_a_repeat_names_one_answer_or_several_and_each_weighed_span():
    from benchmarks.bench_repeat import summarize

    def run(variant, tied, p50):
        runner = next(v for v in sorted(p50) if v != variant)
        return {"ok": True, "variant": variant, "tied_with": tied, "p50_ms": p50, "runner_up": runner}

    same = [run("a", ["b"], {"a": 7.0, "b": 7.2}), run("a", ["b"], {"a": 7.7, "b": 7.1})]
    s = summarize(same)
    assert s["same_answer"] and s["answers"] == [["a", ["b"]]] and s["spans_hold"]
    assert s["spans"]["a"]["span"] == 1.1
    flipped = same + [run("b", [], {"a": 12.6, "b": 7.0})]
    s = summarize(flipped)
    assert not s["same_answer"] and len(s["answers"]) == 2 and not s["spans_hold"]  # a: 12.6 / 7.0
    assert not s["same_recommendation"]
    untied = same + [run("a", [], {"a": 7.0, "b": 7.6})]  # a tie broken by the rule is the same recommendation
    s = summarize(untied)
    assert s["same_recommendation"] and not s["same_answer"] and len(s["answers"]) == 2
