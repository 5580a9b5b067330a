"""The dynamic batcher's size by device (serve/infra/config.py BATCHING), where --max-batch-size and --max-wait-ms
leave it; the device's capability faked (no GPU here).

    python -m pytest tests/unit/test_serve_sizing.py -q
"""

from __future__ import annotations

import pytest

from qserve import QserveError


def test_the_batcher_is_sized_by_device_where_the_flags_leave_it(monkeypatch):
    from qserve.serve.infra import config as serve_config
    from qserve.serve.infra.config import BATCHING, ServeConfig, device_kind

    assert (BATCHING["cpu"].max_batch_size, BATCHING["cuda"].max_batch_size) == (32, 256)
    cfg = ServeConfig(variant_dir="v")
    assert (cfg.max_batch_size, cfg.max_wait_ms) == (None, None)
    assert (cfg.batch_size, cfg.wait_ms) == (32, 5.0)  # unsized: the CPU row
    cpu = cfg.for_device("cpu")
    assert (cpu.max_batch_size, cpu.max_wait_ms) == (32, 5.0)
    gpu = cfg.for_device("cuda:1")
    assert (gpu.max_batch_size, gpu.max_wait_ms) == (256, 2.0)
    given = ServeConfig(variant_dir="v", max_batch_size=8).for_device("cuda")
    assert (given.max_batch_size, given.max_wait_ms) == (8, 2.0)  # a flag given wins
    assert ServeConfig(variant_dir="v", max_wait_ms=0.0).for_device("cuda").max_wait_ms == 0.0
    # auto asks whether a GPU is usable (faked here); probe=False never asks
    monkeypatch.setattr(serve_config, "cuda_available", lambda: True)
    assert device_kind("auto") == "cuda" and cfg.for_device().max_batch_size == 256
    assert device_kind("auto", probe=False) == "cpu"
    monkeypatch.setattr(serve_config, "cuda_available", lambda: False)
    assert cfg.for_device("auto").max_batch_size == 32
    with pytest.raises(QserveError, match="--max-batch-size"):
        ServeConfig(variant_dir="v", max_batch_size=0).validate()
    with pytest.raises(QserveError, match="--cuda-graphs"):
        ServeConfig(variant_dir="v", cuda_graphs="sometimes").validate()


def test_a_ray_deployment_is_sized_without_probing_the_driver():
    from qserve.serve.infra.config import settings_batch_size

    assert settings_batch_size({}) == 32 and settings_batch_size({"device": "auto"}) == 32  # no GPU probe here
    assert settings_batch_size({"device": "cuda"}) == 256
    assert settings_batch_size({"device": "cuda", "max_batch_size": 8}) == 8
