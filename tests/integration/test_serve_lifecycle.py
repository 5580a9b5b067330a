"""Model lifecycle against a real uvicorn: several models by name, hot swap under 32 concurrent clients,
a corrupt directory refused, the repository API through tritonclient's own calls, shadow agreement, auth.

    python -m pytest tests/integration/test_serve_lifecycle.py -q

Two tiny checkpoints with different seeds give models whose answers differ, so a test can tell which
model, and which version of it, computed every answer.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import build_tiny_checkpoint, serving

httpx2 = pytest.importorskip("httpx2")
httpclient = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402

WORDS = ["a wonderful", "a dreadful", "an ordinary", "a moving", "a boring", "a brilliant", "a clumsy", "a tender"]
TEXTS = [f"review {i}: {w} film" for i, w in enumerate(WORDS * 8)]  # 64 distinct texts
KEY = "lifecycle-key-123"


@pytest.fixture(scope="module")
def other(tmp_path_factory):
    """A second checkpoint (seed 1) exported as torch-fp32 and onnx-fp32."""
    import exporters

    root = tmp_path_factory.mktemp("other")
    ck = build_tiny_checkpoint(root / "checkpoint", seed=1)
    out = {}
    for name in ("torch-fp32", "onnx-fp32"):
        out[name] = root / name
        exporters.export(ck, name, out[name])
    return out


def _runtime(path: Path):
    from qserve.runtime import RuntimeOptions, load_runtime

    return load_runtime(path, "cpu", RuntimeOptions(threads=1))


def _v2(texts: list[str]) -> dict:
    return {"inputs": [{"name": "text", "shape": [len(texts)], "datatype": "BYTES", "data": texts}]}


def _probs(preds: list[dict], labels: list[str]) -> list[float]:
    by = {p["label"]: p["score"] for p in preds}
    return [by[label] for label in labels]


def _state(srv):
    return srv.server.config.app.state.qserve


def _cfg(variant: Path | str = "", **kw):
    from qserve.serve.infra.config import ServeConfig

    return ServeConfig(variant_dir=str(variant), threads=1, max_inputs=64, max_wait_ms=2, **kw)


# -- several models ---------------------------------------------------------------------------------
def test_two_models_answer_by_name_through_v1_and_v2(tiny_variant, other):
    from qserve.serve.core.repository import Repository, sources_from_dirs

    ref = {"a": _runtime(tiny_variant), "b": _runtime(other["onnx-fp32"])}
    want = {name: rt.predict(TEXTS[:4]) for name, rt in ref.items()}
    assert np.abs(want["a"] - want["b"]).max() > 0.05  # the two models really answer differently
    repo = Repository(sources_from_dirs([f"a={tiny_variant}", f"b={other['onnx-fp32']}"]))
    with (
        serving(_cfg(tiny_variant), repository=repo) as srv,
        httpx2.Client(base_url=srv.url, timeout=30, trust_env=False) as c,
    ):
        info = c.get("/v1/models").json()
        assert [m["id"] for m in info["models"]] == ["a", "b"] and info["default"] == "a"
        versions = {m["id"]: m["version"] for m in info["models"]}
        assert versions["a"] == ref["a"].manifest.digest[:12] != versions["b"]
        for name in ("a", "b", None):
            r = c.post("/v1/classify", json={"inputs": TEXTS[:4]} | ({"model": name} if name else {})).json()
            served = name or "a"  # no name: the first model
            assert r["model"] == served and r["model_version"] == versions[served]
            np.testing.assert_allclose(
                [_probs(p, ref[served].labels) for p in r["predictions"]], want[served], atol=1e-5
            )
        for name in ("a", "b"):
            r = c.post(f"/v2/models/{name}/infer", json=_v2(TEXTS[:4])).json()
            assert r["model_name"] == name and r["model_version"] == versions[name]
            probs = next(o for o in r["outputs"] if o["name"] == "probabilities")["data"]
            np.testing.assert_allclose(np.reshape(probs, (4, 2)), want[name], atol=1e-5)
            assert c.get(f"/v2/models/{name}").json()["versions"] == [versions[name]]
            assert c.post(f"/v2/models/{name}/versions/{versions[name]}/infer", json=_v2(["ok"])).status_code == 200
        r = c.post("/v1/classify", json={"inputs": "x", "model": "c"})
        assert r.status_code == 404 and "'a', 'b'" in r.json()["error"]
        metrics = c.get("/metrics").text
    for name in ("a", "b"):
        assert f'qserve_requests_total{{method="POST",model="{name}",route="/v1/classify",status="200"}}' in metrics
        assert f'qserve_batch_size_count{{model="{name}"}}' in metrics
        assert f'qserve_model_version_info{{model="{name}",version="{versions[name]}"}} 1.0' in metrics


def test_a_name_clash_is_refused_at_start_naming_both_dirs(tiny_variant, other, capsys):
    from qserve import QserveError
    from qserve.cli import main
    from qserve.serve.core.repository import sources_from_dirs

    # Both variants are named by their spec name, torch-fp32.
    assert main(["serve", str(tiny_variant), str(other["torch-fp32"])]) == 2
    err = capsys.readouterr().err
    assert "two models named 'torch-fp32'" in err and str(tiny_variant) in err and str(other["torch-fp32"]) in err
    with pytest.raises(QserveError, match=f"two models named 'x': {tiny_variant} and {other['onnx-fp32']}"):
        sources_from_dirs([f"x={tiny_variant}", f"x={other['onnx-fp32']}"])
    with pytest.raises(QserveError, match="not valid"):
        sources_from_dirs([f"bad!name={tiny_variant}"])


# -- shadow agreement -------------------------------------------------------------------------------
def test_shadow_agreement_equals_the_offline_agreement(tiny_variant, other, caplog):
    caplog.set_level(logging.INFO, logger="qserve.serve")
    served, reference = _runtime(tiny_variant), _runtime(other["onnx-fp32"])
    p, q = served.predict(TEXTS), reference.predict(TEXTS)
    agreement = float((p.argmax(1) == q.argmax(1)).mean())
    dprob = np.abs(p - q).max(1)
    assert agreement < 0.99  # seed 0 against seed 1: under the fp32 bar, so the warning must fire
    cfg = _cfg(tiny_variant, model_name="a", shadow=[f"a={other['onnx-fp32']}"], shadow_rate=1.0)
    with serving(cfg) as srv, httpx2.Client(base_url=srv.url, timeout=30, trust_env=False) as c:
        for i in range(0, len(TEXTS), 16):
            assert c.post("/v1/classify", json={"inputs": TEXTS[i : i + 16]}).status_code == 200
        for _ in range(400):
            (model,) = c.get("/v1/models").json()["models"]
            if model["shadow"]["samples"] >= len(TEXTS):
                break
            time.sleep(0.05)
        metrics = c.get("/metrics").text
    shadow = model["shadow"]
    assert shadow["samples"] == shadow["window"] == len(TEXTS) and shadow["dropped"] == 0
    assert shadow["agreement"] == agreement and shadow["bar"] == 0.99 and shadow["below_bar"] is True
    for key, quantile in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
        assert shadow["abs_dprob"][key] == pytest.approx(float(np.quantile(dprob, quantile)), abs=1e-5)
    assert shadow["abs_dprob"]["max"] == pytest.approx(float(dprob.max()), abs=1e-5)
    assert shadow["reference_spec"] == "onnx-fp32" and shadow["version"] == model["version"]
    assert f'qserve_shadow_samples_total{{model="a"}} {float(len(TEXTS))}' in metrics
    assert f'qserve_shadow_agreement{{model="a"}} {agreement}' in metrics
    assert 'qserve_shadow_abs_dprob{model="a",quantile="0.99"}' in metrics
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "shadow a" in r.getMessage()]
    assert len(warned) == 1 and "under the bar of 99%" in warned[0]


# -- the repository: hot swap, corrupt directory, tritonclient --------------------------------------
def _cyclic_loader(cfg):
    """The real loader, plus a reference cycle on the runtime, as real models can hold (a module that
    refers back to its parent, a bound method kept as a hook): only the cyclic GC can free such a runtime,
    and the post-warm-up gc.freeze() puts it out of that GC's reach until the swap thaws it."""
    from qserve.serve.core.state import load_model

    rt = load_model(cfg)
    rt.cycle = [rt]
    return rt


@pytest.fixture(scope="module")
def repo_server(tiny_variant, tmp_path_factory):
    """--model-repository ROOT with one model, m (a copy of the tiny torch-fp32 variant)."""
    root = tmp_path_factory.mktemp("repo")
    shutil.copytree(tiny_variant, root / "m")
    cfg = _cfg(model_repository=str(root), max_queue=4096)
    with serving(cfg, loader=_cyclic_loader) as srv:
        yield srv, root


def _replace(root: Path, name: str, new: Path, tmp: Path) -> None:
    """Put `new` where ROOT/name was (the old contents move aside), as a deploy would."""
    aside = tmp / f"{name}-old-{time.monotonic_ns()}"
    (root / name).rename(aside)
    shutil.copytree(new, root / name)


def test_hot_swap_under_32_clients_loses_nothing_and_every_answer_names_its_version(repo_server, other, tmp_path):
    srv, root = repo_server
    st = _state(srv)
    old_rt, new_rt = _runtime(root / "m"), _runtime(other["torch-fp32"])
    want = {
        old_rt.manifest.digest[:12]: old_rt.predict(TEXTS[:8]),
        new_rt.manifest.digest[:12]: new_rt.predict(TEXTS[:8]),
    }
    old_v, new_v = list(want)
    assert st.models["m"].version == old_v
    answers: list[tuple[int, int, str | None, list[float] | None]] = []
    sent = [0]

    async def client(c, k: int, stop: asyncio.Event) -> None:
        i = k
        while not stop.is_set():
            j = i % 8
            sent[0] += 1
            if i % 2:
                r = await c.post("/v1/classify", json={"inputs": TEXTS[j], "model": "m"})
                body = r.json()
                got = (
                    body.get("model_version"),
                    _probs(body["predictions"][0], old_rt.labels) if r.status_code == 200 else None,
                )
            else:
                r = await c.post("/v2/models/m/infer", json=_v2([TEXTS[j]]))
                body = r.json()
                got = (
                    body.get("model_version"),
                    next(o["data"] for o in body["outputs"] if o["name"] == "probabilities")
                    if r.status_code == 200
                    else None,
                )
            answers.append((r.status_code, j, *got))
            i += 32

    async def go() -> tuple[int, dict]:
        stop = asyncio.Event()
        async with httpx2.AsyncClient(
            base_url=srv.url, timeout=60, trust_env=False, limits=httpx2.Limits(max_connections=40)
        ) as c:
            tasks = [asyncio.create_task(client(c, k, stop)) for k in range(32)]
            await asyncio.sleep(0.5)
            before = len(answers)
            _replace(root, "m", other["torch-fp32"], tmp_path)
            r = await c.post("/v2/repository/models/m/load", timeout=120)
            during = len(answers) - before
            await asyncio.sleep(0.5)
            stop.set()
            await asyncio.gather(*tasks)
            return during, r

    during, load = asyncio.run(go())
    assert load.status_code == 200 and load.json() == {"name": "m", "version": new_v, "state": "READY"}
    assert len(answers) == sent[0], "a request got no answer"
    assert [a for a in answers if a[0] != 200] == []  # no request failed during the swap
    assert during > 0, "no request was answered while the new version loaded"
    assert {a[2] for a in answers} == {old_v, new_v}
    for status, j, version, probs in answers:  # each answer is the version it names, computed by it
        np.testing.assert_allclose(probs, want[version][j], atol=1e-5)
    first_new = next(i for i, a in enumerate(answers) if a[2] == new_v)
    assert all(a[2] == new_v for a in answers[first_new + 64 :])  # once switched, only stragglers answer old
    # The old version was drained, closed and freed: nothing (gc.freeze included) pins it.
    (retired,) = [r for r in st.retired if r.version == old_v]
    assert retired.released and gc.get_freeze_count() > 0


def test_a_corrupt_directory_is_refused_and_the_old_version_keeps_serving(repo_server, tiny_variant, tmp_path):
    srv, root = repo_server
    with httpx2.Client(base_url=srv.url, timeout=60, trust_env=False) as c:
        serving_v = c.get("/v1/models").json()["models"][0]["version"]
        bad = tmp_path / "bad"
        shutil.copytree(tiny_variant, bad)
        weights = bad / "model.safetensors"
        data = bytearray(weights.read_bytes())
        data[-1] ^= 0xFF  # same size, another sha256
        weights.write_bytes(bytes(data))
        _replace(root, "m", bad, tmp_path)
        r = c.post("/v2/repository/models/m/load")
        assert r.status_code == 400
        assert (
            "does not match its sha256" in r.json()["error"]
            and f"version {serving_v} keeps serving" in r.json()["error"]
        )
        r = c.post("/v1/classify", json={"inputs": "still here", "model": "m"})
        assert r.status_code == 200 and r.json()["model_version"] == serving_v
        assert c.post("/v2/repository/index").json() == [
            {"name": "m", "version": serving_v, "state": "READY", "reason": ""}
        ]
        assert 'qserve_model_loads_total{model="m",outcome="refused"} 1.0' in c.get("/metrics").text


def test_tritonclient_repository_calls(repo_server, tiny_variant):
    srv, root = repo_server
    triton = httpclient.InferenceServerClient(url=f"{srv.host}:{srv.port}")
    try:
        shutil.copytree(tiny_variant, root / "m2")  # a model added to the repository after start
        index = {m["name"]: m for m in triton.get_model_repository_index()}
        assert index["m"]["state"] == "READY" and index["m2"]["state"] == "UNAVAILABLE"
        triton.load_model("m2")
        assert triton.is_model_ready("m2")
        inp = httpclient.InferInput("text", [1], "BYTES")
        inp.set_data_from_numpy(np.array([b"great"], dtype=object))
        res = triton.infer("m2", [inp])
        assert res.get_response()["model_version"] == triton.get_model_metadata("m2")["versions"][0]
        triton.unload_model("m2")
        assert not triton.is_model_ready("m2")
        assert {m["name"]: m["state"] for m in triton.get_model_repository_index()} == {
            "m": "READY",
            "m2": "UNAVAILABLE",
        }
        with pytest.raises(InferenceServerException, match="unknown model 'm2'"):
            triton.infer("m2", [inp])
        with pytest.raises(InferenceServerException, match="load takes no parameters"):
            triton.load_model("m2", config='{"backend": "python"}')  # never a client's configuration or files
        with pytest.raises(InferenceServerException, match="no directory 'elsewhere'"):
            triton.load_model("elsewhere")
        assert triton.is_model_ready("m")
    finally:
        triton.close()


# -- a single DIR, and auth -------------------------------------------------------------------------
def test_a_single_dir_keeps_todays_names_and_the_repository_needs_the_key(tiny_variant):
    with (
        serving(_cfg(tiny_variant, api_key=KEY)) as srv,
        httpx2.Client(base_url=srv.url, timeout=30, trust_env=False) as c,
    ):
        auth = {"Authorization": f"Bearer {KEY}"}
        assert c.get("/ready").json() == {"ready": True, "model": "torch-fp32"}
        (m,) = c.get("/v1/models", headers=auth).json()["models"]
        assert m["id"] == "torch-fp32" and len(m["version"]) == 12
        assert c.get("/v2/models/torch-fp32/ready", headers=auth).json() == {"name": "torch-fp32", "ready": True}
        for path in (
            "/v2/repository/index",
            "/v2/repository/models/torch-fp32/load",
            "/v2/repository/models/torch-fp32/unload",
        ):
            r = c.post(path)
            assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer"), path
            assert c.post(path, headers={"Authorization": "Bearer wrong-key-000"}).status_code == 401
        assert c.post("/v2/repository/index", headers=auth).json()[0]["state"] == "READY"
        r = c.post("/v2/repository/models/torch-fp32/load", headers=auth)
        assert r.status_code == 200 and r.json()["version"] == m["version"]  # same directory: same version
        r = c.post("/v2/repository/models/other/load", headers=auth)
        assert r.status_code == 404 and "each from the DIR it was started with" in r.json()["error"]
