"""Every shell, curl and Python example in README.md and docs/*.md runs as written, or is marked and parsed.

    python -m pytest tests/integration/test_docs_examples.py -q

An example is a fenced block tagged bash, sh, shell, console or python. One test per page runs its examples in
order, in a fresh copy of one working directory laid out as the docs assume (`layout`: the state `make demo`
leaves, `models/minilm-l6-distilbert-imdb/{checkpoint,variants/*,report}`, built from the suite's tiny models,
plus the other models and the user's files the pages name: models/minilm-ht, models/topics, models/scores,
models/minilm-l6-bert-pairs/checkpoint, my-nli-bert, reviews.jsonl, tickets.csv, rows.jsonl, corpus/).

Markers: HTML comments on the lines right above a block (GitHub and mkdocs show nothing of them):

    <!-- example: illustrative: REASON -->
        not run: the block's `qserve`, `make` and `python -m ...` commands are parsed (below), a python block is
        compiled, nothing else runs.
    <!-- example: parse-only "TEXT": REASON -->
        the block runs, but each command that contains TEXT, or is the command TEXT names (its program and
        sub-command, TEXT's flags anywhere after: "qserve export --all"), is parsed instead of run (repeatable).

A marker must say why. A command too slow for the suite (docs_examples.EXPENSIVE: qserve train, pipeline, bench,
loadtest, serve/predict --engine ray, export --all; make; python -m benchmarks.X; Ray's CLIs) fails its page
unless a marker covers it, so the suite's time stays bounded; `python -m pytest PATH` (the suite's own tests) is
always parsed, never run.

Parsed: `qserve ...` by the real CLI parser (a renamed or removed flag fails); `make` targets against the
Makefile, `STAGE=` against `make reports`' stages, other `VAR=` against the Makefile's variables; `python -m
benchmarks.X ...` by X's own main(argv), stopped right after argparse; `python -m pytest PATH` by PATH existing.

Run as written:
- bash runs the block (`set -eo pipefail`) in the layout; `qserve` is a shim that runs the real CLI in this
  process (qserve.cli.main, no 5-10 s interpreter start per command) with the block's cwd, stdin and
  QSERVE_*/OTEL_* variables;
- `qserve serve` starts the real uvicorn server in a thread of this process and returns once /ready answers 200;
  it serves until the next `qserve serve` or the end of the page, so a page's later blocks talk to it;
- the one rewrite: `127.0.0.1:8000`, `localhost:8000` and `--port 8000` become a free port, the same with 8001
  (gRPC) and another, and QSERVE_PORT is the first (a `qserve serve` without --port binds it): test runs share
  machines, and 8000 may be taken;
- curl runs with --fail-with-body: an HTTP error (a missing Content-Type's 415) fails the block; a ```json block
  right after a block is the answer its last curl shows: each of its keys (but "...") must be in the served
  answer, and each of its string values equal;
- a python block runs in a child python with the same rewrite and HF_HUB_OFFLINE=1, as `make` sets it.
"""

from __future__ import annotations

import csv
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from docs_examples import (
    ROOT,
    Example,
    MarkerError,
    Runner,
    examples,
    pages,
    parse,  # noqa: E402
    with_ports,
)

PAGES = pages()
RUN = "models/minilm-l6-distilbert-imdb"


# -- the layout the docs assume -----------------------------------------------------------------------------------
def _tiny(out: Path, labels: list[str], meta: dict, arch: str = "distilbert", problem_type: str | None = None) -> Path:
    """A tiny random classifier with `labels` as `qserve train` leaves it (HF files + qserve_model.json)."""
    import torch
    import transformers
    from tiny_archs import config_kwargs

    from qserve.modeling import default_tokenizer

    torch.manual_seed(0)
    tok = default_tokenizer()
    cls, kw = config_kwargs(arch, tok.vocab_size)
    cfg = getattr(transformers, cls)(
        **kw,
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id={n: i for i, n in enumerate(labels)},
        problem_type=problem_type,
    )
    model = transformers.AutoModelForSequenceClassification.from_config(cfg).eval()
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    (out / "qserve_model.json").write_text(
        json.dumps(
            {
                "model_name": out.name if out.name != "checkpoint" else out.parent.name,
                "max_length": 64,
                "seed": 42,
                "labels": labels,
                "problem_type": problem_type or "single_label_classification",
                **meta,
            }
        ),
        encoding="utf-8",
    )
    return out


def build_layout(root: Path) -> tuple[Path, dict[str, str]]:
    """(the working dir, {what could not be built here: why}) for the pages' examples."""
    from tiny_archs import build

    import exporters
    from qserve.cli import main
    from qserve.runtime.ov_probe import OpenVINOUnavailable

    missing: dict[str, str] = {}
    run = root / RUN
    sentiment = {"dataset": "default", "max_eval_samples": 200}  # the embedded IMDb, 200 test and val texts
    ckpt = _tiny(run / "checkpoint", ["negative", "positive"], sentiment)
    for name in ("torch-fp32", "onnx-fp32", "onnx-int8", "ov-int8"):
        try:
            exporters.export(ckpt, name, run / "variants" / name)
        except OpenVINOUnavailable as e:
            missing[name] = str(e)
    # the bench report a model dir is served by (its recommendation: whichever this machine measures faster)
    bench = [
        "bench",
        *(str(run / "variants" / n) for n in ("onnx-fp32", "onnx-int8")),
        "--batch-sizes",
        "1",
        "--seq-lens",
        "16",
        "--time-budget",
        "0.05",
        "--warmup",
        "1",
        "--min-iters",
        "1",
        "--no-floor",
        "--max-eval-samples",
        "20",
        "--real-text-samples",
        "0",
        "--invariance-samples",
        "0",
        "--threads",
        "1",
        "--out",
        str(run / "report"),
    ]
    assert main(bench) == 0
    _tiny(root / "models" / "minilm-ht", ["negative", "positive"], sentiment)
    _tiny(
        root / "models" / "topics",
        ["politics", "sports", "tech"],
        {"dataset": None},
        problem_type="multi_label_classification",
    )
    _tiny(root / "models" / "scores", ["value"], {"dataset": None, "label_range": 0.82}, problem_type="regression")
    _tiny(
        root / "models" / "minilm-l6-bert-pairs" / "checkpoint",
        ["contradiction", "entailment"],
        {"dataset": None, "inputs": ["text", "text_pair"]},
        arch="bert",
    )
    build("bert", root / "my-nli-bert")  # saved by save_pretrained elsewhere: no qserve_model.json
    reviews = ["A wonderful film.", "Dreadful.", "The plot drags, but the acting is superb."]
    (root / "reviews.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in reviews), encoding="utf-8")
    (root / "rows.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in reviews), encoding="utf-8")
    with open(root / "tickets.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["ticket_id", "body"])
        w.writerows([[f"T{i}", t] for i, t in enumerate(reviews)])
    import pyarrow as pa
    import pyarrow.parquet as pq

    (root / "corpus").mkdir()
    pq.write_table(pa.table({"text": reviews}), root / "corpus" / "part-0.parquet")
    return root, missing


@pytest.fixture(scope="module")
def layout(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    t0 = time.perf_counter()
    built = build_layout(tmp_path_factory.mktemp("docs-layout"))
    print(f"docs layout built in {time.perf_counter() - t0:.1f} s")
    return built


@pytest.fixture()
def runner(tmp_path, monkeypatch):
    """A fresh copy of nothing yet (the page test copies the layout in), a shim socket under a short path."""
    scratch = Path(tempfile.mkdtemp(prefix="qs-docs-"))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    r = Runner(work, scratch)
    yield r
    r.close()
    shutil.rmtree(scratch, ignore_errors=True)


def _failure(ex: Example, res, r: Runner) -> str:
    return (
        f"{ex.where}: the example failed (exit {res.returncode})\n--- the block ---\n{ex.code}--- stdout ---\n"
        f"{res.stdout[-4000:]}\n--- stderr ---\n{res.stderr[-6000:]}\n--- commands ---\n" + "\n".join(r.log[-20:])
    )


# -- one test per page ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_page_examples_run_as_written(page, layout, runner):
    root, missing = layout
    exs = examples(page)
    if not exs:
        pytest.skip(f"{page.name} has no shell or python example")
    needs = sorted(n for n in missing if any(n in ex.code for ex in exs if not ex.illustrative))
    if needs:
        pytest.skip(
            f"{page.name}'s examples use {', '.join(needs)}, not available on this CPU: "
            + "; ".join(missing[n] for n in needs)
        )
    shutil.copytree(root, runner.cwd, symlinks=True, dirs_exist_ok=True)
    for ex in exs:
        res = runner.run(ex)
        assert res.returncode == 0, _failure(ex, res, runner)
        problem = runner.check_answer(ex)
        assert problem is None, problem


# -- the rules themselves -----------------------------------------------------------------------------------------
def test_the_docs_hold_examples_and_every_marker_says_why():
    found = [ex for p in PAGES for ex in examples(p)]
    assert len(found) >= 30
    ran = [ex for ex in found if not ex.illustrative]
    assert len(ran) >= 20, "most examples must run, not be marked illustrative"
    for ex in found:
        assert ex.illustrative is None or len(ex.illustrative) > 10, f"{ex.where}: say why it is illustrative"
        assert all(len(why) > 10 for why in ex.parse_only.values()), f"{ex.where}: say why each command is parsed"


def test_a_marker_that_is_not_one_or_sits_above_nothing_is_refused(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("<!-- example: skip it -->\n```bash\nqserve --help\n```\n", encoding="utf-8")
    with pytest.raises(MarkerError, match="not a marker"):
        examples(page, tmp_path)
    page.write_text("<!-- example: illustrative: a reason long enough -->\n\nprose\n", encoding="utf-8")
    with pytest.raises(MarkerError, match="right above a fenced block"):
        examples(page, tmp_path)


def _readme_tour() -> Example:
    return next(ex for ex in examples(ROOT / "README.md") if "qserve export" in ex.code and not ex.illustrative)


def test_a_renamed_flag_fails_the_example_that_shows_it(runner):
    """What the page tests rest on: rename a flag the docs show and the example fails, whether the line runs
    (the README tour's export), is parse-only (its bench) or sits in an illustrative block."""
    tour = _readme_tour()
    assert "--bits 8" in tour.code
    bad = Example(tour.page, tour.line, tour.lang, tour.code.replace("--bits 8", "--bitz 8"), None, tour.parse_only)
    res = runner.run(bad)
    assert res.returncode == 2 and "unrecognized arguments: --bitz" in res.stderr
    assert any("qserve bench" in text for text in tour.parse_only)
    # a parse-only line: the tour's bench, its --threads renamed, the lines before it left out
    bench = next(line for line in tour.code.splitlines() if line.startswith("qserve bench"))
    res = runner.run(
        Example("x", 1, "bash", bench.replace("--threads", "--thread-count") + "\n", parse_only=tour.parse_only)
    )
    assert res.returncode == 2 and "--thread-count" in res.stderr
    assert runner.log[-1].startswith("parsed (parse-only")
    # an illustrative block: its qserve and make lines are parsed too
    for code, want in (
        ("make demo STAGE=serve\nqserve pipeline --threads 2\n", 0),
        ("qserve pipeline --thread 2 --no-such-flag\n", 2),
        ("make demoo\n", 2),
        ("make reports STAGE=no-such-stage\n", 2),
        ("python -m benchmarks.flood_bench --roundz 3\n", 2),
        ("python -m benchmarks.flood_bench V --rounds 3\n", 0),
        ("echo -20 > /dev/full\nprintf x > /dev/full\n", 0),  # a write only some machines allow: not run
    ):
        res = runner.run(Example("x", 1, "bash", code, illustrative="a reason for the test"))
        assert res.returncode == want, (code, res.stderr)


def test_a_slow_command_must_be_marked(runner):
    for code in (
        "qserve train --epochs 1\n",
        "qserve serve x --engine ray\n",
        "make test\n",
        "python -m benchmarks.studies.checkpoint_cost --saves 5\n",
        "ray start --head\n",
    ):
        res = runner.run(Example("x.md", 7, "bash", code))
        assert res.returncode != 0 and "mark" in res.stderr, (code, res.stderr)


def test_ports_are_rewritten_only_where_they_name_a_local_server():
    code = (
        "qserve serve V --port 8000 --grpc-port 8001\ncurl -s 127.0.0.1:8000/v1/models\n"
        'c = Client("127.0.0.1:8001"); x = "localhost:8000"; --max-batch-tokens 8000; image: x:8000\n'
    )
    assert with_ports(code, 5, 6) == (
        "qserve serve V --port 5 --grpc-port 6\ncurl -s 127.0.0.1:5/v1/models\n"
        'c = Client("127.0.0.1:6"); x = "localhost:5"; --max-batch-tokens 8000; '
        "image: x:8000\n"
    )


def test_a_curl_without_content_type_fails_and_the_hub_client_needs_hub_offline_off(tiny_variant, runner):
    """The two things a newcomer trips on, as the docs state them: /v1 answers 415 without `Content-Type:
    application/json` (curl --fail-with-body makes that a failed example), and huggingface_hub refuses even a
    local server while HF_HUB_OFFLINE=1 (which `make` sets), but not with HF_HUB_OFFLINE=0 for the client."""
    serve = f"qserve serve {tiny_variant} --port 8000\n"
    body = """-d '{"inputs": ["A wonderful film."]}'"""
    ok = runner.run(
        Example(
            "x", 1, "bash", serve + f"curl -s 127.0.0.1:8000/v1/classify -H 'Content-Type: application/json' {body}\n"
        )
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout.splitlines()[-1])["predictions"]
    bare = runner.run(Example("x", 1, "bash", f"curl -s 127.0.0.1:8000/v1/classify {body}\n"))
    assert bare.returncode == 22 and "Content-Type must be application/json" in bare.stdout  # curl: HTTP >= 400
    client = (
        "python -c 'from huggingface_hub import InferenceClient; "
        'print(InferenceClient(model="http://127.0.0.1:8000").text_classification("A wonderful film."))\'\n'
    )
    refused = runner.run(Example("x", 1, "bash", client))
    assert refused.returncode != 0 and "OfflineModeIsEnabled" in refused.stderr
    answered = runner.run(Example("x", 1, "bash", "HF_HUB_OFFLINE=0 " + client))
    assert answered.returncode == 0 and "label=" in answered.stdout, answered.stderr


def test_parse_reads_each_program_by_its_own_rules(tmp_path):
    assert parse("qserve", ["export", "ck", "--bits", "8"], tmp_path) == (0, "")
    assert parse("qserve", ["export", "ck", "--bitz", "8"], tmp_path)[0] == 2
    assert parse("make", ["reports", "STAGE=flood", "FORCE=1"], tmp_path) == (0, "")
    assert parse("make", ["demo", "EXTRAS=gpu,dev"], tmp_path) == (0, "")
    assert parse("make", ["reports", "STAGES=flood"], tmp_path)[0] == 2
    assert parse("python", ["-m", "pytest", "tests/unit/test_docs.py"], tmp_path) == (0, "")  # the repository's
    assert parse("python", ["-m", "pytest", "tests/unit/test_nope.py"], tmp_path)[0] == 2
    assert parse("python", ["-m", "benchmarks.studies.checkpoint_cost", "--saves", "5"], ROOT) == (0, "")
    assert parse("python", ["-m", "benchmarks.studies.checkpoint_cost", "--save", "5", "--nope"], ROOT)[0] == 2
