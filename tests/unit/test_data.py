"""qserve.data.datasets: the embedded datasets, local files and their errors, determinism.

python -m pytest tests/unit/test_data.py -q
"""

from __future__ import annotations

import csv
import json
import sys
import types

import pytest

from qserve import QserveError
from qserve.data.datasets import Split, load_dataset, stratified_subsample


def write_csv(path, rows, header=("text", "label")):
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


def sentiment_rows(n=40):
    return [
        (f"review number {i} was {'great' if i % 2 else 'bad'}", "positive" if i % 2 else "negative") for i in range(n)
    ]


# -- embedded IMDb / Rotten Tomatoes --------------------------------------------------


def test_default_is_clean_deduped_imdb_with_documented_sizes():
    d = load_dataset()
    assert d.name == "imdb-embedded" and d.labels == ["negative", "positive"]
    assert (len(d.train), len(d.val), len(d.test)) == (19922, 2490, 2490)
    assert d.info["rows"] == 25000 and d.info["duplicates_dropped"] == 98
    everything = d.train.texts + d.val.texts + d.test.texts
    assert len(set(everything)) == len(everything)  # no duplicates, so no train/test leakage
    assert not any("<br" in t.lower() for t in everything)
    assert not any("  " in t or t != t.strip() for t in everything[:2000])
    # stratified: each split is within one example of the overall class balance per class
    assert d.info["class_counts"]["test"] == {"negative": 1243, "positive": 1247}
    assert set(d.train.labels) == {0, 1}


def test_alias_and_determinism():
    a = load_dataset("default", seed=42, max_eval_samples=300)
    b = load_dataset("imdb-embedded", seed=42, max_eval_samples=300)
    assert a.test.texts == b.test.texts and a.train.labels == b.train.labels
    c = load_dataset("default", seed=7, max_eval_samples=300)
    assert c.test.texts != a.test.texts


def test_max_samples_subsamples_train_only_and_keeps_test():
    full = load_dataset(max_eval_samples=500)
    small = load_dataset(max_samples=1000, max_eval_samples=500)
    assert len(small.train) == 1000 and len(small.val) == 500 and len(small.test) == 500
    # the test split a benchmark rebuilds from (dataset, seed, max_eval_samples) is unchanged
    assert small.test.texts == full.test.texts and small.val.labels == full.val.labels
    assert set(small.train.texts) <= set(full.train.texts)
    assert abs(sum(small.train.labels) - 500) <= 1  # stratified
    assert small.train.texts == load_dataset(max_samples=1000, max_eval_samples=500).train.texts


def test_rotten_tomatoes():
    d = load_dataset("rotten-tomatoes")
    assert (len(d.train), len(d.val), len(d.test)) == (6826, 852, 852)
    assert d.labels == ["negative", "positive"] and d.info["short_name"] == "rotten-tomatoes"


def test_stratified_subsample_keeps_proportions():
    s = Split([str(i) for i in range(100)], [0] * 70 + [1] * 30)
    sub = stratified_subsample(s, 10, seed=1, purpose="x")
    assert len(sub) == 10 and sub.labels.count(0) == 7 and sub.labels.count(1) == 3
    assert stratified_subsample(s, 500, seed=1, purpose="x") is s


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_bad_counts(bad):
    with pytest.raises(QserveError, match="--max-samples"):
        load_dataset(max_samples=bad)
    with pytest.raises(QserveError, match="--max-eval-samples"):
        load_dataset(max_eval_samples=bad)


# -- local files ------------------------------------------------------------------------


def test_local_csv_string_labels_sorted(tmp_path):
    rows = sentiment_rows(40) + [("review number 1 was great", "positive")]  # one duplicate
    d = load_dataset(str(write_csv(tmp_path / "reviews.csv", rows)))
    assert d.labels == ["negative", "positive"]
    assert (len(d.train), len(d.val), len(d.test)) == (32, 4, 4)
    assert d.info["duplicates_dropped"] == 1 and d.info["short_name"] == "reviews"
    assert d.name == str((tmp_path / "reviews.csv").resolve())
    for split in (d.train, d.val, d.test):
        for t, lab in zip(split.texts, split.labels):
            assert ("great" in t) == (lab == 1)
    again = load_dataset(d.name)
    assert again.test.texts == d.test.texts


def test_local_csv_int_labels_multiline_and_three_classes(tmp_path):
    rows = [(f"text {i}\nsecond line", str(i % 3)) for i in range(60)]
    d = load_dataset(str(write_csv(tmp_path / "three.csv", rows)))
    assert d.labels == ["LABEL_0", "LABEL_1", "LABEL_2"]
    assert sorted(set(d.train.labels)) == [0, 1, 2] and len(d.test) == 6


def test_local_jsonl_and_json(tmp_path):
    rows = sentiment_rows(30)
    jl = tmp_path / "r.jsonl"
    jl.write_text("\n".join(json.dumps({"text": t, "label": int(lab == "positive")}) for t, lab in rows) + "\n\n")
    a = load_dataset(str(jl))
    assert a.labels == ["LABEL_0", "LABEL_1"] and len(a.train) + len(a.val) + len(a.test) == 30
    js = tmp_path / "r.json"
    js.write_text(json.dumps([{"text": t, "label": lab} for t, lab in rows]))
    b = load_dataset(str(js))
    cols = tmp_path / "cols.json"
    cols.write_text(json.dumps({"text": [t for t, _ in rows], "label": [lab for _, lab in rows]}))
    c = load_dataset(str(cols))
    assert b.labels == c.labels == ["negative", "positive"] and b.test.texts == c.test.texts


@pytest.mark.parametrize(
    "name, content, match",
    [
        ("missing.csv", "text,score\nhello,1\n", r"missing\.csv, line 1: missing column\(s\) label"),
        ("empty.csv", "", r"empty\.csv: the file is empty"),
        ("header_only.csv", "text,label\n", r"header_only\.csv: no data rows"),
        (
            "gap.csv",
            "text,label\n" + "".join(f"t{i},{(i % 2) * 2}\n" for i in range(20)),
            r"gap\.csv: integer labels must be 0\.\.K-1 .*none equal to \[1\]",
        ),
        ("neg.csv", "text,label\na,0\nb,1\nc,-1\n", r"neg\.csv, line 4: label -1 is negative"),
        ("mixed.csv", "text,label\na,0\nb,positive\n", r"mixed\.csv, line 3: .*mixes integer and string"),
        ("blank.csv", "text,label\na,0\n   ,1\n", r"blank\.csv, line 3: text is empty"),
        ("nolabel.csv", "text,label\na,0\nb,\n", r"nolabel\.csv, line 3: label '' is not"),
        ("one.csv", "text,label\na,0\nb,0\n", r"one\.csv: every row has label 0"),
        ("bad.jsonl", '{"text": "a", "label": 0}\n{"text": "b", "label": 1\n', r"bad\.jsonl, line 2: malformed JSON"),
        (
            "field.jsonl",
            '{"text": "a", "label": 0}\n{"text": "b"}\n',
            r"field\.jsonl, line 2: missing field\(s\) label",
        ),
        ("notobj.jsonl", '{"text": "a", "label": 0}\n[1, 2]\n', r"notobj\.jsonl, line 2: expected a JSON object"),
        ("bool.jsonl", '{"text": "a", "label": true}\n', r"bool\.jsonl, line 1: label True is not"),
        ("shape.json", '{"rows": []}', r"shape\.json: expected a JSON list"),
        ("broken.json", '[{"text": "a",\n "label": 0},\n oops]', r"broken\.json, line 3: malformed JSON"),
        ("data.txt", "hello", r"unsupported file type '\.txt'"),
    ],
)
def test_bad_local_files_name_file_line_and_problem(tmp_path, name, content, match):
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(QserveError, match=match):
        load_dataset(str(path))


def test_non_utf8_names_the_line(tmp_path):
    path = tmp_path / "latin1.csv"
    path.write_bytes("text,label\nfine,0\nna\u00efve film,1\n".encode("latin-1"))
    with pytest.raises(QserveError, match=r"latin1\.csv, line 3: not valid UTF-8"):
        load_dataset(str(path))


def test_too_small_to_split(tmp_path):
    path = write_csv(tmp_path / "tiny.csv", sentiment_rows(4))
    with pytest.raises(QserveError, match="split is empty"):
        load_dataset(str(path))


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(QserveError, match="no such file"):
        load_dataset(str(tmp_path / "nope.csv"))
    with pytest.raises(QserveError, match="is a directory"):
        load_dataset(str(tmp_path))


# -- Hugging Face hub ids ------------------------------------------------------------------


def test_hub_id_without_datasets_package_gives_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if not installed
    with pytest.raises(QserveError, match=r"pip install 'qserve\[hub\]'.*network"):
        load_dataset("imdb")


class _FakeSplit:
    """The slice of a `datasets.Dataset` that qserve.data.datasets reads (the hub is not reachable here)."""

    def __init__(self, texts, labels, names):
        self._cols = {"text": texts, "label": labels}
        self.column_names = ["text", "label"]
        self.features = {"label": types.SimpleNamespace(names=names)}

    def __getitem__(self, col):
        return self._cols[col]


def test_hub_id_uses_train_and_test_and_carves_val(monkeypatch):
    train = _FakeSplit([f"tr {i}" for i in range(100)], [i % 2 for i in range(100)], ["neg", "pos"])
    test = _FakeSplit([f"te {i}" for i in range(20)], [i % 2 for i in range(20)], ["neg", "pos"])
    unsup = _FakeSplit(["u"], [-1], ["neg", "pos"])
    fake = types.SimpleNamespace(load_dataset=lambda name: {"train": train, "test": test, "unsupervised": unsup})
    monkeypatch.setitem(sys.modules, "datasets", fake)
    d = load_dataset("stanfordnlp/imdb", max_eval_samples=8)
    assert d.labels == ["neg", "pos"] and d.info["short_name"] == "imdb"
    assert (len(d.train), len(d.val), len(d.test)) == (90, 8, 8)
    assert not set(d.val.texts) & set(d.train.texts)


def test_hub_errors_become_qserve_errors(monkeypatch):
    def boom(name):
        raise ConnectionError("offline")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=boom))
    with pytest.raises(QserveError, match=r"--dataset 'someone/reviews'.*ConnectionError.*network"):
        load_dataset("someone/reviews")
