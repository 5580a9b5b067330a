"""Several models and long texts together: each model applies a request's long_text itself (v1 and V2),
/v1/report answers per model, and a shadow re-scores a windowed text under the policy it was served by.

    python -m pytest tests/integration/test_serve_lifecycle_longtext.py -q
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from conftest import serving
from test_serve_lifecycle import _cfg, _probs, _runtime, _v2, other  # noqa: F401 - `other` is a fixture

httpx2 = pytest.importorskip("httpx2")

LONG = [
    " ".join(f"scene{i % 40} was {'great' if (i + k) % 3 else 'dull'}" for i in range(100 + 7 * k)) for k in range(6)
]  # ~300-400 tokens each: several windows of the tiny model's 64


def test_each_model_reads_long_texts_by_the_request_policy_and_has_its_report(tiny_variant, other):  # noqa: F811
    from qserve.serve.core.repository import Repository, sources_from_dirs

    ref = {"a": _runtime(tiny_variant), "b": _runtime(other["onnx-fp32"])}
    repo = Repository(sources_from_dirs([f"a={tiny_variant}", f"b={other['onnx-fp32']}"]))
    with (
        serving(_cfg(tiny_variant), repository=repo) as srv,
        httpx2.Client(base_url=srv.url, timeout=60, trust_env=False) as c,
    ):
        for name in ("a", "b"):
            want = ref[name].classify(LONG[:2], "windows")
            body = c.post("/v1/classify", json={"inputs": LONG[:2], "model": name, "long_text": "windows"}).json()
            assert body["model"] == name and body["long_text"] == "windows:64:48:mean"
            assert body["windows"] == want.windows and min(want.windows) > 1 and body["tokens"] == want.tokens
            np.testing.assert_allclose(
                [_probs(p, ref[name].labels) for p in body["predictions"]], want.probs, atol=1e-5
            )
            r = c.post(f"/v2/models/{name}/infer", json=_v2(LONG[:2]) | {"parameters": {"long_text": "tail"}}).json()
            assert r["model_name"] == name and r["parameters"]["long_text"] == "tail"
            probs = next(o for o in r["outputs"] if o["name"] == "probabilities")["data"]
            np.testing.assert_allclose(np.reshape(probs, (2, 2)), ref[name].predict(LONG[:2], "tail"), atol=1e-5)
            bad = c.post("/v1/classify", json={"inputs": "x", "model": name, "long_text": "head-tail:64"})
            assert bad.status_code == 422 and "long_text" in bad.json()["error"]
            rep = c.get("/v1/report", params={"model": name}).json()
            assert rep["model"] == name and rep["report"] is None and "no bench report" in rep["reason"]
        assert c.get("/v1/report").json()["model"] == "a"  # no name: the default model
        assert c.get("/v1/report", params={"model": "c"}).status_code == 404


def test_the_shadow_rescores_a_windowed_text_under_its_served_policy(tiny_variant, other):  # noqa: F811
    served, reference = _runtime(tiny_variant), _runtime(other["onnx-fp32"])
    p, q = served.predict(LONG, "windows"), reference.predict(LONG, "windows")
    dprob = np.abs(p - q).max(1)
    head = np.abs(p - reference.predict(LONG, "head")).max(1)
    # the tiny random models answer long texts alike, so tight: the reference's head reading gives other numbers
    assert np.abs(dprob.max() - head.max()) > 1e-5
    cfg = _cfg(tiny_variant, model_name="a", shadow=[f"a={other['onnx-fp32']}"], shadow_rate=1.0)
    with serving(cfg) as srv, httpx2.Client(base_url=srv.url, timeout=60, trust_env=False) as c:
        assert c.post("/v1/classify", json={"inputs": LONG, "long_text": "windows"}).status_code == 200
        for _ in range(400):
            (model,) = c.get("/v1/models").json()["models"]
            if model["shadow"]["samples"] >= len(LONG):
                break
            time.sleep(0.05)
    shadow = model["shadow"]
    assert shadow["samples"] == len(LONG) and shadow["failures"] == 0
    assert shadow["agreement"] == float((p.argmax(1) == q.argmax(1)).mean())
    for key, quantile in (("p50", 0.5), ("max", 1.0)):
        assert shadow["abs_dprob"][key] == pytest.approx(float(np.quantile(dprob, quantile)), abs=2e-6)
