"""The clients people already have, against a real uvicorn: huggingface_hub's InferenceClient, TEI's /predict,
vLLM's /classify; pairs on a BERT classifier qserve did not train (`qserve export --inputs text,text_pair`);
one text, one answer across /v1, V2 (HTTP and gRPC), TEI and vLLM.

    python -m pytest tests/integration/test_serve_clients.py -q
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from conftest import build_tiny_checkpoint, serving

httpx2 = pytest.importorskip("httpx2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TEXTS = ["A wonderful, moving film.", "Dreadful, I walked out.", "ok"]
LONG = "the plot drags and the acting is wooden but the music is lovely " * 20  # past 64 tokens
PAIRS = [("A man is playing a guitar.", "Someone makes music."), ("The film won awards.", "It failed.")]


def _export(ckpt: Path, out: Path, **kw) -> Path:
    import exporters

    exporters.export(ckpt, "torch-fp32", out, **kw)
    return out


def _problem_checkpoint(out: Path, problem: str, num_labels: int) -> Path:
    build_tiny_checkpoint(out, seed=3, num_labels=num_labels)
    cfg = json.loads((out / "config.json").read_text())
    cfg["problem_type"] = problem
    (out / "config.json").write_text(json.dumps(cfg))
    return out


@pytest.fixture(scope="module")
def models(tiny_variant, tmp_path_factory) -> dict[str, Path]:
    """single (the default), a pair BERT exported with --inputs text,text_pair, multi-label, regression."""
    from tiny_archs import build

    tmp = tmp_path_factory.mktemp("clients")
    bert = build("bert", tmp / "bert-pair")
    from qserve.cli import main

    # as a user declares it: the CLI flag, on a plain save_pretrained BERT classifier (no qserve_model.json)
    assert (
        main(
            [
                "export",
                str(bert),
                "--variant",
                "torch-fp32",
                "--out",
                str(tmp / "pair"),
                "--inputs",
                "text,text_pair",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    return {
        "single": tiny_variant,
        "bert_ckpt": bert,
        "pair": tmp / "pair",
        "multi": _export(_problem_checkpoint(tmp / "multi-ckpt", "multi_label_classification", 3), tmp / "multi"),
        "reg": _export(_problem_checkpoint(tmp / "reg-ckpt", "regression", 1), tmp / "reg"),
    }


@pytest.fixture(scope="module")
def server(models):
    from qserve.serve.core.repository import Repository, sources_from_dirs
    from qserve.serve.infra.config import ServeConfig

    repo = Repository(sources_from_dirs([f"{k}={models[k]}" for k in ("single", "pair", "multi", "reg")]))
    cfg = ServeConfig(
        variant_dir=str(models["single"]), threads=1, max_inputs=64, max_chars=20000, max_wait_ms=2, grpc_port=0
    )
    with serving(cfg, repository=repo) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    with httpx2.Client(base_url=server.url, timeout=30, trust_env=False) as c:
        yield c


def _v1(client, texts, **kw) -> list[list[dict]]:
    r = client.post("/v1/classify", json={"inputs": texts, **kw})
    assert r.status_code == 200, r.text
    return r.json()["predictions"]


@pytest.fixture()
def loopback_hub_session():
    """HF_HUB_OFFLINE=1 (conftest) makes huggingface_hub refuse every URL, 127.0.0.1 too: for this test its
    client is a plain httpx.Client (the client only ever reaches the local server), then the default again.
    (huggingface_hub 1.x, which transformers 5 needs: set_client_factory replaced configure_http_backend.)"""
    import httpx
    import huggingface_hub
    from huggingface_hub.utils._http import default_client_factory

    huggingface_hub.set_client_factory(httpx.Client)
    try:
        yield
    finally:
        huggingface_hub.set_client_factory(default_client_factory)


def test_inference_client_text_classification_is_v1s_answer(server, client, loopback_hub_session):
    from huggingface_hub import InferenceClient

    hf = InferenceClient(model=server.url)
    for text in TEXTS:
        (want,) = _v1(client, [text])
        got = hf.text_classification(text)
        assert [(e.label, e.score) for e in got] == [(p["label"], p["score"]) for p in want]
        top = hf.text_classification(text, top_k=1)
        assert [(e.label, e.score) for e in top] == [(want[0]["label"], want[0]["score"])]
    # function_to_apply: none = the logits (TEI's raw_scores); softmax of them = the served softmax
    raw = hf.text_classification(TEXTS[0], function_to_apply="none")
    tei_raw = client.post("/predict", json={"inputs": TEXTS[0], "raw_scores": True}).json()
    assert [(e.label, e.score) for e in raw] == [(p["label"], p["score"]) for p in tei_raw]
    z = np.array([e.score for e in raw], dtype=np.float64)
    soft = hf.text_classification(TEXTS[0], function_to_apply="softmax")
    np.testing.assert_allclose([e.score for e in soft], np.exp(z) / np.exp(z).sum(), atol=1e-6)


def test_tei_predict_shapes(client):
    # like with like: a text alone against a text alone, a batch against the same batch (a batch's padding
    # may move a torch score by an ulp; the invariant promises 1e-5, a protocol must not move it at all)
    want = _v1(client, TEXTS)
    one = client.post("/predict", json={"inputs": TEXTS[0]})
    assert one.status_code == 200
    assert one.json() == [{"score": p["score"], "label": p["label"]} for p in _v1(client, [TEXTS[0]])[0]]
    flat = client.post("/predict", json={"inputs": [TEXTS[0]]}).json()  # TEI: [text] is one sequence
    assert flat == one.json()
    batch = client.post("/predict", json={"inputs": [[t] for t in TEXTS]}).json()
    assert batch == [[{"score": p["score"], "label": p["label"]} for p in row] for row in want]
    # a one-text model cannot take a pair: a flat list of several strings is a batch
    assert client.post("/predict", json={"inputs": TEXTS}).json() == batch
    raw = client.post("/predict", json={"inputs": [[t] for t in TEXTS], "raw_scores": True}).json()
    for row, probs in zip(raw, want):
        z = np.array([p["score"] for p in row], dtype=np.float64)
        assert [p["label"] for p in row] == [p["label"] for p in probs]  # sorted by logit = by probability
        np.testing.assert_allclose(np.exp(z) / np.exp(z).sum(), [p["score"] for p in probs], atol=1e-6)
    pair = client.post("/predict", json={"inputs": [["a", "b"]]})
    assert pair.status_code == 413 and pair.json()["error_type"] == "validation"
    assert "takes one text per input" in pair.json()["error"]
    info = client.get("/info").json()
    assert info["model_type"]["classifier"]["id2label"] == {"0": "negative", "1": "positive"}
    assert info["model_type"]["classifier"]["label2id"] == {"negative": 0, "positive": 1}
    assert info["max_input_length"] == 64 and info["model_id"] == "single" and info["auto_truncate"] is True


def test_tei_length_semantics_and_errors(client):
    # truncate (default true): Right keeps the start = qserve head, Left the end = tail
    head, tail = (_v1(client, [LONG], long_text=p)[0] for p in ("head", "tail"))
    strip = lambda rows: [{"score": p["score"], "label": p["label"]} for p in rows]  # noqa: E731
    assert client.post("/predict", json={"inputs": LONG}).json() == strip(head)
    assert client.post(
        "/predict", json={"inputs": LONG, "truncate": True, "truncation_direction": "Right"}
    ).json() == strip(head)
    assert client.post("/predict", json={"inputs": LONG, "truncation_direction": "Left"}).json() == strip(tail)
    windows = _v1(client, [LONG], long_text="windows")[0]
    assert client.post("/predict", json={"inputs": LONG, "long_text": "windows"}).json() == strip(windows)
    # truncate false: a text past max_length is TEI's 413 validation error; a short one is answered
    r = client.post("/predict", json={"inputs": LONG, "truncate": False})
    assert r.status_code == 413 and set(r.json()) == {"error", "error_type"}
    assert r.json()["error_type"] == "validation" and "must have less than 64 tokens" in r.json()["error"]
    assert client.post("/predict", json={"inputs": "fine", "truncate": False}).status_code == 200
    bad = client.post("/predict", json={"inputs": 3})
    assert bad.status_code == 422 and bad.json()["error_type"] == "validation"
    many = client.post("/predict", json={"inputs": [["x"]] * 65})
    assert many.status_code == 413 and "at most 64" in many.json()["error"]
    toks = client.post("/tokenize", json={"inputs": "Hello world"}).json()
    assert [t["text"] for t in toks[0]] == ["[CLS]", "Hello", "world", "[SEP]"]
    assert toks[0][0]["special"] and toks[0][1]["start"] == 0 and toks[0][1]["stop"] == 5
    ids = [t["id"] for t in toks[0]]
    assert client.post("/decode", json={"ids": ids}).json() == ["hello world"]


def test_pair_model_from_save_pretrained_scores_as_transformers(models, client, server):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    manifest = json.loads((models["pair"] / "manifest.json").read_text())
    assert manifest["inputs"] == ["text", "text_pair"] and manifest["parity"]
    ckpt = models["bert_ckpt"]
    tok, ref = AutoTokenizer.from_pretrained(ckpt), AutoModelForSequenceClassification.from_pretrained(ckpt).eval()
    with torch.no_grad():
        want = np.stack(
            [
                ref(**tok(a, b, truncation=True, max_length=manifest["max_length"], return_tensors="pt"))
                .logits[0]
                .numpy()
                for a, b in PAIRS
            ]
        )
    labels = list(manifest["labels"])
    # TEI with raw_scores: the logits, each pair scored as transformers scores it
    from qserve.serve.core.repository import Repository  # noqa: F401 - the pair model is not the default: its own server
    from qserve.serve.infra.config import ServeConfig

    with (
        serving(ServeConfig(variant_dir=str(models["pair"]), threads=1)) as srv,
        httpx2.Client(base_url=srv.url, timeout=30, trust_env=False) as c,
    ):
        raw = c.post("/predict", json={"inputs": [list(p) for p in PAIRS], "raw_scores": True}).json()
        for row, z in zip(raw, want):
            got = {p["label"]: p["score"] for p in row}
            np.testing.assert_allclose([got[x] for x in labels], z, atol=1e-5)
        one = c.post("/predict", json={"inputs": list(PAIRS[0])}).json()  # TEI: [text, text_pair] is one pair
        v1 = c.post("/v1/classify", json={"inputs": [{"text": PAIRS[0][0], "text_pair": PAIRS[0][1]}]}).json()
        assert one == [{"score": p["score"], "label": p["label"]} for p in v1["predictions"][0]]
        assert c.post("/predict", json={"inputs": "alone"}).status_code == 413  # a pair model takes pairs
    # V2 on the shared server names the pair model
    v2 = client.post(
        "/v2/models/pair/infer",
        json={
            "inputs": [
                {"name": "text", "datatype": "BYTES", "shape": [2], "data": [a for a, _ in PAIRS]},
                {"name": "text_pair", "datatype": "BYTES", "shape": [2], "data": [b for _, b in PAIRS]},
            ]
        },
    ).json()
    probs = np.array(next(o for o in v2["outputs"] if o["name"] == "probabilities")["data"]).reshape(2, -1)
    np.testing.assert_allclose(probs, np.exp(want) / np.exp(want).sum(1, keepdims=True), atol=1e-5)


def test_export_inputs_names_the_allowed_values():
    from exporters.core import parse_inputs
    from qserve import QserveError

    assert parse_inputs("text, text_pair") == ("text", "text_pair") and parse_inputs(None) is None
    with pytest.raises(QserveError, match=r"--inputs 'text,pair': allowed values are text or text,text_pair"):
        parse_inputs("text,pair")


def test_vllm_classify_per_problem_type(client):
    models = client.get("/v1/models").json()
    assert models["object"] == "list" and {m["id"] for m in models["data"]} == {"single", "pair", "multi", "reg"}
    assert all(m["object"] == "model" and isinstance(m["created"], int) for m in models["data"])
    assert models["default"] == "single" and len(models["models"]) == 4  # what it returned before stays
    for name in ("single", "multi", "reg"):
        v1 = client.post("/v1/classify", json={"inputs": TEXTS, "model": name}).json()
        r = client.post("/classify", json={"model": name, "input": TEXTS})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["object"] == "list" and body["model"] == name and body["id"].startswith("classify-")
        assert body["usage"]["prompt_tokens"] == sum(v1["tokens"]) == body["usage"]["total_tokens"]
        for i, (d, preds) in enumerate(zip(body["data"], v1["predictions"])):
            assert d["index"] == i and d["num_classes"] == len(d["probs"])
            by = {p["label"]: p["score"] for p in preds}
            if name == "reg":
                assert d["probs"] == [by["value"]] and d["num_classes"] == 1
            else:
                labels = sorted(by, key=lambda x: -by[x])
                assert d["label"] == labels[0] and sorted(d["probs"], reverse=True) == [by[x] for x in labels]
    one = client.post("/classify", json={"input": TEXTS[0]}).json()
    assert one["model"] == "single" and len(one["data"]) == 1
    assert client.post("/classify", json={"model": "nope", "input": "x"}).status_code == 404
    assert client.post("/classify", json={"input": LONG, "truncate_prompt_tokens": -1}).json()["data"][0]["probs"] == [
        p["score"]
        for p in sorted(
            _v1(client, [LONG], long_text="tail")[0], key=lambda p: ["negative", "positive"].index(p["label"])
        )
    ]
    assert client.post("/classify", json={"input": LONG, "truncate_prompt_tokens": 5}).status_code == 422


def _answers(client, grpc_target: str, texts: list[str]) -> dict[str, list[tuple[str, float]]]:
    """(best label, its score) per text from every protocol, one request per text."""
    import grpc
    import tritonclient.grpc as tg

    out: dict[str, list[tuple[str, float]]] = {}
    out["v1"] = [(p[0]["label"], p[0]["score"]) for t in texts for p in _v1(client, [t])]
    tei = [client.post("/predict", json={"inputs": t}).json()[0] for t in texts]
    out["tei"] = [(p["label"], p["score"]) for p in tei]
    vl = [client.post("/classify", json={"input": t}).json()["data"][0] for t in texts]
    out["vllm"] = [(d["label"], max(d["probs"])) for d in vl]
    v2 = []
    for t in texts:
        o = {
            x["name"]: x["data"]
            for x in client.post(
                "/v2/models/single/infer",
                json={"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [t]}]},
            ).json()["outputs"]
        }
        v2.append((o["label"][0], max(o["probabilities"])))
    out["v2"] = v2
    g = tg.InferenceServerClient(grpc_target)
    rows = []
    for t in texts:
        i = tg.InferInput("text", [1], "BYTES")
        i.set_data_from_numpy(np.array([t.encode()], dtype=object))
        r = g.infer("single", [i])
        rows.append((r.as_numpy("label")[0].decode(), float(r.as_numpy("probabilities")[0].max())))
    out["v2-grpc"] = rows
    g.close()
    del grpc
    return out


def test_one_text_one_answer_across_protocols(server, client):
    import random

    from qserve.data.datasets import load_dataset

    texts = list(load_dataset("default", seed=0).test.texts[:16])  # real reviews, most past 64 tokens
    grpc_target = f"{server.host}:{server.server.config.app.state.grpc.port}"
    alone = _answers(client, grpc_target, texts)
    for name, rows in alone.items():
        assert rows == alone["v1"], name  # to the last bit: the same float32 rendered the same
    # concurrently, every protocol at once, shuffled: the same answers
    jobs = [(p, i) for p in ("v1", "tei", "vllm", "v2") for i in range(len(texts))]
    random.Random(0).shuffle(jobs)

    def one(job):
        p, i = job
        with httpx2.Client(base_url=server.url, timeout=30, trust_env=False) as c:
            return job, _answers_one(c, p, texts[i])

    with ThreadPoolExecutor(8) as pool:
        for (p, i), got in pool.map(one, jobs):
            # batchmates differ under load: the label is the same, the score within the invariant's 1e-5
            # (torch pads a batch; a row-by-row variant such as onnx-int8 gives the same bits)
            assert got[0] == alone["v1"][i][0] and got[1] == pytest.approx(alone["v1"][i][1], abs=1e-5), (p, i)
    metrics = client.get("/metrics").text
    for proto in ("v1", "v2", "tei", "vllm"):
        assert f'qserve_protocol_requests_total{{model="single",protocol="{proto}",status="200"}}' in metrics


def _answers_one(c, protocol: str, text: str) -> tuple[str, float]:
    if protocol == "v1":
        p = c.post("/v1/classify", json={"inputs": [text]}).json()["predictions"][0][0]
        return p["label"], p["score"]
    if protocol == "tei":
        p = c.post("/predict", json={"inputs": text}).json()[0]
        return p["label"], p["score"]
    if protocol == "vllm":
        d = c.post("/classify", json={"input": text}).json()["data"][0]
        return d["label"], max(d["probs"])
    o = {
        x["name"]: x["data"]
        for x in c.post(
            "/v2/models/single/infer",
            json={"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [text]}]},
        ).json()["outputs"]
    }
    return o["label"][0], max(o["probabilities"])


def test_auth_covers_the_new_routes_and_post_root(tiny_variant):
    from qserve.serve.infra.config import ServeConfig

    with (
        serving(ServeConfig(variant_dir=str(tiny_variant), threads=1, api_key="s3cret-key")) as srv,
        httpx2.Client(base_url=srv.url, timeout=30, trust_env=False) as c,
    ):
        assert c.get("/").status_code == 200  # the page stays open
        for path, body in (
            ("/", {"inputs": "x", "parameters": {}}),
            ("/predict", {"inputs": "x"}),
            ("/classify", {"input": "x"}),
            ("/tokenize", {"inputs": "x"}),
        ):
            r = c.post(path, json=body)
            assert r.status_code == 401, path
            assert ("error_type" in r.json()) is (path != "/classify"), r.json()  # TEI's shape on TEI's routes
            ok = c.post(path, json=body, headers={"Authorization": "Bearer s3cret-key"})
            assert ok.status_code == 200, (path, ok.text)
        assert c.get("/info").status_code == 401
        r = c.request("OPTIONS", "/", headers={"Authorization": "Bearer s3cret-key"})
        assert r.status_code == 405 and r.headers["allow"] == "GET, POST"
