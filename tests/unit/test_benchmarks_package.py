"""benchmarks/ is a package with one harness: every module imports, no script edits sys.path, one server
starter, one review loader, one /metrics parser, one wrk runner, one repository root, one report writer, and every
command the docs and the `make reports` stages name is a module that exists.

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
from benchmarks import flood_bench, rebuild_reports, report_stages
from benchmarks.harness import Server, in_turn, post_json, total

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
HARNESS = BENCH / "harness"
RENDERERS = BENCH / "renderers"


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
        "benchmarks.render_tables",
        "benchmarks.trivial_app",
        "benchmarks.inproc",
        "benchmarks.renderers",
        "benchmarks.renderers.reports",
    } <= set(names)
    # every file is a module of the package and its two sub-packages (benchmarks/__init__ is the package itself)
    assert len(names) == sum(len(list(d.glob("*.py"))) for d in (BENCH, HARNESS, RENDERERS)) - 1
    assert not (BENCH / "netutil.py").exists() and not (BENCH / "reportio.py").exists()  # merged into the harness


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
    "distilbert_base_speed.py": "a checkpoint's qserve_model.json (the model the bench then measures)",
    "gpu_pack.py": "the wheels' tar.xz for the GPU machine",
    "gpu_serving.py": "a --part child's result handed back to its parent; --dry's tiny checkpoint; --user's levels "
    "so far (loadtest.json, read by gpu_summary)",
    "gpu_stage.py": "a stage's progress (report.json, rewritten after each step), the preflight's answer, the "
    "call's settings and the logs' tails: read by gpu_check.sh and gpu_summary",
    "gpu_tools.py": "the GPU machine's environment probe (`env`), read by gpu_summary",
    "multilabel_gate.py": "the training data it builds (jsonl)",
    "render_tables.py": "the README's and docs' tables",
    "serve_overhead.py": "wrk's Lua script",
    "serve_protocol_cost.py": "wrk's Lua scripts",
    "predict_bench.py": "the corpus it scores (jsonl)",
    "rebuild_reports.py": "stage_times.json: each stage's wall time as `make reports` ran it, read by the stages table",
}
WRITES = r"write_json_atomic\(|write_text_atomic\(|json\.dump\(|\.write_text\(|\.write_bytes\(|open\([^)]*[\"']w"


def test_every_report_is_written_by_the_harness():
    """A report (its JSON and its markdown under the provenance header) is written by benchmarks.harness's
    write_report or write_markdown only; a script that writes any other file says what it is in NOT_REPORTS."""
    writers = {w for w in _where(WRITES) if not w.startswith("harness/")}
    assert writers - set(NOT_REPORTS) == set(), "write reports with benchmarks.harness.write_report"
    assert _where(r"\bwrite_json_atomic\(|\bwrite_text_atomic\(") - set(NOT_REPORTS) == {"harness/report.py"}
    report_writers = _where(r"\bwrite_report\(|\bwrite_markdown\(|\bfinish\(") - {"harness/report.py"}
    assert len(report_writers) > 15 and {"serve_bench.py", "flood_bench.py", "gpu_tools.py"} <= report_writers


def test_every_stage_command_and_renderer_names_a_module():
    mods = set(_modules())
    for st in report_stages.STAGES:
        for cmd in st.commands:
            assert "benchmarks/" not in cmd.replace("benchmarks/reports/", ""), cmd
            for name in re.findall(r"-m (benchmarks\.[a-z_]+)\b", cmd):
                assert name in mods, f"stage {st.name}: {cmd}"
        for r in st.reports:
            if r.render:
                assert callable(rebuild_reports._renderer(r.render)), r.render


def test_docs_name_benchmarks_as_modules():
    files = [ROOT / "README.md", ROOT / "Makefile", *sorted((ROOT / "docs").rglob("*.md")), *BENCH.glob("*.sh")]
    mods = set(_modules())
    for f in files:
        text = f.read_text(encoding="utf-8")
        assert not re.search(r"(python3?|\$PY\"?)\s+benchmarks/\w+\.py", text), f
        for name in re.findall(r"-m (benchmarks\.[a-z_]+)\b", text):
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
        ["--log-level", "warning"], ROOT, tmp_path / "app.log", tag="trivial", app="benchmarks.trivial_app:trivial_app"
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
