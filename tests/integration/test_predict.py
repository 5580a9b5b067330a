"""`qserve predict`: every row answered as /v1/classify answers it, in order, bad rows named, resumable after kill -9.

python -m pytest tests/integration/test_predict.py -q
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

httpx2 = pytest.importorskip("httpx2")
pq = pytest.importorskip("pyarrow.parquet")

from conftest import build_tiny_checkpoint, serving  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
LONG = "the plot moves slowly but the acting is superb and the score lingers " * 12  # > 64 tokens: windowed


def _texts(n: int) -> list[str]:
    words = ["great", "awful", "boring", "moving", "film", "plot", "cast", "ending", "score", "scene"]
    return [" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(1 + i % 13)) for i in range(n)]


def _variant(root: Path, kind: str) -> Path:
    """A torch-fp32 variant of a tiny random checkpoint of this problem type (no training: the answers only
    have to be the server's, not good)."""
    import exporters

    labels = {"single": 2, "multi": 3, "regression": 1, "pair": 2}[kind]
    ck = build_tiny_checkpoint(root / f"{kind}-ck", seed=1, num_labels=labels)
    if kind == "multi":
        cfg = json.loads((ck / "config.json").read_text())
        (ck / "config.json").write_text(json.dumps({**cfg, "problem_type": "multi_label_classification"}))
    if kind == "pair":
        meta = json.loads((ck / "qserve_model.json").read_text())
        (ck / "qserve_model.json").write_text(json.dumps({**meta, "inputs": ["text", "text_pair"]}))
    out = root / f"{kind}-torch-fp32"
    exporters.export(ck, "torch-fp32", out)
    return out


@pytest.fixture(scope="module")
def variants(tmp_path_factory, tiny_variant, tiny_checkpoint) -> dict[str, Path]:
    import exporters

    root = tmp_path_factory.mktemp("predict-variants")
    exporters.export(tiny_checkpoint, "onnx-int8", root / "onnx-int8")
    return {
        "single": tiny_variant,
        "int8": root / "onnx-int8",
        **{k: _variant(root, k) for k in ("multi", "regression", "pair")},
    }


def _same(got: float, served: float, exact: bool) -> bool:
    """Bit for bit where the variant computes each text alone (onnx-int8 runs row by row); a batched float
    kernel (torch fp32) rounds with the batch's shape, so there the invariant's tolerance holds."""
    return got == served if exact else abs(got - served) <= 1e-6


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _read(path: Path) -> list[dict]:
    if path.suffix == ".parquet":
        return pq.read_table(path).to_pylist()
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _predict(*argv: str) -> int:
    from qserve.cli import main

    return main(["predict", *map(str, argv), "--quiet"])


def _v1(variant: Path, texts: list[str], pairs: list[str] | None = None, **body) -> list[dict]:
    """What a real server (uvicorn on 127.0.0.1) answers for each text, one request per 64."""
    from qserve.serve.infra.config import ServeConfig

    out = []
    with (
        serving(ServeConfig(variant_dir=str(variant), port=0, threads=1, max_wait_ms=1)) as srv,
        httpx2.Client(base_url=srv.url, timeout=60, trust_env=False) as c,
    ):
        for i in range(0, len(texts), 64):
            inputs = (
                texts[i : i + 64]
                if pairs is None
                else [{"text": t, "text_pair": p} for t, p in zip(texts[i : i + 64], pairs[i : i + 64])]
            )
            r = c.post("/v1/classify", json={"inputs": inputs, **body})
            assert r.status_code == 200, r.text
            b = r.json()
            out += [
                {"pred": p, "tokens": b["tokens"][j], "windows": b["windows"][j], "truncated": b["truncated"][j]}
                for j, p in enumerate(b["predictions"])
            ]
    return out


@pytest.mark.parametrize("kind", ["int8", "single", "multi", "regression", "pair", "windows"])
def test_each_row_is_what_v1_classify_answers(variants, tmp_path, kind):
    texts = _texts(70) + [LONG, LONG[:300]]
    pairs = [t[::-1] for t in texts] if kind == "pair" else None
    variant = variants["single" if kind == "windows" else kind]
    exact = kind == "int8"
    rows = [{"id": f"r{i}", "text": t, "n": i, "tags": ["x"] * (i % 3)} for i, t in enumerate(texts)]
    for r, p in zip(rows, pairs or []):
        r["hyp"] = p
    src = _write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.parquet"
    args = ["--all-scores", "--chunk-rows", "25", "--id-column", "id"]
    body: dict = {}
    if kind == "pair":
        args += ["--text-pair-column", "hyp"]
    if kind == "windows":
        args += ["--long-text", "windows:32:24:mean"]
        body["long_text"] = "windows:32:24:mean"
    if kind == "multi":
        args += ["--threshold", "0.45"]
        body["threshold"] = 0.45
    assert _predict(variant, src, "--out", out, *args) == 0
    got = _read(out)
    want = _v1(variant, texts, pairs, **body)
    assert [g["id"] for g in got] == [r["id"] for r in rows]  # input order
    for g, r, w in zip(got, rows, want):
        assert {k: g[k] for k in r} == r  # every input column carried unchanged
        assert g["error"] is None
        assert (g["tokens"], g["windows"], g["truncated"]) == (w["tokens"], w["windows"], w["truncated"])
        pred = w["pred"]
        if kind == "regression":
            assert _same(g["value"], pred[0]["score"], exact)
            continue
        scores = {p["label"]: p["score"] for p in pred}
        assert g["scores"].keys() == scores.keys() and all(_same(g["scores"][k], v, exact) for k, v in scores.items())
        if exact or pred[0]["score"] - pred[1]["score"] > 1e-5:  # a tie within rounding may order either way
            assert g["label"] == pred[0]["label"] and _same(g["score"], pred[0]["score"], exact)
        if kind == "multi":
            assert g["labels"] == [p["label"] for p in pred if p["score"] >= 0.45]
    if kind == "windows":
        assert max(g["windows"] for g in got) > 1


def test_bad_rows_get_their_error_and_the_rest_are_scored(tiny_variant, tmp_path):
    src = tmp_path / "in.jsonl"
    good = _texts(6)
    lines = [
        json.dumps({"id": 0, "text": good[0]}),
        json.dumps({"id": 1, "text": ""}),
        json.dumps({"id": 2, "text": 7}),
        json.dumps({"id": 3}),
        "{not json",
        json.dumps({"id": 5, "text": "x" * 60}),
        json.dumps({"id": 6, "text": "\u200b \t"}),
        json.dumps({"id": 7, "text": good[1]}),
    ]
    src.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.jsonl"
    assert _predict(tiny_variant, src, "--out", out, "--max-chars", "50") == 0
    got = _read(out)
    assert len(got) == 8
    errors = [g["error"] for g in got]
    assert errors[0] is None and errors[7] is None and got[7]["label"] in ("negative", "positive")
    assert errors[1] == "text is empty"
    assert errors[2] == "text is not a string (got int)"
    assert "column 'text' (--text-column) is missing" in errors[3]
    assert errors[4].startswith("line 5 is not valid JSON")
    assert errors[5] == "text has 60 characters; at most 50 (--max-chars)"
    assert "no visible character" in errors[6]
    assert all(g["label"] is None for g in got[1:7])

    # --on-error fail stops at the first bad row, naming it; a missing column names the file and its columns
    from qserve.cli import main

    assert (
        main(
            [
                "predict",
                str(tiny_variant),
                str(src),
                "--out",
                str(tmp_path / "f.jsonl"),
                "--on-error",
                "fail",
                "--id-column",
                "id",
                "--quiet",
            ]
        )
        == 2
    )
    assert not (tmp_path / "f.jsonl.parts").exists()  # a refused job leaves nothing that refuses the next
    csv_in = tmp_path / "in.csv"
    csv_in.write_text("id,body\n1,hello\n")
    from qserve import QserveError
    from qserve.predict.job import PredictConfig
    from qserve.predict.runner import run

    with pytest.raises(QserveError, match=r"row 2 \(id 1\): text is empty"):
        run(
            PredictConfig(
                str(tiny_variant), str(src), str(tmp_path / "f.jsonl"), on_error="fail", id_column="id", quiet=True
            )
        )
    with pytest.raises(QserveError, match=r"in.csv has no column 'text' \(--text-column\); its columns: id, body"):
        run(PredictConfig(str(tiny_variant), str(csv_in), str(tmp_path / "c.csv"), quiet=True))
    with pytest.raises(QserveError, match=r"--out .*out.jsonl already exists"):
        run(PredictConfig(str(tiny_variant), str(src), str(out), quiet=True))


def _cmd(variant: Path, src: Path, out: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "qserve",
        "predict",
        str(variant),
        str(src),
        "--out",
        str(out),
        "--chunk-rows",
        "10",
        "--batch-size",
        "8",
        "--threads",
        "1",
    ]


def test_kill_9_then_the_same_command_gives_exactly_the_uninterrupted_output(variants, tiny_variant, tmp_path):
    from qserve import QserveError
    from qserve.predict.corpus import LEDGER
    from qserve.predict.job import PredictConfig
    from qserve.predict.runner import run

    rows = [{"id": i, "text": t} for i, t in enumerate(_texts(400))]
    src = _write_jsonl(tmp_path / "in.jsonl", rows)
    ref, out = tmp_path / "ref.jsonl", tmp_path / "out.jsonl"
    assert _predict(tiny_variant, src, "--out", ref, "--chunk-rows", "10", "--batch-size", "8") == 0
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    parts = Path(f"{out}.parts")
    proc = subprocess.Popen(_cmd(tiny_variant, src, out), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not (parts / "part-000003.jsonl").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
    assert not out.exists() and (parts / LEDGER).is_file()
    done = len(list(parts.glob("part-*.jsonl")))
    assert 4 <= done < 40

    # another TARGET (or INPUT) than the ledger's is refused, naming both
    with pytest.raises(QserveError, match=f"TARGET {tiny_variant}, not {variants['int8']}"):
        run(PredictConfig(str(variants["int8"]), str(src), str(out), chunk_rows=10, quiet=True))
    with pytest.raises(QserveError, match=f"INPUT {src}, not {tmp_path / 'ref.jsonl'}"):
        run(PredictConfig(str(tiny_variant), str(tmp_path / "ref.jsonl"), str(out), chunk_rows=10, quiet=True))

    again = subprocess.run(_cmd(tiny_variant, src, out), env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"{done * 10} from earlier parts" in again.stderr
    assert "400 rows" in again.stderr and "0 failed" in again.stderr
    assert out.read_bytes() == ref.read_bytes()  # every row once, same answers, same order
    assert not parts.exists()


def test_csv_and_parquet_directory_in_the_same_answers(tiny_variant, tmp_path):
    import pyarrow as pa

    texts = _texts(30)
    src = tmp_path / "in.csv"
    src.write_text("id,text,note\n" + "".join(f'{i},"{t}",n{i}\n' for i, t in enumerate(texts)))
    d = tmp_path / "pq"
    d.mkdir()
    for k in range(3):
        pq.write_table(
            pa.table({"id": list(range(k * 10, k * 10 + 10)), "text": texts[k * 10 : k * 10 + 10]}), d / f"{k}.parquet"
        )
    assert _predict(tiny_variant, src, "--out", tmp_path / "a.csv") == 0
    assert _predict(tiny_variant, d, "--out", tmp_path / "b.jsonl") == 0  # one chunk over three files
    import csv

    a = list(csv.DictReader((tmp_path / "a.csv").open()))
    b = _read(tmp_path / "b.jsonl")
    assert [r["id"] for r in a] == [str(i) for i in range(30)] and [r["note"] for r in a][:2] == ["n0", "n1"]
    assert [r["id"] for r in b] == list(range(30))
    assert [float(r["score"]) for r in a] == [r["score"] for r in b]
    assert [r["label"] for r in a] == [r["label"] for r in b]


def test_threshold_is_refused_for_a_model_that_is_not_multi_label(tiny_variant, tmp_path):
    from qserve import QserveError
    from qserve.predict.job import PredictConfig
    from qserve.predict.runner import run

    src = _write_jsonl(tmp_path / "in.jsonl", [{"text": "fine"}])
    with pytest.raises(QserveError, match="--threshold applies to multi-label models only; .* single-label"):
        run(PredictConfig(str(tiny_variant), str(src), str(tmp_path / "o.jsonl"), threshold=0.3, quiet=True))


def test_stdin_jsonl_is_read_like_a_file(tiny_variant, tmp_path, monkeypatch):
    import io

    rows = [{"id": i, "text": t} for i, t in enumerate(_texts(12))]
    src = _write_jsonl(tmp_path / "in.jsonl", rows)
    assert _predict(tiny_variant, src, "--out", tmp_path / "file.jsonl") == 0
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(src.read_bytes())))
    assert _predict(tiny_variant, "-", "--out", tmp_path / "stdin.jsonl") == 0
    assert (tmp_path / "stdin.jsonl").read_bytes() == (tmp_path / "file.jsonl").read_bytes()
