"""The docs build cleanly and their measured tables match the reports' JSON.

python -m pytest -q tests/unit/test_docs.py
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from benchmarks.render import tables as render_tables
from benchmarks.render.blocks import long_text, reports

ROOT = Path(__file__).resolve().parents[2]


def _mkdocs(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_mkdocs_build_strict_has_no_warning(tmp_path):
    res = _mkdocs(ROOT / "mkdocs.yml", tmp_path / "site")
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "WARNING" not in out, out
    page = (tmp_path / "site" / "measurements" / "index.html").read_text(encoding="utf-8")
    assert "ov-bf16" in page and "<table>" in page  # the rendered tables made it into the site


def test_mkdocs_strict_fails_on_a_broken_link(tmp_path):
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    with open(tmp_path / "docs" / "bench.md", "a", encoding="utf-8") as f:
        f.write("\nSee [a page that does not exist](no-such-page.md).\n")
    res = _mkdocs(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert res.returncode != 0
    assert "no-such-page.md" in res.stdout + res.stderr


def test_every_table_matches_its_report_json(capsys):
    rc = render_tables.main(["--check"])
    assert rc == 0, capsys.readouterr().out


def test_a_hand_edited_table_number_is_caught_and_rewritten(tmp_path, capsys):
    readme = tmp_path / "README.md"
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index("<!-- text:main-job -->")
    row_at = text.index("\n| torch-fp32 |", start) + 1  # the reference: in every pipeline report
    row_end = text.index("\n", row_at)
    cells = text[row_at:row_end].split(" | ")
    cells[1] = "0.01"  # the b1 latency column, edited by hand
    readme.write_text(text[:row_at] + " | ".join(cells) + text[row_end:], encoding="utf-8")
    assert render_tables.main(["--check", str(readme)]) == 1
    assert "0.01" in capsys.readouterr().out
    assert render_tables.main([str(readme)]) == 0
    assert readme.read_text(encoding="utf-8") == text


def test_every_block_names_a_report_and_the_cpu_it_records():
    """Each rendered block (table or prose) names a committed report under benchmarks/reports/ and the CPU that
    report's JSON records, so no measured number reaches the docs without its machine."""
    import json
    import re

    from qserve.provenance import recorded_cpu

    reports = ROOT / "benchmarks" / "reports"

    def cpus(path: Path) -> set[str]:
        files = [path] if path.suffix == ".json" else sorted(path.glob("*.json")) if path.is_dir() else []
        return {c for f in files if (c := recorded_cpu(json.loads(f.read_text(encoding="utf-8"))))}

    for name, render in render_tables.TABLES.items():
        if name == "stages":  # the stage list: a "measured on" column per stage, its reports named relative
            continue
        if name == "seed-precision":  # the seed project's published figures (study.SEED), named as not ours
            continue
        text = render()
        named = set(re.findall(r"benchmarks/reports/([\w./-]+)", text))
        assert named, f"{name} names no report"
        assert any(c in text for rel in named for c in cpus(reports / rel.rstrip("/."))), (
            f"{name} does not name the CPU its reports record ({sorted(named)})"
        )


def test_a_block_inside_a_list_item_keeps_its_indent(tmp_path):
    """A block indented under a list item renders with that indent (a paragraph of the item, not a new one)."""
    doc = tmp_path / "x.md"
    text = "- an item:\n\n    <!-- text:serving-lanes -->\n    stale\n    <!-- /text -->\n\n    more of it\n"
    doc.write_text(text, encoding="utf-8")
    assert render_tables.main([str(doc)]) == 0
    out = doc.read_text(encoding="utf-8")
    body = out.split("<!-- text:serving-lanes -->\n", 1)[1].split("    <!-- /text -->", 1)[0]
    assert "stale" not in out and body.strip() and all(line.startswith("    ") for line in body.splitlines())
    assert render_tables.main(["--check", str(doc)]) == 0


def test_unknown_table_name_is_refused(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("<!-- table:no-such-table -->\n<!-- /table -->\n", encoding="utf-8")
    try:
        render_tables.main(["--check", str(doc)])
    except SystemExit as e:
        assert "no-such-table" in str(e) and "embedded-default" in str(e)
    else:
        raise AssertionError("an unknown table name was accepted")


def test_readme_is_a_front_door():
    """What, the two commands, the tour, the headline table from the current main job's report, in <= 250 lines."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    for must in (
        "make demo",
        "make test",
        "qserve export",
        "qserve bench",
        "qserve serve",
        "curl ",
        "--engine ray",
        "qserve predict",
        "<!-- text:main-job -->",
        "docs/measurements.md",
    ):
        assert must in text, must
    block = text.split("<!-- text:main-job -->", 1)[1].split("<!-- /text -->", 1)[0]
    assert f"`benchmarks/reports/{reports.MAIN_JOB}/report.json` (" in block  # rendered from it, machine named
    assert f"benchmarks/reports/{reports.MAIN_JOB}/decision.png" in text
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert page.name in nav, f"{page.name} is not in mkdocs.yml's nav"


def _command_block(text: str) -> str:
    return text.split("## Commands", 1)[1].split("```")[1]


def test_the_command_lists_name_every_command():
    """README's and docs/index.md's command lists name every `qserve` sub-command (qserve/cli.py's COMMANDS)."""
    from qserve.cli import COMMANDS

    for page in (ROOT / "README.md", ROOT / "docs" / "index.md"):
        block = _command_block(page.read_text(encoding="utf-8"))
        missing = [name for name, _ in COMMANDS if f"qserve {name} " not in block]
        assert not missing, f"{page.name}'s command list lacks {missing}"


def test_the_front_pages_state_what_a_newcomer_needs():
    """docs/index.md names the release gate and the automatic precision; /v1's Content-Type, the served name and
    huggingface_hub's offline mode are said where a newcomer looks first."""
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    for must in (
        "qserve gate",
        "--precision auto",
        "Content-Type: application/json",
        "/v1/models",
        "HF_HUB_OFFLINE=1",
        "RUN/variants/<name>",
        "models/<model>-<dataset>/",
    ):
        assert must in index, must
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for must in ("Content-Type: application/json", "/v1/models", "HF_HUB_OFFLINE=1"):
        assert must in readme, must


def test_no_curl_example_without_content_type_and_no_flag_that_does_not_exist():
    """The issue's own checks: `grep -rn "curl .*-d" README.md docs | grep -v Content-Type` finds nothing, and
    `--inline-lone` appears only as `--no-inline-lone` (the one flag that exists)."""
    import re

    bad, lone = [], []
    for page in render_tables.markdown_files():
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            if re.search(r"curl .*-d", line) and "Content-Type" not in line:
                bad.append(f"{page.name}:{n}")
            if re.search(r"(?<!no)-inline-lone", line.replace("--no-inline-lone", "")):
                lone.append(f"{page.name}:{n}")
    assert not bad, f"curl with a body but no Content-Type: {bad}"
    assert not lone, f"--inline-lone is not a flag (--no-inline-lone is): {lone}"


def test_a_pending_report_renders_not_measured_and_fills_in_once_it_exists(tmp_path, monkeypatch):
    # the long-text tables read three checkpoints' reports and the served-windows one; a stage not run yet
    # is a "not measured" column (or row), never a crash, and its numbers appear as soon as its JSON does
    import json

    monkeypatch.setattr(reports, "REPORTS", tmp_path)  # the one loader every block reads through
    committed = ROOT / "benchmarks" / "reports"
    (tmp_path / "long-text").mkdir()
    shutil.copy(committed / "long-text" / "report.json", tmp_path / "long-text" / "report.json")
    table = long_text.long_text_policies()
    head_row = next(line for line in table.splitlines() if line.startswith("| head |"))
    cells = [c.strip() for c in head_row.strip("|").split("|")]
    assert cells[1:3] == ["not measured"] * 2 and cells[5:7] == ["not measured"] * 2  # head-trained, full data
    assert cells[3].endswith("%") and cells[3] != "not measured"  # the head-tail checkpoint's own accuracy
    assert "STAGE=long-text-head" in table and "STAGE=long-text-full" in table
    assert "not measured" in long_text.serve_windows() and "STAGE=serve-windows" in long_text.serve_windows()

    report = json.loads((committed / "long-text" / "report.json").read_text(encoding="utf-8"))
    for p in report["variants"][0]["long_text_policies"]:
        p["accuracy"] = 0.5  # a different checkpoint: its own numbers, in its own columns
    (tmp_path / "long-text-head").mkdir()
    (tmp_path / "long-text-head" / "report.json").write_text(json.dumps(report), encoding="utf-8")
    head_row = next(line for line in long_text.long_text_policies().splitlines() if line.startswith("| head |"))
    cells = [c.strip() for c in head_row.strip("|").split("|")]
    assert cells[1] == "50.00%" and cells[3] != "50.00%" and cells[5] == "not measured"


def test_every_block_reads_the_reports_through_the_one_loader(tmp_path, monkeypatch):
    """With the reports dir pointed at an empty folder, every block that reads a report either says "not measured"
    or fails to find its JSON under that folder: none reads benchmarks/reports/ another way."""
    monkeypatch.setattr(reports, "REPORTS", tmp_path)
    for name, render in render_tables.TABLES.items():
        if name in ("stages", "seed-precision"):  # rebuild_reports' stage list; the seed's figures (study.SEED)
            continue
        try:
            text = render()
        except FileNotFoundError as e:
            assert Path(e.filename).is_relative_to(tmp_path), f"{name} read {e.filename}"
        else:
            assert "not measured" in text.lower(), f"{name} rendered without its reports"


@pytest.mark.parametrize("page", ["README.md", "docs/index.md"])
def test_layout_names_only_paths_that_exist(page):
    """Every file or folder a Layout block names exists: a name is read under its line's top folder
    (a continuation line keeps the one above), or from the repository root."""
    import re

    text = (ROOT / page).read_text(encoding="utf-8")
    block = text.split("## Layout", 1)[1].split("```")[1]
    top, missing, named = ROOT, [], 0
    for line in block.strip("\n").splitlines():
        if not line.startswith(" "):
            top = ROOT / line.split()[0]
            assert top.is_dir(), f"{page} Layout: {line.split()[0]} is not a folder"
        for name in re.findall(r"[\w.-]+(?:/[\w.-]+)*(?:/|\.py|\.md|\.yml|\.sh)(?=[\s,;:)]|$)", line):
            named += 1
            if not ((top / name).exists() or (ROOT / name).exists()):
                missing.append(name)
    assert named >= 20 and not missing, f"{page} Layout names paths that do not exist: {missing}"


def _listed_numbers() -> Counter[tuple[str, str]]:
    lines = (ROOT / "tests" / "unit" / "docs_numbers.txt").read_text(encoding="utf-8").splitlines()
    return Counter(tuple(line.split("\t", 1)) for line in lines if line and not line.startswith("#"))


def test_no_measured_number_is_typed_by_hand():
    """A measured-looking number (a figure with a unit, in scientific notation or with 3+ decimals) in the prose or
    a hand-written table of README.md or a page is rendered from its report (a table: or text: block), and one in a
    comment or docstring of qserve/ or exporters/ (settings aside: render_tables.SETTING) lives in docs/ beside its
    report; either is otherwise listed, deliberately, in tests/unit/docs_numbers.txt, which holds only what the
    files still hold."""
    assert len(render_tables.code_files(ROOT)) > 100  # qserve/ and exporters/ are read
    found = Counter(render_tables.typed_numbers())
    listed = _listed_numbers()
    typed = sorted((found - listed).elements())
    gone = sorted((listed - found).elements())
    assert not typed, (
        "measured-looking numbers typed by hand (render them from their report: a <!-- text:NAME --> "
        "block in benchmarks/render/blocks/, named in render_tables.TABLES; an explanatory one goes in "
        "tests/unit/docs_numbers.txt): " + "; ".join(f"{f}: {n}" for f, n in typed)
    )
    assert not gone, (
        "tests/unit/docs_numbers.txt lists numbers the pages no longer hold (remove those lines): "
        + "; ".join(f"{f}: {n}" for f, n in gone)
    )


def test_code_numbers_are_found_in_comments_and_docstrings_settings_aside():
    source = (
        '"""Serve it.\n\n    qserve serve --max-wait-ms 2.5  # a command: 4.2 ms\n\nRead 1.8x the texts/s."""\n'
        "WAIT_MS = 5.5  # the 5 ms wait of a 95% interval at 16x the batch, lr 1e-4; measured 195-200 ms, 24 MB\n"
        'def f():\n    """A fast path: 0.92x of the ceiling, margin 0.268."""\n    return "not prose: 3.5 ms"\n'
    )
    assert render_tables.code_numbers(source) == ["195-200 ms", "24 MB", "1.8x", "0.92x", "0.268"]


def test_hand_numbers_are_found_in_prose_and_hand_tables_only():
    text = (
        "The first answer took 85.6 ms (0.97-1.06x), max |Δprob| 3.6e-4, F1 0.8550.\n\n"
        "| variant | p50 |\n|---|---:|\n| onnx-int8 | 7.5 ms |\n\n"
        "<!-- text:flood -->\nrendered: 120.6 ms\n<!-- /text -->\n\n"
        "```bash\nqserve loadtest --duration 10s  # 40 s of load\n```\n"
        "Flags: `--max-wait-ms 5 ms`, version 1.45.2, on 2026-12-04, 2 cores, 32 texts.\n"
    )
    assert render_tables.hand_numbers(text) == ["85.6 ms", "0.97-1.06x", "3.6e-4", "0.8550", "7.5 ms"]
