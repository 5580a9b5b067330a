"""benchmarks/studies/serve_windows.py's arithmetic: answer changes against the c1 reference, windows per text, the
ceiling head's texts/s sets for a windowed policy and the ratio to it (the served run itself is the lead's).

    python -m pytest tests/unit/test_serve_windows.py -q
"""

from __future__ import annotations

import pytest

from benchmarks.studies import serve_windows as sw


def test_changes_count_label_flips_and_the_largest_prob_difference():
    ref = [([0.9, 0.1], 1), ([0.45, 0.55], 3), ([0.2, 0.8], 2), None]
    got = [([0.9, 0.1], 1), ([0.55, 0.45], 3), ([0.25, 0.75], 2), ([0.5, 0.5], 1)]
    c = sw.changes(ref, got)
    assert c == {"compared": 3, "missing": 1, "label_changes": 1, "max_abs_dprob": pytest.approx(0.1)}
    # identical answers: nothing changed; a text without its concurrent answer is missing, never agreeing
    assert sw.changes(ref[:3], ref[:3])["label_changes"] == 0
    assert sw.changes(ref[:3], [None, None, None]) == {
        "compared": 0,
        "missing": 3,
        "label_changes": 0,
        "max_abs_dprob": 0.0,
    }


def test_ceiling_is_head_texts_per_s_shared_among_windows():
    assert sw.ceiling(42.0, 3.0) == pytest.approx(14.0)
    assert sw.ceiling(None, 3.0) is None and sw.ceiling(42.0, None) is None
    assert sw.mean_windows([([1.0], 2), None, ([1.0], 4)]) == 3.0
    assert sw.mean_windows([None]) is None


def test_summarize_pools_rounds_and_compares_windows_with_their_ceiling():
    # 4 texts in 2 rounds of 2; head serves 40 texts/s at c32, windows (3 per text) 12.5: 0.9375x of 40 / 3
    policies = ["head", "windows:128:96:mean"]
    texts = {"c10": 2, "c11": 2, "c320": 2, "c321": 2}
    elapsed = {
        "head": {"c1": [0.1, 0.1], "c32": [0.05, 0.05]},
        "windows:128:96:mean": {"c1": [0.4, 0.4], "c32": [0.16, 0.16]},
    }
    head = [([0.9, 0.1], 1), ([0.2, 0.8], 1), ([0.6, 0.4], 1), ([0.3, 0.7], 1)]
    win = [([0.8, 0.2], 3), ([0.1, 0.9], 3), ([0.4, 0.6], 3), ([0.3, 0.7], 3)]
    flipped = [win[0], win[1], ([0.6, 0.4], 3), win[3]]
    answers = {"head": {"c1": head, "c32": head}, "windows:128:96:mean": {"c1": win, "c32": flipped}}
    s = sw.summarize(policies, texts, elapsed, answers, labels=[0, 1, 1, 1])
    h, w = s["policies"]["head"], s["policies"]["windows:128:96:mean"]
    assert h["c1_texts_per_s"] == pytest.approx(20.0) and h["c32_texts_per_s"] == pytest.approx(40.0)
    assert h["accuracy_c1"] == 0.75 and w["accuracy_c1"] == 1.0
    assert w["windows_per_text"] == 3.0 and w["windowed_share"] == 1.0 and w["max_windows"] == 3
    assert w["ceiling_texts_per_s"] == pytest.approx(40 / 3)
    assert w["ratio_to_ceiling"] == pytest.approx(0.9375) and w["ratio_rounds"] == pytest.approx([0.9375] * 2)
    assert "ceiling_texts_per_s" not in h
    assert w["c32_vs_c1"]["label_changes"] == 1 and s["label_changes"] == 1 and s["missing"] == 0
    assert s["ratios_ok"] is True
    elapsed["windows:128:96:mean"]["c32"] = [0.25, 0.25]  # 8 texts/s: 0.6x of the ceiling
    assert sw.summarize(policies, texts, elapsed, answers, labels=[0, 1, 1, 1])["ratios_ok"] is False
