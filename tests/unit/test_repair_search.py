"""The repair's search and distance on made-up measurements (qserve/repair.py; real components: tests/integration).

python -m pytest tests/unit/test_repair_search.py -q
"""

from __future__ import annotations

import numpy as np

from qserve import problemtypes as problems
from qserve.repair import distance, search


def test_the_repair_search_finds_the_fewest_layers_that_meet_the_bars():
    """k = 1, 2, 4, ... to the first hit, then halving: the fewest top-ranked layers, each k measured once."""
    for need, n in ((5, 38), (1, 38), (38, 38), (3, 4)):
        tried: list[int] = []
        got = search(lambda k: tried.append(k) or {"met": k >= need}, n, float("inf"))
        assert got == need and len(tried) == len(set(tried)), (need, tried)
    assert search(lambda k: {"met": False}, 38, float("inf")) is None and search(lambda k: {}, 0, 0.0) is None


def test_distance_is_zero_at_fp32_and_grows_with_the_change():
    z = np.random.default_rng(0).normal(size=(50, 3))
    assert distance(z, z, problems.SINGLE) == 0 < distance(z, z + [1, 0, 0], problems.SINGLE)
    assert distance(z, z + [1, 0, 0], problems.SINGLE) < distance(z, z + [3, 0, 0], problems.SINGLE)
    assert distance(z, z, problems.MULTI) == 0 < distance(z, -z, problems.MULTI)
