"""benchmarks/ is a product with one harness: the maintained suites at the top (a suite with parts a package), the
docs' rendering in render/, the finished studies in studies/ (each in its index), the reports in reports/ (each in
its index); every module imports, no script edits sys.path, one server starter, one review loader, one /metrics
parser, one wrk runner, one repository root, one report writer, and every command the docs and the `make reports`
stages name is a module that exists.

    python -m pytest tests/unit/test_benchmarks_package.py -q
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import socket
import threading
import time
from pathlib import Path

import pytest

import benchmarks
from benchmarks import flood_bench
from benchmarks.harness import Server, in_turn, post_json, total
from benchmarks.render import rebuild, stages

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
STUDIES = BENCH / "studies"
PACKAGES = sorted({p.parent for p in BENCH.rglob("__init__.py") if "reports" not in p.parts})
MODULE = r"benchmarks\.[a-z0-9_.]+[a-z0-9_]"


def _modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(benchmarks.__path__, "benchmarks."))


def _sources() -> dict[Path, str]:
    return {p: p.read_text(encoding="utf-8") for p in sorted(BENCH.rglob("*.py")) if "reports" not in p.parts}


def _where(pattern: str) -> set[str]:
    """The benchmarks/ files (relative to benchmarks/) whose source matches `pattern`."""
    return {str(p.relative_to(BENCH)) for p, text in _sources().items() if re.search(pattern, text)}


@pytest.mark.parametrize("name", _modules())
def test_every_module_imports_without_running(name):
    mod = importlib.import_module(name)
    assert mod.__doc__, f"{name} has no module docstring"


def test_the_package_holds_every_script_and_the_harness():
    names = _modules()
    assert {
        "benchmarks.harness",
        "benchmarks.harness.server",
        "benchmarks.harness.data",
        "benchmarks.serve_bench",
        "benchmarks.serve_bench.__main__",
        "benchmarks.gpu.stage",
        "benchmarks.render.tables",
        "benchmarks.render.rebuild",
        "benchmarks.serve_bench.trivial_app",
        "benchmarks.serve_overhead.inproc",
        "benchmarks.render.blocks",
        "benchmarks.render.blocks.reports",
        "benchmarks.studies.serve_windows",
    } <= set(names)
    # every file is a module of the package and its sub-packages (benchmarks/__init__ is the package itself)
    assert len(names) == sum(len(list(d.glob("*.py"))) for d in PACKAGES) - 1
    assert not (BENCH / "netutil.py").exists() and not (BENCH / "reportio.py").exists()  # merged into the harness


def _layout() -> dict[str, list[str]]:
    """benchmarks/__init__.py's layout: {each suite (`NAME.py`, or `NAME/` with parts): its parts}, read from its
    `    NAME   purpose` lines (a part's indented four more)."""
    layout: dict[str, list[str]] = {}
    for indent, name in re.findall(r"(?m)^( {4}| {8})([a-z0-9_]+(?:\.py|\.sh|/))  +\S", benchmarks.__doc__ or ""):
        if len(indent) == 4:
            layout[name] = []
        else:
            layout[list(layout)[-1]].append(name)
    return layout


def test_the_top_level_holds_the_suites_and_the_folders():
    """benchmarks/ at the top: the maintained suites its docstring declares, each a module or, with parts, a package
    whose __main__.py is the suite and whose other files are its parts; harness/, render/, studies/ and reports/;
    nothing else (a one-off study belongs in studies/)."""
    layout = _layout()
    assert len(layout) > 10 and {"serve_bench/", "serve_overhead/", "flood_bench.py", "gpu/"} <= set(layout)
    top = {p.name + "/" * p.is_dir() for p in BENCH.iterdir() if p.name not in ("__init__.py", "__pycache__")}
    folders = {"harness/", "render/", "studies/", "reports/"}
    assert top == set(layout) | folders, "declare a suite in benchmarks/__init__.py, or move a study to studies/"
    for suite, parts in layout.items():
        name = suite.removesuffix(".py").rstrip("/")
        if suite.endswith("/"):
            files = {p.name for p in (BENCH / name).iterdir() if p.is_file()} - {"__init__.py", "__main__.py"}
            assert files == set(parts), f"{suite}: benchmarks/__init__.py lists every part of the package, no more"
        if not (BENCH / name).is_dir() or (BENCH / name / "__main__.py").is_file():  # one main(argv) runs a suite
            mod = f"benchmarks.{name}" + ".__main__" * suite.endswith("/")
            assert callable(getattr(importlib.import_module(mod), "main", None)), suite
        else:  # a package without __main__ is run by its shell script (the GPU check: it installs what Python lacks)
            assert any(p.endswith(".sh") for p in parts), suite


def _study_index() -> list[list[str]]:
    """The rows of benchmarks/studies/README.md's table: study, question, stage, report, page."""
    text = (STUDIES / "README.md").read_text(encoding="utf-8")
    return [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines() if line.startswith("| `")]


def test_every_study_is_in_its_index_with_its_report_and_page():
    rows = _study_index()
    listed = [r[0].strip("`") for r in rows]
    files = sorted(p.name for p in STUDIES.glob("*.py") if p.name != "__init__.py")
    assert sorted(listed) == files, "every file in benchmarks/studies/ has one row in studies/README.md, and no more"
    by_stage = {s.name: s for s in stages.STAGES}
    for study, question, stage, report, page in rows:
        name = study.strip("`")[:-3]
        assert question and stage in by_stage, f"{name}: its stage {stage!r} is not a `make reports` stage"
        assert any(f"benchmarks.studies.{name}" in c for c in by_stage[stage].commands), f"{stage} runs {name}"
        rel = report.strip("`")
        assert (BENCH / "reports" / rel).exists(), f"{name}: its report {rel} is not under benchmarks/reports/"
        # a study whose report no page uses is retired: its page names the report (its JSON, md or folder)
        stem = rel.rstrip("/").removesuffix(".json")
        assert stem in (ROOT / page).read_text(encoding="utf-8"), f"{page} does not use {rel}"


def test_every_report_has_its_row_in_the_reports_index():
    """benchmarks/reports/README.md (`python -m benchmarks.render.reports_index`) has a row for every folder and file
    there (a file's .json and .md share one), and every row names what is there."""
    text = (BENCH / "reports" / "README.md").read_text(encoding="utf-8")
    cells = [line.split(" | ")[0] for line in text.splitlines() if line.startswith("| `")]
    listed = sorted(name.rstrip("/") for cell in cells for name in re.findall(r"`([^`]+)`", cell))
    there = sorted(p.name for p in (BENCH / "reports").iterdir() if p.name != "README.md")
    assert listed == there, "rebuild the index: python -m benchmarks.render.reports_index"


NOT_SUITES = ("studies", "render", "reports")


def test_no_maintained_suite_imports_a_study():
    """A study may build what a suite measures (crosscheck reads distilbert_base_speed's model), never its code."""
    top = {str(p.relative_to(BENCH)) for p in BENCH.rglob("*.py") if p.relative_to(BENCH).parts[0] not in NOT_SUITES}
    imports = _where(
        r"(?m)^\s*(from benchmarks\.studies\b|import benchmarks\.studies\b|from benchmarks import studies)"
    )
    assert imports & top == set()


def test_no_sys_path_edits_in_benchmarks_or_for_them_in_tests():
    assert _where(r"sys\.path") == set()
    in_tests = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "tests").rglob("*.py")
        if re.search(r"sys\.path\.insert\([^)\n]*benchmarks", p.read_text(encoding="utf-8"))
    ]
    assert in_tests == []


def test_one_server_starter():
    """Child processes that run beside the benchmark start in harness/server.py only; no Python kept in a
    string is run (`-c`), no app is launched by hand."""
    assert _where(r"\bPopen\(") == {"harness/server.py"}
    assert _where(r"\"qserve\.serve\"") == {"harness/server.py"}
    assert _where(r"\"-m\", \"uvicorn\"|uvicorn\.run\(") == {"harness/server.py"}
    assert _where(r"executable, \"-c\"") == set()


def test_one_review_loader_one_metrics_parser_one_wrk_runner():
    assert _where(r"\bload_dataset\(") == {"harness/data.py"}
    assert _where(r"text_string_to_metric_families") == {"harness/metrics.py"}
    assert _where(r"\}/metrics|\"/metrics\"") == {"harness/metrics.py"}  # a /metrics URL is built once
    assert _where(r"\"-t1\"") == {"harness/clients.py"}


def test_the_repository_root_is_the_harness_constant():
    """Every script's paths start from benchmarks.harness.ROOT; none computes its own from its file."""
    assert _where(r"Path\(__file__\)") == {"harness/server.py"}
    assert _where(r"(?m)^(ROOT|REPO) = ") == {"harness/server.py"}


# What scripts write besides reports, and why it is not one (no provenance, read by a machine or a person at once)
NOT_REPORTS = {
    "crosscheck.py": "a child's timings handed back to its parent in a temp file",
    "studies/distilbert_base_speed.py": "a checkpoint's qserve_model.json (the model the bench then measures)",
    "gpu/pack.py": "the wheels' tar.xz for the GPU machine",
    "gpu/serving.py": "a --part child's result handed back to its parent; --dry's tiny checkpoint; --user's levels "
    "so far (loadtest.json, read by gpu/summary.py)",
    "gpu/stage.py": "a stage's progress (report.json, rewritten after each step), the preflight's answer, the "
    "call's settings and the logs' tails: read by gpu/check.sh and gpu/summary.py",
    "gpu/tools.py": "the GPU machine's environment probe (`env`), read by gpu/summary.py",
    "studies/multilabel_gate.py": "the training data it builds (jsonl)",
    "render/tables.py": "the README's and docs' tables",
    "serve_overhead/__main__.py": "wrk's Lua script",
    "serve_protocol_cost.py": "wrk's Lua scripts",
    "predict_bench.py": "the corpus it scores (jsonl)",
    "render/reports_index.py": "benchmarks/reports/README.md, the reports' index (what made each, where it renders)",
    "render/rebuild.py": "stage_times.json: each stage's wall time as `make reports` ran it, read by the stages table",
}
WRITES = r"write_json_atomic\(|write_text_atomic\(|json\.dump\(|\.write_text\(|\.write_bytes\(|open\([^)]*[\"']w"


def test_every_report_is_written_by_the_harness():
    """A report (its JSON and its markdown under the provenance header) is written by benchmarks.harness's
    write_report or write_markdown only; a script that writes any other file says what it is in NOT_REPORTS."""
    writers = {w for w in _where(WRITES) if not w.startswith("harness/")}
    assert writers - set(NOT_REPORTS) == set(), "write reports with benchmarks.harness.write_report"
    assert _where(r"\bwrite_json_atomic\(|\bwrite_text_atomic\(") - set(NOT_REPORTS) == {"harness/report.py"}
    report_writers = _where(r"\bwrite_report\(|\bwrite_markdown\(|\bfinish\(") - {"harness/report.py"}
    assert len(report_writers) > 15 and {"serve_bench/__main__.py", "flood_bench.py", "gpu/tools.py"} <= report_writers


def test_every_stage_command_and_renderer_names_a_module():
    mods = set(_modules())
    named = 0
    for st in stages.STAGES:
        for cmd in st.commands:
            assert "benchmarks/" not in cmd.replace("benchmarks/reports/", ""), cmd
            for name in re.findall(rf"-m ({MODULE})", cmd):
                assert name in mods, f"stage {st.name}: {cmd}"
                named += 1
        for r in st.reports:
            if r.render:
                assert callable(rebuild._renderer(r.render)), r.render
    assert named > 25


def test_docs_name_benchmarks_as_modules():
    files = [ROOT / "README.md", ROOT / "Makefile", *sorted((ROOT / "docs").rglob("*.md")), *BENCH.rglob("*.sh")]
    mods = set(_modules())
    for f in files:
        text = f.read_text(encoding="utf-8")
        assert not re.search(r"(python3?|\$PY\"?)\s+benchmarks/\w+\.py", text), f
        for name in re.findall(rf"-m ({MODULE})", text):
            assert name in mods, f"{f}: {name}"


def test_rounds_alternate():
    assert [in_turn("ab", r) for r in range(3)] == [["a", "b"], ["b", "a"], ["a", "b"]]


def test_metric_totals_sum_every_label_set():
    """The batch histogram of a server with two models: a total over both, not the last one read."""
    s = {
        ("qserve_batch_size_count", (("model", "a"),)): 3.0,
        ("qserve_batch_size_count", (("model", "b"),)): 4.0,
        ("qserve_batch_size_sum", (("model", "a"),)): 30.0,
    }
    assert total(s, "qserve_batch_size_count") == 7.0
    assert total(s, "qserve_batch_size_count", model="b") == 4.0
    assert total(s, "qserve_batch_size_sum", model="b") == 0.0


def test_the_server_starter_runs_an_app_and_stops_it(tmp_path):
    """An app factory under a real uvicorn child: up when it answers anything (it has no /ready), then stopped."""
    pytest.importorskip("uvicorn")
    import http.client

    srv = Server(
        ["--log-level", "warning"],
        ROOT,
        tmp_path / "app.log",
        tag="trivial",
        app="benchmarks.serve_bench.trivial_app:trivial_app",
    )
    try:
        srv.wait_ready(60)
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
        assert (
            post_json(conn, "/v1/classify", {"inputs": ["a", "b"]})["predictions"]
            == [[{"label": "positive", "score": 1.0}]] * 2
        )
        conn.close()
        assert srv.cpu_s() > 0
    finally:
        srv.stop()
    assert srv.proc.returncode is not None


def test_the_flood_benchmarks_slow_clients_trickle():
    """Its trickling connections send their headers a byte at a time (a parameter once hid trickle(), so they
    sent nothing)."""
    got: list[int] = []
    with socket.socket() as lsn:
        lsn.bind(("127.0.0.1", 0))
        lsn.listen(8)
        stop = threading.Event()
        socks = flood_bench.slow_clients(lsn.getsockname()[1], 0, 1, stop)
        conn, _ = lsn.accept()
        conn.settimeout(5)
        deadline = time.monotonic() + 5
        while sum(got) < 3 and time.monotonic() < deadline:
            got.append(len(conn.recv(16)))
        stop.set()
        conn.close()
        for s in socks:
            s.close()
    assert sum(got) >= 3
