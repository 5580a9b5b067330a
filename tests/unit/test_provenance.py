"""Report provenance (command, commit, CPU) and `make reports`' refusal to regenerate on another CPU.

python -m pytest -q tests/unit/test_provenance.py
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from benchmarks.render import rebuild
from qserve.provenance import command_line, git_commit, md_line, provenance, recorded_cpu, with_header

ROOT = Path(__file__).resolve().parents[2]


def test_qserve_computes_the_repository_root_once():
    """One function (qserve.files.repository_root) says where qserve/ lives; provenance, the bench's children and
    the OpenVINO probe's child all start from it."""
    from qserve import provenance as prov
    from qserve.files import repository_root, with_root_on_path

    assert repository_root() == ROOT and prov.REPO == ROOT
    assert with_root_on_path({"PYTHONPATH": "/x"})["PYTHONPATH"].split(os.pathsep) == [str(ROOT), "/x"]
    assert with_root_on_path({})["PYTHONPATH"] == str(ROOT)
    computed = [
        str(p.relative_to(ROOT))
        for d in ("qserve", "exporters")
        for p in sorted((ROOT / d).rglob("*.py"))
        if re.search(r"__file__\)\.resolve\(\)\.parents|__file__\)\.parents", p.read_text(encoding="utf-8"))
    ]
    assert computed == ["qserve/files.py"]


def test_provenance_names_command_commit_and_cpu():
    from qserve.devices import cpu_info

    info = cpu_info()
    p = provenance([str(ROOT / "benchmarks" / "serve_bench" / "__main__.py"), "models/x", "--duration", "15"])
    assert p["command"] == "python -m benchmarks.serve_bench models/x --duration 15"
    assert p["cpu"] == info["model"]
    assert p["amx"] is any(f.startswith("amx") for f in info["flags"])
    assert p["commit"] == "unknown" or re.fullmatch(r"[0-9a-f]{40}", p["commit"])


def test_commit_is_unknown_outside_git(tmp_path):
    assert git_commit(tmp_path) == "unknown"


def test_command_line_is_what_a_user_retypes():
    assert command_line(["/venv/bin/qserve", "bench", "a dir"]) == "qserve bench 'a dir'"
    assert command_line([str(ROOT / "qserve" / "__main__.py"), "serve"]) == "qserve serve"
    # a benchmark runs as a module of its package (sys.argv[0] is then its file)
    assert command_line([str(ROOT / "benchmarks" / "flood_bench.py"), "v"]) == "python -m benchmarks.flood_bench v"
    assert command_line(["benchmarks/flood_bench.py", "v"]) == "python -m benchmarks.flood_bench v"
    # a suite with parts runs as its package (sys.argv[0] is its __main__.py)
    assert command_line(["benchmarks/serve_overhead/__main__.py", "v"]) == "python -m benchmarks.serve_overhead v"
    assert command_line(["/elsewhere/tool.py", "v"]) == "python /elsewhere/tool.py v"


def test_md_header_goes_under_the_title_once():
    prov = {"command": "qserve bench v", "commit": "abc", "cpu": "Some CPU", "amx": False}
    md = with_header("# Title\n\nBody.\n", prov)
    assert md.splitlines()[:3] == ["# Title", "", md_line(prov)]
    assert "AMX no" in md_line(prov) and "`abc`" in md_line(prov)
    assert with_header(md, prov) == md
    assert with_header("# T\n", None) == "# T\n"


@pytest.mark.parametrize(
    "report, cpu",
    [
        ({"provenance": {"cpu": "A"}, "environment": {"cpu": {"model": "B"}}}, "A"),
        ({"environment": {"cpu": {"model": "B", "flags": []}}}, "B"),
        ({"cpu": {"model": "C"}}, "C"),
        ({"cpu": "Intel(R) Xeon(R) Processor, AMX (amx_bf16 amx_int8)"}, "Intel(R) Xeon(R) Processor"),
        ({"cpu": "AMD EPYC, no AMX"}, "AMD EPYC"),
        ({"machine": {"cpu": "D", "amx": True}}, "D"),
        ({}, None),
    ],
)
def test_recorded_cpu_reads_every_report_layout(report, cpu):
    assert recorded_cpu(report) == cpu


def _reports():
    # a pending stage (a new benchmark not yet run on its machine) has no report to check until it runs
    return [r for s in rebuild.STAGES for r in s.reports if not (s.pending and not (ROOT / r.json).exists())]


@pytest.mark.parametrize("report", _reports(), ids=lambda r: r.json)
def test_every_committed_report_records_its_provenance(report):
    # only a pending stage may lack its report (_reports() leaves those out): any other missing one fails
    assert (ROOT / report.json).is_file(), f"{report.json} is missing: `make reports STAGE=...` writes it"
    data = json.loads((ROOT / report.json).read_text(encoding="utf-8"))
    prov = data["provenance"]
    assert prov["command"] and prov["commit"] and prov["cpu"] and isinstance(prov["amx"], bool)
    assert prov["cpu"] == recorded_cpu({k: v for k, v in data.items() if k != "provenance"}) or "note" in prov
    if report.md:
        head = (ROOT / report.md).read_text(encoding="utf-8").split("\n## ")[0]  # the first screen, before details
        assert md_line(prov) in head, f"{report.md} lacks its provenance in its first screen"


def test_every_report_writing_script_records_provenance():
    # every script's report goes through the harness's writer (tests/unit/test_benchmarks_package.py), which
    # records this run's provenance in a report that carries none; distilbert_base_speed.py writes through
    # run_bench, which records it too
    writer = (ROOT / "benchmarks" / "harness" / "report.py").read_text(encoding="utf-8")
    assert 'rep.setdefault("provenance", provenance())' in writer
    assert "provenance()" in (ROOT / "qserve" / "bench" / "runner.py").read_text(encoding="utf-8")


def _copy_stage(stage, root: Path) -> None:
    for r in stage.reports:
        for rel in filter(None, (r.json, r.md)):
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / rel, root / rel)


def test_a_stage_refuses_another_cpu_and_force_only_rerenders(tmp_path):
    stage = rebuild.BY_NAME["serve"]
    _copy_stage(stage, tmp_path)
    recorded = json.loads((tmp_path / stage.reports[0].json).read_text())["provenance"]["cpu"]
    action, why = rebuild.plan(stage, "Some Other CPU", force=False, root=tmp_path)
    assert action == "refuse" and recorded in why and "Some Other CPU" in why and "FORCE=1" in why
    assert rebuild.plan(stage, "Some Other CPU", force=True, root=tmp_path)[0] == "rerender"
    assert rebuild.plan(stage, recorded, force=False, root=tmp_path)[0] == "run"
    assert rebuild.plan(stage, "Some Other CPU", force=False, root=tmp_path / "empty")[0] == "run"
    md = tmp_path / stage.reports[0].md
    committed = md.read_text(encoding="utf-8")
    md.write_text("stale\n", encoding="utf-8")
    assert rebuild.rerender(stage, tmp_path) == [f"{stage.reports[0].md}: re-rendered from {stage.reports[0].json}"]
    assert md.read_text(encoding="utf-8") == committed  # md is a pure function of the JSON, header included


@pytest.mark.parametrize("name", ["crosscheck", "int8-invariance", "openvino", "serve-ray", "serve-openvino", "flood"])
def test_rerender_reproduces_the_committed_md(tmp_path, name):
    stage = rebuild.BY_NAME[name]
    _copy_stage(stage, tmp_path)
    done = rebuild.rerender(stage, tmp_path)
    assert done
    for r in stage.reports:
        if r.md and r.render:
            assert (tmp_path / r.md).read_text(encoding="utf-8") == (ROOT / r.md).read_text(encoding="utf-8"), r.md


def test_stages_document_a_duration_and_unknown_stage_is_refused(capsys):
    for s in rebuild.STAGES:  # measured (from a report) or estimated: every stage says how long it takes
        assert "min" in rebuild.stage_duration(s) and s.commands and s.reports
    assert rebuild.main(["no-such-stage"]) == 2
    assert "embedded-default" in capsys.readouterr().err


def test_a_stage_duration_is_measured_from_its_reports_never_typed(tmp_path):
    """The stages table's minutes come from a pipeline report's own stage times or the wall time `make reports`
    recorded; a stage's own text holds only estimates (`~N min`)."""
    import re

    fast = rebuild.BY_NAME["pipeline-fast-amd"]
    stage_s = json.loads((ROOT / fast.reports[0].json).read_text(encoding="utf-8"))["pipeline"]["stage_s"]
    assert rebuild.stage_duration(fast).startswith(f"{stage_s['total'] / 60:.1f} min, the run's own stage")
    flood = rebuild.BY_NAME["flood"]
    assert rebuild.stage_duration(flood, root=tmp_path).startswith("not measured: ~")
    rebuild.record_time("flood", 150.0, "Some CPU", root=tmp_path)
    rec = rebuild.stage_times(tmp_path)["flood"]
    assert rec["minutes"] == 2.5 and rec["cpu"] == "Some CPU" and rec["source"] == "run"
    measured = rebuild.stage_duration(flood, root=tmp_path)
    assert measured.startswith(f"2.5 min, measured on Some CPU ({rec['when'][:10]})")
    for st in rebuild.STAGES:
        typed = re.search(r"(?<![~\d.-])\d+(\.\d+)? min\b", st.duration)
        assert not typed, f"{st.name}: a measured time typed by hand: {st.duration}"
