"""A regression model served by the Ray engine (real local Ray): the same /v1 and V2 answers as the runtime.

    python -m pytest tests/integration/test_problem_types_ray.py -q
"""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest

httpx2 = pytest.importorskip("httpx2")
ray = pytest.importorskip("ray")

from conftest import build_tiny_checkpoint  # noqa: E402
from test_problem_types import TEXTS, write_regression  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_regression_model_on_ray_answers_its_value(tmp_path):
    import exporters
    from ray import serve

    from qserve.cli import main
    from qserve.runtime import load_runtime
    from qserve.serve.infra.deploy import Scaling
    from qserve.serve.ray_engine import application

    base = build_tiny_checkpoint(tmp_path / "base")
    ck = tmp_path / "reg-ck"
    assert main(["train", "--model", str(base), "--dataset", str(write_regression(tmp_path / "s.csv")), "--out",
                 str(ck), "--precision", "32-true", "--max-length", "32", "--epochs", "1"]) == 0
    variant = tmp_path / "torch-fp32"
    exporters.export(ck, "torch-fp32", variant)
    want = load_runtime(variant).predict(TEXTS)[:, 0]

    port = _free_port()
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(application({"variant_dir": str(variant), "threads": 1}, Scaling(1), cores=2),
                  name="qserve", route_prefix="/")
        with httpx2.Client(base_url=f"http://127.0.0.1:{port}", timeout=30, trust_env=False) as c:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                try:
                    if c.get("/ready").status_code == 200:
                        break
                except httpx2.TransportError:
                    pass
                time.sleep(0.5)
            body = c.post("/v1/classify", json={"inputs": TEXTS}).json()
            assert body["problem_type"] == "regression"
            assert [p[0]["label"] for p in body["predictions"]] == ["value"] * len(TEXTS)
            np.testing.assert_allclose([p[0]["score"] for p in body["predictions"]], want, atol=1e-5)
            r = c.post("/v1/classify", json={"inputs": "x", "threshold": 0.5})
            assert r.status_code == 422 and "multi-label models only" in r.json()["error"]
            v2 = {"inputs": [{"name": "text", "shape": [len(TEXTS)], "datatype": "BYTES", "data": TEXTS}]}
            out = {o["name"]: o for o in c.post("/v2/models/torch-fp32/infer", json=v2).json()["outputs"]}
            assert out["value"]["shape"] == [len(TEXTS), 1] and "probabilities" not in out
            np.testing.assert_allclose(out["value"]["data"], want, atol=1e-5)
    finally:
        serve.shutdown()
        ray.shutdown()
