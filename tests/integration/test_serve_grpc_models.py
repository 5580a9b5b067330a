"""gRPC with several models: routing by model_name, each model's version, parameters.long_text checked
against the model, the repository RPCs (index, load, unload) behind the key, and the model label.

    python -m pytest tests/integration/test_serve_grpc_models.py -q
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import serving
from test_serve_lifecycle import _runtime, other  # noqa: F401 - `other` is a fixture

grpcclient = pytest.importorskip("tritonclient.grpc")
httpx2 = pytest.importorskip("httpx2")
from tritonclient.utils import InferenceServerException  # noqa: E402

KEY = "grpc-models-key-1"
LONG = " ".join(f"scene{i % 30} was {'great' if i % 3 else 'dull'}" for i in range(60))
TEXTS = [LONG, "a moving film", "a clumsy film"]


def _input(texts):
    t = grpcclient.InferInput("text", [len(texts)], "BYTES")
    t.set_data_from_numpy(np.array([x.encode() for x in texts], dtype=object))
    return t


def _long_text(value):
    """ModelInfer with parameters.long_text (tritonclient's `parameters` puts a str in string_param)."""
    return {"long_text": value}


def test_grpc_routes_by_name_reads_long_text_and_runs_the_repository(tiny_variant, other):  # noqa: F811
    from qserve.serve.core.repository import Repository, sources_from_dirs
    from qserve.serve.infra.config import ServeConfig

    ref = {"a": _runtime(tiny_variant), "b": _runtime(other["onnx-fp32"])}
    repo = Repository(sources_from_dirs([f"a={tiny_variant}", f"b={other['onnx-fp32']}"]))
    cfg = ServeConfig(variant_dir=str(tiny_variant), threads=1, max_wait_ms=2, grpc_port=0, api_key=KEY)
    auth = {"authorization": f"Bearer {KEY}"}
    with serving(cfg, repository=repo) as srv:
        c = grpcclient.InferenceServerClient(f"127.0.0.1:{srv.server.config.app.state.grpc.port}")
        http = {
            m["id"]: m["version"]
            for m in httpx2.get(
                f"{srv.url}/v1/models", headers={"Authorization": f"Bearer {KEY}"}, trust_env=False
            ).json()["models"]
        }
        for name in ("a", "b"):
            assert c.get_model_metadata(name, headers=auth).versions == [http[name]]
            res = c.infer(name, [_input(TEXTS)], headers=auth, parameters=_long_text("windows"))
            resp = res.get_response()
            assert resp.model_name == name and resp.model_version == http[name]
            assert resp.parameters["long_text"].string_param == "windows:64:48:mean"
            np.testing.assert_allclose(res.as_numpy("probabilities"), ref[name].predict(TEXTS, "windows"), atol=1e-5)
            plain = c.infer(name, [_input(TEXTS)], headers=auth, model_version=http[name])
            np.testing.assert_allclose(plain.as_numpy("probabilities"), ref[name].predict(TEXTS), atol=1e-5)
        for params, what in (
            (_long_text("head-tail:64"), "parameters.long_text"),
            ({"long_text": 3}, "must be a string_param"),
        ):
            with pytest.raises(InferenceServerException) as e:
                c.infer("b", [_input(TEXTS)], headers=auth, parameters=params)
            assert e.value.status() == "StatusCode.INVALID_ARGUMENT" and what in e.value.message()
        with pytest.raises(InferenceServerException) as e:
            c.infer("b", [_input(TEXTS)], headers=auth, model_version=http["a"])
        assert e.value.status() == "StatusCode.NOT_FOUND" and f"serves version '{http['b']}'" in e.value.message()

        # the repository RPCs: the same calls as HTTP's, behind the same key
        with pytest.raises(InferenceServerException) as e:
            c.get_model_repository_index()
        assert e.value.status() == "StatusCode.UNAUTHENTICATED"
        index = c.get_model_repository_index(headers=auth, as_json=True)["models"]
        assert [(m["name"], m["version"], m["state"]) for m in index] == [
            ("a", http["a"], "READY"),
            ("b", http["b"], "READY"),
        ]
        c.unload_model("b", headers=auth)
        with pytest.raises(InferenceServerException) as e:
            c.infer("b", [_input(TEXTS)], headers=auth)
        assert e.value.status() == "StatusCode.NOT_FOUND"
        assert [m.get("state") for m in c.get_model_repository_index(headers=auth, as_json=True)["models"]] == [
            "READY",
            "UNAVAILABLE",
        ]
        with pytest.raises(InferenceServerException) as e:
            c.load_model("b", headers=auth, config="{}")
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT" and "load takes no parameters" in e.value.message()
        c.load_model("b", headers=auth)
        assert c.is_model_ready("b", headers=auth)
        assert c.infer("b", [_input(TEXTS)], headers=auth).get_response().model_version == http["b"]
        metrics = httpx2.get(f"{srv.url}/metrics", headers={"Authorization": f"Bearer {KEY}"}, trust_env=False).text
    route = "/inference.GRPCInferenceService/"
    for method, model in (
        ("ModelInfer", "a"),
        ("ModelInfer", "b"),
        ("RepositoryModelLoad", "b"),
        ("RepositoryModelUnload", "b"),
    ):
        assert f'qserve_requests_total{{method="GRPC",model="{model}",route="{route}{method}",status="200"}}' in metrics
    assert 'qserve_model_loads_total{model="b",outcome="unloaded"} 1.0' in metrics
