"""The Ray Serve engine on a real local Ray instance (num_cpus=2), 2 replicas of the tiny variant.

    python -m pytest tests/integration/test_serve_ray.py -q

One Ray instance and one Serve proxy serve every test in this module (starting Ray
costs seconds of both cores); the replica-kill test runs last among the app tests and
leaves the deployment at 2 RUNNING replicas, the `serve run` test replaces the app, and a regression model
replaces it last.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

httpx2 = pytest.importorskip("httpx2")
import ray  # noqa: E402 - the ray extra is part of `make test` (Makefile EXTRAS): no skip when it is missing
from ray import serve  # noqa: E402
from test_serve_api import MAX_BODY, MAX_CHARS, MAX_INPUTS, V1_BAD, V2_BAD  # noqa: E402

SETTINGS = {
    "threads": 1,
    "max_batch_size": 32,
    "max_wait_ms": 30,
    "max_inputs": MAX_INPUTS,
    "max_chars": MAX_CHARS,
    "max_body_bytes": MAX_BODY,
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _replicas(c) -> dict:
    r = c.get("/v1/models")
    return r.json() if r.status_code == 200 else {}


# How long a replica may take to (re)start: a bound for a hang, not a speed claim. A replacement replica imports
# torch and the runtime in a fresh worker; on a 2-core machine with other work beside the suite that took over
# 120 s (an AVX2 EPYC), while alone it takes seconds.
REPLICA_START_S = 360.0


def _wait_running(c, n: int, timeout: float = REPLICA_START_S, gone: str | None = None) -> dict:
    deadline = time.monotonic() + timeout
    info: dict = {}
    while time.monotonic() < deadline:
        try:
            info = _replicas(c)
        except httpx2.TransportError:
            info = {}
        states = [r["state"] for r in info.get("replicas") or []]
        ids = [r["id"] for r in info.get("replicas") or []]
        if states.count("RUNNING") == n and len(states) == n and gone not in ids:
            return info
        time.sleep(0.5)
    raise AssertionError(f"deployment not back to {n} RUNNING replicas within {timeout} s: {info}")


@pytest.fixture(scope="module")
def ray_url():
    """A local Ray instance with 2 CPUs and Serve's proxy on a free loopback port."""
    port = _free_port()
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def ray_app(ray_url, tiny_variant):
    from qserve.serve.infra.deploy import Scaling
    from qserve.serve.ray_engine import application

    # 2 replicas x 1 CPU: what `qserve serve --engine ray --replicas 2` picks on a 2-core machine.
    serve.run(
        application({"variant_dir": str(tiny_variant), **SETTINGS}, Scaling(2), cores=2),
        name="qserve",
        route_prefix="/",
    )
    with httpx2.Client(base_url=ray_url, timeout=30, trust_env=False) as c:
        _wait_running(c, 2)
        yield c


@pytest.fixture(scope="module")
def reference(tiny_variant):
    from qserve.runtime import load_runtime

    return load_runtime(tiny_variant)


@pytest.fixture(scope="module")
def expected(reference) -> dict[str, np.ndarray]:
    """{text: the reference's scores} for the load tests' 96 texts, in one batched call: the served answers come from
    batches of other texts too, so one text's scores hold to 1e-5 in any batch (the property the load tests check);
    a call per request cost the tests more than their requests (hundreds of calls on a loaded 2-core machine)."""
    from qserve.loadtest import default_texts

    texts = default_texts(96)
    return dict(zip(texts, reference.predict(texts)))


def _probs(preds: list[dict], labels: list[str]) -> list[float]:
    by = {p["label"]: p["score"] for p in preds}
    return [by[label] for label in labels]


def test_two_replicas_running_and_reported(ray_app):
    r = ray_app.get("/v1/models")
    assert r.status_code == 200, r.text
    info = r.json()
    assert info["engine"] == "ray" and info["replica_count"] == 2 and info["target_replicas"] == 2
    assert [x["state"] for x in info["replicas"]] == ["RUNNING", "RUNNING"]
    ids = {x["id"] for x in info["replicas"]}
    assert len(ids) == 2 and r.headers["x-qserve-replica"] in ids and info["replica"] in ids
    (m,) = info["models"]
    assert m["id"] == "torch-fp32" and m["parity"]["agreement"] == 1.0  # loaded through load_runtime + manifest
    assert ray_app.get("/ready").json() == {"ready": True, "model": "torch-fp32"}
    metrics = ray_app.get("/metrics")
    assert metrics.status_code == 200 and metrics.headers["x-qserve-replica"] in ids
    assert f'qserve_replica_info{{engine="ray",replica="{metrics.headers["x-qserve-replica"]}"}} 1.0' in metrics.text


def test_64_clients_x_8_requests_all_answered_exactly_across_replicas(ray_app, ray_url, reference, expected):
    from qserve.loadtest import default_texts

    texts = default_texts(96)
    plan = [[texts[(w * 8 + k) % len(texts)] for k in range(8)] for w in range(64)]

    async def client(c, mine: list[str]) -> list:
        out = []
        for i, t in enumerate(mine):
            body = {"inputs": t} if i % 3 else {"inputs": [t, texts[(i + 7) % len(texts)]]}
            out.append((body, await c.post("/v1/classify", json=body)))
        return out

    async def go():
        limits = httpx2.Limits(max_connections=64)
        async with httpx2.AsyncClient(base_url=ray_url, timeout=60, limits=limits, trust_env=False) as c:
            return await asyncio.gather(*(client(c, mine) for mine in plan))

    results = [x for per_client in asyncio.run(go()) for x in per_client]
    assert len(results) == 64 * 8
    assert [r.status_code for _, r in results] == [200] * (64 * 8), [
        r.text for _, r in results if r.status_code != 200
    ][:3]
    for body, r in results:
        sent = [body["inputs"]] if isinstance(body["inputs"], str) else body["inputs"]
        got = [_probs(p, reference.labels) for p in r.json()["predictions"]]
        np.testing.assert_allclose(got, [expected[t] for t in sent], atol=1e-5)
    served_by = {r.headers["x-qserve-replica"] for _, r in results}
    assert len(served_by) >= 2, f"every answer came from one replica: {served_by}"


@pytest.fixture(scope="module")
def uvicorn_client(tiny_variant):
    """The uvicorn engine with the same settings: the error bodies the Ray engine must reproduce."""
    import torch

    from qserve.serve.app import create_app
    from qserve.serve.infra.config import ServeConfig
    from qserve.serve.infra.uvicorn_server import ServerThread

    threads = torch.get_num_threads()
    srv = ServerThread(create_app(ServeConfig(variant_dir=str(tiny_variant), **SETTINGS))).start()
    try:
        with httpx2.Client(base_url=srv.url, timeout=30, trust_env=False) as c:
            for _ in range(600):
                if c.get("/ready").status_code == 200:
                    break
                time.sleep(0.05)
            yield c
    finally:
        srv.stop()
        torch.set_num_threads(threads)


def _bad_requests() -> list[tuple[str, str, dict]]:
    cases = [("POST", "/v1/classify", {"json": body}) for body, _, _ in V1_BAD]
    cases += [("POST", f"/v2/models/{name}/infer", {"json": body}) for name, body, _, _ in V2_BAD]
    big = json.dumps({"inputs": ["y" * 1000] * 80}).encode()
    cases += [
        ("POST", "/v1/classify", {"content": b'{"inputs": ', "headers": {"content-type": "application/json"}}),
        ("POST", "/v1/classify", {"content": b'{"inputs": "hi"}', "headers": {"content-type": "text/plain"}}),
        ("POST", "/v1/classify", {"content": big, "headers": {"content-type": "application/json"}}),
        ("GET", "/v1/classify", {}),
        ("GET", "/v3/nothing", {}),
        ("GET", "/v2/models/nope", {}),
    ]
    return cases


def test_bad_input_gets_the_same_4xx_bodies_as_uvicorn(ray_app, uvicorn_client):
    for method, path, kw in _bad_requests():
        want = uvicorn_client.request(method, path, **kw)
        got = ray_app.request(method, path, **kw)
        assert 400 <= want.status_code < 500, (path, want.text)
        assert got.status_code == want.status_code, (method, path, got.text, want.text)
        assert got.json()["error"] == want.json()["error"], (method, path)
        assert got.json()["request_id"] == got.headers["x-request-id"]  # one id, not the proxy's and ours
        assert "x-qserve-replica" in got.headers


def test_killed_replica_is_replaced_and_no_request_hangs(ray_app, ray_url, reference, expected):
    from qserve.loadtest import default_texts

    before = _wait_running(ray_app, 2)
    victim = before["replicas"][0]
    texts = default_texts(32)
    outcomes: list[tuple[int, str]] = []
    stop_at = [float("inf")]

    async def client(c, w: int) -> None:
        i = w
        while time.monotonic() < stop_at[0]:
            t = texts[i % len(texts)]
            i += 1
            try:  # a hang would hit this timeout and fail the test
                r = await c.post("/v1/classify", json={"inputs": t})
            except httpx2.TimeoutException as e:
                outcomes.append((-1, f"hung: {type(e).__name__}"))
                continue
            except httpx2.TransportError as e:
                outcomes.append((-2, f"no answer: {type(e).__name__}"))
                continue
            outcomes.append((r.status_code, r.text))
            if r.status_code == 200:
                np.testing.assert_allclose(_probs(r.json()["predictions"][0], reference.labels), expected[t], atol=1e-5)

    async def kill_later() -> None:
        await asyncio.sleep(1.5)  # under load
        from ray.serve.context import _get_global_client
        from ray.serve.schema import ServeInstanceDetails

        details = ServeInstanceDetails(**_get_global_client().get_serve_details())
        dep = details.applications["qserve"].deployments["QserveReplica"]
        (rep,) = [r for r in dep.replicas if r.replica_id == victim["id"]]
        ray.kill(ray.get_actor(rep.actor_name, namespace="serve"), no_restart=True)
        stop_at[0] = time.monotonic() + 4.0  # keep loading while Ray notices and replaces it

    async def go():
        async with httpx2.AsyncClient(
            base_url=ray_url, timeout=30, trust_env=False, limits=httpx2.Limits(max_connections=16)
        ) as c:
            await asyncio.gather(kill_later(), *(client(c, w) for w in range(16)))

    asyncio.run(go())
    codes = [code for code, _ in outcomes]
    print(
        "outcomes around the kill:",
        dict(sorted(Counter(codes).items())),
        {text[:160] for code, text in outcomes if code != 200},
    )
    assert -1 not in codes and -2 not in codes, [o for o in outcomes if o[0] < 0][:3]
    assert codes.count(200) > 0
    for code, text in outcomes:
        assert code == 200 or 500 <= code < 600, (code, text)
        if code != 200:
            assert text.strip(), f"HTTP {code} without a body"
    # The controller notices the dead actor and starts a replacement (a new replica id).
    after = _wait_running(ray_app, 2, gone=victim["id"])
    ids = {r["id"] for r in after["replicas"]}
    r = ray_app.post("/v1/classify", json={"inputs": texts[0]})
    assert r.status_code == 200 and r.headers["x-qserve-replica"] in ids


def test_deploy_config_runs_under_rays_own_serve_run(ray_app, ray_url, tiny_variant, reference, tmp_path):
    import yaml

    from qserve.cli import main

    out = tmp_path / "serve_config.yaml"
    port = int(ray_url.rsplit(":", 1)[1])
    assert (
        main(
            [
                "deploy",
                "ray",
                str(tiny_variant),
                "--out",
                str(out),
                "--replicas",
                "1",
                "--threads",
                "1",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--max-inputs",
                "8",
            ]
        )
        == 0
    )
    doc = yaml.safe_load(out.read_text())
    (app,) = doc["applications"]
    assert app["import_path"] == "qserve.serve.ray_engine:build_app" and app["args"]["variant_dir"] == str(tiny_variant)
    assert app["deployments"][0]["num_replicas"] == 1 and app["deployments"][0]["ray_actor_options"]["num_cpus"] == 1
    # Ray's own CLI, unchanged file, joining this test's Ray instance; it replaces the app named "qserve".
    serve_cli = Path(sys.executable).with_name("serve")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [str(serve_cli), "run", "--non-blocking", "--address", ray.get_runtime_context().gcs_address, str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    deadline = time.monotonic() + REPLICA_START_S
    while True:
        info = _replicas(ray_app)
        if (
            info.get("replica_count") == 1
            and info.get("target_replicas") == 1
            and [x["state"] for x in info["replicas"]] == ["RUNNING"]
        ):
            break
        assert time.monotonic() < deadline, f"serve run's app never came up with 1 replica: {info}"
        time.sleep(0.5)
    r = ray_app.post("/v1/classify", json={"inputs": ["a fine film", "a dull film"]})
    assert r.status_code == 200, r.text
    got = [_probs(p, reference.labels) for p in r.json()["predictions"]]
    np.testing.assert_allclose(got, reference.predict(["a fine film", "a dull film"]), atol=1e-5)
    r = ray_app.post("/v1/classify", json={"inputs": ["x"] * 9})  # the file's --max-inputs 8 is in force
    assert r.status_code == 422 and "at most 8 per request" in r.json()["error"]


def test_regression_model_answers_its_value_on_the_same_instance(ray_app, ray_url, regression_checkpoint, tmp_path):
    """A regression model replaces the app (after the `serve run` test: one replica of one CPU, so the new one
    fits beside it while Serve swaps them) and answers /v1 and V2 as the runtime does. On this module's Ray
    instance rather than one of its own: a Ray start costs ~15 s of both cores. The model is the suite's shared
    regression checkpoint (trained once by the real `qserve train`, conftest.py)."""
    from test_problem_types import TEXTS

    import exporters
    from qserve.runtime import load_runtime
    from qserve.serve.infra.deploy import Scaling
    from qserve.serve.ray_engine import application

    ck = regression_checkpoint
    variant = tmp_path / "torch-fp32"
    exporters.export(ck, "torch-fp32", variant)
    want = load_runtime(variant).predict(TEXTS)[:, 0]

    serve.run(
        application({"variant_dir": str(variant), "threads": 1}, Scaling(1), cores=1), name="qserve", route_prefix="/"
    )
    deadline, info = time.monotonic() + REPLICA_START_S, {}
    while [m.get("problem_type") for m in info.get("models") or []] != ["regression"]:
        assert time.monotonic() < deadline, f"the regression app never answered /v1/models: {info}"
        time.sleep(0.5)
        try:
            info = _replicas(ray_app)
        except httpx2.TransportError:
            info = {}
    _wait_running(ray_app, 1)  # the tiny classifier's replica gone: every request below meets the new one
    body = ray_app.post("/v1/classify", json={"inputs": TEXTS}).json()
    assert body["problem_type"] == "regression"
    assert [p[0]["label"] for p in body["predictions"]] == ["value"] * len(TEXTS)
    np.testing.assert_allclose([p[0]["score"] for p in body["predictions"]], want, atol=1e-5)
    r = ray_app.post("/v1/classify", json={"inputs": "x", "threshold": 0.5})
    assert r.status_code == 422 and "multi-label models only" in r.json()["error"]
    v2 = {"inputs": [{"name": "text", "shape": [len(TEXTS)], "datatype": "BYTES", "data": TEXTS}]}
    out = {o["name"]: o for o in ray_app.post("/v2/models/torch-fp32/infer", json=v2).json()["outputs"]}
    assert out["value"]["shape"] == [len(TEXTS), 1] and "probabilities" not in out
    np.testing.assert_allclose(out["value"]["data"], want, atol=1e-5)


def test_deploy_refuses_a_relative_variant_path(tiny_variant, tmp_path, monkeypatch, capsys):
    from qserve.cli import main

    monkeypatch.chdir(tiny_variant.parent)
    assert main(["deploy", "ray", tiny_variant.name, "--out", str(tmp_path / "c.yaml")]) == 2
    err = capsys.readouterr().err
    assert "relative" in err and "absolute path every node can read" in err
    assert not (tmp_path / "c.yaml").exists()


def test_missing_ray_extra_names_the_install_command(tiny_variant, monkeypatch, capsys):
    from qserve.cli import main

    monkeypatch.setitem(sys.modules, "ray", None)  # as if the extra were not installed: `import ray` raises
    monkeypatch.delitem(sys.modules, "qserve.serve.ray_engine", raising=False)  # so the engine imports it anew
    assert main(["serve", str(tiny_variant), "--engine", "ray"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'qserve[ray]'" in err and "ray[serve]==2.60.0" in err


def test_scaling_flags_map_to_ray_options(tiny_variant, monkeypatch, capsys):
    from qserve.cli import main
    from qserve.serve.infra.deploy import Scaling, deployment_options

    fixed = deployment_options(Scaling.parse("2", None, None, None), max_batch_size=32, cores=2)
    assert fixed["num_replicas"] == 2 and fixed["ray_actor_options"] == {"num_cpus": 1.0}
    assert fixed["max_ongoing_requests"] == 64 and "autoscaling_config" not in fixed
    auto = deployment_options(Scaling.parse("auto", 1, 4, 2), max_batch_size=16, cores=2)
    assert auto["autoscaling_config"] == {
        "min_replicas": 1,
        "max_replicas": 4,
        "initial_replicas": 1,
        "target_ongoing_requests": 16,
    }
    assert auto["ray_actor_options"] == {"num_cpus": 2.0} and "num_replicas" not in auto
    for argv, fragment in [
        (["--replicas", "2"], "only apply with --engine ray"),
        (["--engine", "ray", "--replicas", "0"], "--replicas 0: must be >= 1"),
        (["--engine", "ray", "--replicas", "two"], "positive integer or 'auto'"),
        (["--engine", "ray", "--replicas", "2", "--min-replicas", "1"], "only apply with --replicas auto"),
        (
            ["--engine", "ray", "--replicas", "auto", "--min-replicas", "3", "--max-replicas", "2"],
            "need 0 <= min <= max",
        ),
    ]:
        assert main(["serve", str(tiny_variant), *argv]) == 2
        assert fragment in capsys.readouterr().err, argv
    # More CPUs than the machine has would leave Ray waiting forever: refused before Ray starts.
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert main(["serve", str(tiny_variant), "--engine", "ray", "--replicas", "2", "--threads", "2"]) == 2
    assert "4 CPUs, but this machine has 2" in capsys.readouterr().err
