"""Text pairs end to end: the tokenizer's pair encoding, a pair dataset, training, export and serving.

    python -m pytest tests/integration/test_text_pairs.py -q

A tiny random BERT-layout classifier (tests/tiny_archs.py) is fine-tuned by `qserve train` on a small
local pairs.jsonl (the label says whether the two texts share their topic word), exported (torch-fp32,
and onnx-int8: calibrated and run row by row) and served: /v1's {text, text_pair}, V2's second input
`text_pair` over HTTP and over gRPC with tritonclient. Every answer is compared with the fp32 model on
what `tokenizer(text, text_pair, truncation="longest_first", max_length=...)` makes.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import serving

MAX_LENGTH = 32
TOPICS = ["guitar", "river", "castle", "engine", "garden", "planet", "violin", "desert"]
LONG = "the story wanders from scene to scene without a point " * 8  # past MAX_LENGTH: truncated
PAIRS = [
    ("a song played on a guitar", "the guitar was loud"),
    ("a walk by the river", "a castle on a hill"),
    (LONG, "a short second text"),
    ("ok", LONG),
    (LONG, LONG + " again"),
]


def _pairs_file(path: Path) -> Path:
    rows = []
    for i in range(80):
        a, b = TOPICS[i % len(TOPICS)], TOPICS[(i * 3 + 1) % len(TOPICS)]
        same = i % 2 == 0
        rows.append(
            {
                "text": f"example {i} talks about the {a}",
                "text_pair": f"this one mentions the {a if same else b} too",
                "label": "same" if same else "other",
            }
        )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# -- the pair encoding is the tokenizer's -------------------------------------------------------------
def _tokenizers(tmp: Path) -> dict:
    """Tokenizers of several architectures, built offline: BERT (fast and slow), ELECTRA and DistilBERT on
    the embedded WordPiece vocab; RoBERTa on a byte-level BPE trained here."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import (
        BertTokenizer,
        BertTokenizerFast,
        DistilBertTokenizerFast,
        ElectraTokenizerFast,
        RobertaTokenizer,
    )

    from qserve.modeling import default_model_dir

    vocab = str(default_model_dir() / "vocab.txt")
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        [a + " " + b for a, b in PAIRS] * 4,
        vocab_size=300,
        min_frequency=1,
        special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
    )
    bpe.save_model(str(tmp))
    return {
        "bert": BertTokenizerFast(vocab),
        "bert-slow": BertTokenizer(vocab),
        "electra": ElectraTokenizerFast(vocab),
        "distilbert": DistilBertTokenizerFast(vocab),
        # transformers 5's RobertaTokenizer is the tokenizers-backed one (RobertaTokenizerFast its old name)
        "roberta": RobertaTokenizer(str(tmp / "vocab.json"), str(tmp / "merges.txt")),
    }


def test_pair_pieces_are_what_the_tokenizer_makes(tmp_path):
    from qserve import longtext
    from qserve.textpairs import split_pairs

    texts, pairs = [a for a, _ in PAIRS], [b for _, b in PAIRS]
    for name, tok in _tokenizers(tmp_path).items():
        segments = "token_type_ids" in tok.model_input_names
        assert segments == (name not in ("roberta", "distilbert")), name
        pieces = split_pairs(tok, texts, pairs, MAX_LENGTH)
        want = tok(texts, pairs, truncation="longest_first", max_length=MAX_LENGTH, padding=True, return_tensors="np")
        got = longtext.pad(pieces.ids, int(tok.pad_token_id), tok.padding_side, segments, pieces.types)
        for key in ("input_ids", "attention_mask", "token_type_ids") if segments else ("input_ids", "attention_mask"):
            np.testing.assert_array_equal(got[key], want[key], err_msg=f"{name} {key}")
        if segments:  # the second segment really is 1
            assert got["token_type_ids"][0].max() == 1
        full = [len(tok(a, b)["input_ids"]) for a, b in PAIRS]
        assert pieces.tokens == full and pieces.truncated == [n > MAX_LENGTH for n in full], name
        assert pieces.truncated[2:] == [True, True, True] and pieces.windows == [1] * len(PAIRS)


# -- the data file -------------------------------------------------------------------------------------
def test_local_files_read_a_text_pair_column(tmp_path):
    from qserve import QserveError
    from qserve.data.datasets import load_dataset

    d = load_dataset(str(_pairs_file(tmp_path / "pairs.jsonl")))
    assert d.info["inputs"] == ["text", "text_pair"] and d.labels == ["other", "same"]
    for part in (d.train, d.val, d.test):
        assert part.pairs is not None and len(part.pairs) == len(part.texts)
        for t, p, y in zip(part.texts, part.pairs, part.labels):  # pairs stay with their texts and labels
            assert (t.split()[-1] in p) == (d.labels[y] == "same")
    csv = tmp_path / "pairs.csv"
    csv.write_text("text,text_pair,label\n" + "".join(f"a{i},b{i},{i % 2}\n" for i in range(30)), encoding="utf-8")
    assert load_dataset(str(csv)).train.pairs is not None
    js = tmp_path / "pairs.json"
    js.write_text(
        json.dumps(
            {
                "text": [f"a{i}" for i in range(30)],
                "text_pair": [f"b{i}" for i in range(30)],
                "label": [i % 2 for i in range(30)],
            }
        ),
        encoding="utf-8",
    )
    assert load_dataset(str(js)).test.pairs is not None
    # same text, other pair: not a duplicate
    dup = tmp_path / "dup.jsonl"
    dup.write_text(
        "".join(json.dumps({"text": "same", "text_pair": f"p{i}", "label": i % 2}) + "\n" for i in range(30)),
        encoding="utf-8",
    )
    assert load_dataset(str(dup)).info["duplicates_dropped"] == 0
    bad = tmp_path / "bad.jsonl"
    lines = [json.dumps({"text": f"a{i}", "text_pair": f"b{i}", "label": i % 2}) for i in range(30)]
    lines[4] = json.dumps({"text": "a4", "label": 0})
    bad.write_text("\n".join(lines), encoding="utf-8")
    with pytest.raises(QserveError, match=r"line 5: no `text_pair`"):
        load_dataset(str(bad))
    lines[4] = json.dumps({"text": "a4", "text_pair": "  ", "label": 0})
    bad.write_text("\n".join(lines), encoding="utf-8")
    with pytest.raises(QserveError, match=r"line 5: text_pair is empty"):
        load_dataset(str(bad))
    assert load_dataset("default", max_samples=50, max_eval_samples=20).train.pairs is None


# -- train, export, run --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pair_model(tmp_path_factory) -> dict[str, Path]:
    """`qserve train` on pairs.jsonl from a tiny random BERT (a few steps), then torch-fp32 and onnx-int8."""
    from tiny_archs import build

    import exporters

    root = tmp_path_factory.mktemp("pairs")
    base = build("bert", root / "tiny-bert")
    data = _pairs_file(root / "pairs.jsonl")
    out = root / "checkpoint"
    from qserve.cli import main

    # in-process, like test_problem_types' training: a child would spend ~5 s importing torch and transformers again
    assert (
        main(
            [
                "train",
                "--model",
                str(base),
                "--dataset",
                str(data),
                "--max-length",
                str(MAX_LENGTH),
                "--precision",
                "32-true",
                "--batch-size",
                "16",
                "--lr",
                "1e-3",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    variants = {"checkpoint": out}
    for name, options in (("torch-fp32", {}), ("onnx-int8", {"calibration_samples": 8})):
        variants[name] = root / name
        exporters.export(out, name, root / name, options=options)
    return variants


def _reference(ckpt: Path, pairs: list[tuple[str, str]]) -> np.ndarray:
    """The fp32 checkpoint's probabilities on tokenizer(text, text_pair, truncation="longest_first")."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ckpt)
    model = AutoModelForSequenceClassification.from_pretrained(ckpt).eval()
    enc = tok(
        [a for a, _ in pairs],
        [b for _, b in pairs],
        truncation="longest_first",
        max_length=MAX_LENGTH,
        padding=True,
        return_tensors="pt",
    )
    with torch.no_grad():
        return torch.softmax(model(**enc).logits, -1).numpy()


def test_pair_model_is_recorded_and_runs_as_its_tokenizer_encodes(pair_model):
    from qserve.runtime import load_runtime

    meta = json.loads((pair_model["checkpoint"] / "qserve_model.json").read_text())
    assert meta["inputs"] == ["text", "text_pair"]
    metrics = json.loads((pair_model["checkpoint"] / "train_metrics.json").read_text())
    assert metrics["test_accuracy"] > 0.5  # it learned something from the pairs in a few steps
    want = _reference(pair_model["checkpoint"], PAIRS)
    texts, pairs = [a for a, _ in PAIRS], [b for _, b in PAIRS]
    for name in ("torch-fp32", "onnx-int8"):
        manifest = json.loads((pair_model[name] / "manifest.json").read_text())
        assert manifest["inputs"] == ["text", "text_pair"] and manifest["parity"]["probes"] == 8
        rt = load_runtime(pair_model[name], "cpu")
        try:
            assert rt.inputs == ("text", "text_pair")
            r = rt.classify(texts, pairs=pairs)
            np.testing.assert_allclose(r.probs, want, atol=1e-5 if name == "torch-fp32" else 0.1, err_msg=name)
            assert r.truncated == [False, False, True, True, True] and r.windows == [1] * 5
            # a windows policy on a pair falls back to the tokenizer's truncation: the same answer
            np.testing.assert_allclose(rt.classify(texts, "windows", pairs=pairs).probs, r.probs, atol=1e-6)
            # one pair, one answer: alone, or among other pairs, in another order
            for i in range(len(texts)):
                alone = rt.classify([texts[i]], pairs=[pairs[i]]).probs[0]
                np.testing.assert_allclose(alone, r.probs[i], atol=1e-5, err_msg=f"{name} pair {i}")
            rev = rt.classify(texts[::-1], pairs=pairs[::-1]).probs[::-1]
            np.testing.assert_allclose(rev, r.probs, atol=1e-5, err_msg=name)
        finally:
            rt.close()


def test_a_one_text_model_refuses_pairs(tiny_variant):
    from qserve.runtime import load_runtime
    from qserve.textpairs import PairError

    rt = load_runtime(tiny_variant, "cpu")
    try:
        assert rt.inputs == ("text",)
        with pytest.raises(PairError, match="takes one text per input"):
            rt.classify(["a"], pairs=["b"])
    finally:
        rt.close()


def test_bench_accuracy_scores_the_pair_test_split(pair_model):
    from qserve.bench.measure import accuracy
    from qserve.data.datasets import load_dataset
    from qserve.runtime import load_runtime

    test = load_dataset(json.loads((pair_model["checkpoint"] / "qserve_model.json").read_text())["dataset"]).test
    rt = load_runtime(pair_model["torch-fp32"], "cpu")
    try:
        got = accuracy(rt, {"texts": test.texts, "labels": test.labels, "pairs": test.pairs})
        want = rt.predict(test.texts, pairs=test.pairs).argmax(-1)
    finally:
        rt.close()
    assert got["predictions"] == [int(p) for p in want]
    assert got["accuracy"] == np.mean(np.asarray(want) == np.asarray(test.labels))


# -- served: /v1, V2 HTTP, V2 gRPC ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(pair_model, tiny_variant):
    from qserve.serve.core.repository import Repository, sources_from_dirs
    from qserve.serve.infra.config import ServeConfig

    repo = Repository(sources_from_dirs([f"pairs={pair_model['onnx-int8']}", f"single={tiny_variant}"]))
    cfg = ServeConfig(
        variant_dir=str(pair_model["onnx-int8"]), threads=1, max_wait_ms=2, grpc_port=0, max_inputs=8, max_chars=600
    )
    with serving(cfg, repository=repo) as srv:
        yield srv


def _probs_v1(body: dict) -> np.ndarray:
    return np.array([[s["score"] for s in sorted(p, key=lambda s: s["label"])] for p in body["predictions"]])


def test_served_pairs_over_v1_and_v2_http(server, pair_model):
    import httpx2

    from qserve.runtime import load_runtime

    rt = load_runtime(pair_model["onnx-int8"], "cpu")
    texts, pairs = [a for a, _ in PAIRS], [b for _, b in PAIRS]
    want = rt.classify(texts, pairs=pairs).probs
    rt.close()
    with httpx2.Client(base_url=server.url, timeout=60, trust_env=False) as c:
        models = {m["id"]: m for m in c.get("/v1/models").json()["models"]}
        assert models["pairs"]["inputs"] == ["text", "text_pair"] and models["single"]["inputs"] == ["text"]
        body = c.post(
            "/v1/classify", json={"model": "pairs", "inputs": [{"text": a, "text_pair": b} for a, b in PAIRS]}
        ).json()
        np.testing.assert_allclose(_probs_v1(body), want, atol=1e-5)
        assert body["truncated"] == [False, False, True, True, True]
        one = c.post("/v1/classify", json={"model": "pairs", "inputs": {"text": texts[0], "text_pair": pairs[0]}})
        np.testing.assert_allclose(_probs_v1(one.json()), want[:1], atol=1e-5)
        spec = c.get("/openapi.json").json()["components"]["schemas"]  # the default model takes pairs only
        assert all("TextPair" in str(alt) for alt in spec["ClassifyRequest"]["properties"]["inputs"]["anyOf"])
        assert spec["V2InferRequest"]["properties"]["inputs"]["minItems"] == 2
        meta = c.get("/v2/models/pairs").json()
        assert [i["name"] for i in meta["inputs"]] == ["text", "text_pair"]
        assert [i["name"] for i in c.get("/v2/models/single").json()["inputs"]] == ["text"]
        assert [i["name"] for i in c.get("/v2/models/pairs/config").json()["input"]] == ["text", "text_pair"]
        v2 = c.post(
            "/v2/models/pairs/infer",
            json={
                "inputs": [
                    {"name": "text_pair", "shape": [5, 1], "datatype": "BYTES", "data": [[p] for p in pairs]},
                    {"name": "text", "shape": [5], "datatype": "BYTES", "data": texts},
                ]
            },
        ).json()
        probs = next(o for o in v2["outputs"] if o["name"] == "probabilities")
        np.testing.assert_allclose(np.array(probs["data"]).reshape(5, -1), want, atol=1e-5)
        bad = [
            ("pairs", {"inputs": ["lone text"]}, "inputs[0] is a single text"),
            ("pairs", {"inputs": [{"text": "a", "text_pair": "b"}, "c"]}, "inputs[1] is a single text"),
            ("single", {"inputs": {"text": "a", "text_pair": "b"}}, "inputs is a text pair"),
            ("pairs", {"inputs": [{"text": "a", "text_pair": " "}]}, "inputs[0].text_pair has no visible"),
            ("pairs", {"inputs": [{"text": "a", "text_pair": "x" * 601}]}, "inputs[0].text_pair has 601 characters"),
            ("pairs", {"inputs": [{"text": "a", "text_pair": "b"}] * 9}, "at most 8 per request"),
            ("pairs", {"inputs": [{"text": "a", "pair": "b"}]}, "text_pair"),
        ]
        for model, req, fragment in bad:
            r = c.post("/v1/classify", json={"model": model, **req})
            assert r.status_code == 422 and fragment in r.json()["error"], (req, r.text)
        t = {"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}
        v2_bad = [
            ("pairs", [t], 422, "no input named 'text_pair'"),
            ("single", [t, {**t, "name": "text_pair"}], 422, "it is not a pair model"),
            ("pairs", [t, {**t, "name": "text_pair", "shape": [2], "data": ["b", "c"]}], 400, "has 2 elements"),
            ("pairs", [{**t, "name": "text_pair"}], 422, "no input named 'text'"),
        ]
        for model, inputs, status, fragment in v2_bad:
            r = c.post(f"/v2/models/{model}/infer", json={"inputs": inputs})
            assert r.status_code == status and fragment in r.json()["error"], (inputs, r.text)


def test_served_pairs_over_tritonclient_http_binary_and_grpc(server, pair_model):
    grpcclient = pytest.importorskip("tritonclient.grpc")
    httpclient = pytest.importorskip("tritonclient.http")
    from tritonclient.utils import InferenceServerException

    from qserve.runtime import load_runtime

    rt = load_runtime(pair_model["onnx-int8"], "cpu")
    texts, pairs = [a for a, _ in PAIRS], [b for _, b in PAIRS]
    want = rt.classify(texts, pairs=pairs).probs
    rt.close()

    def inputs(module, names=("text", "text_pair")):
        out = []
        for name, data in zip(names, (texts, pairs)):
            i = module.InferInput(name, [len(data)], "BYTES")
            i.set_data_from_numpy(np.array([x.encode() for x in data], dtype=object))  # binary by default
            out.append(i)
        return out

    h = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
    assert [i["name"] for i in h.get_model_metadata("pairs")["inputs"]] == ["text", "text_pair"]
    np.testing.assert_allclose(h.infer("pairs", inputs(httpclient)).as_numpy("probabilities"), want, atol=1e-5)
    g = grpcclient.InferenceServerClient(f"127.0.0.1:{server.server.config.app.state.grpc.port}")
    assert [i.name for i in g.get_model_metadata("pairs").inputs] == ["text", "text_pair"]
    res = g.infer("pairs", inputs(grpcclient))
    np.testing.assert_allclose(res.as_numpy("probabilities"), want, atol=1e-5)
    assert res.as_numpy("truncated").tolist() == [False, False, True, True, True]
    for model, names, fragment in (
        ("pairs", ("text",), "no input named 'text_pair'"),
        ("single", ("text", "text_pair"), "it is not a pair model"),
    ):
        with pytest.raises(InferenceServerException) as e:
            g.infer(model, inputs(grpcclient, names))
        assert "INVALID_ARGUMENT" in str(e.value.status()) and fragment in e.value.message()
