"""Render the README's and docs' measured tables from the committed reports' JSON.

    python -m benchmarks.render.tables            # rewrite every table between its markers
    python -m benchmarks.render.tables --check    # exit 1 and print a diff when a table disagrees with its JSON

A table lives in a markdown file between `<!-- table:NAME -->` and `<!-- /table -->`, a passage of prose
that quotes measurements between `<!-- text:NAME -->` and `<!-- /text -->`; NAME is a key of TABLES below (each
block a function in benchmarks/render/blocks/, one module per area of the docs, reading the reports through
benchmarks.render.blocks.reports), and the same block may appear in several files, and may sit indented inside a list
item (its lines then keep that indent). Only the lines between the markers are written, so the prose around a
block stays hand-written; a prose block names its report and the CPU that report records; measured numbers are
never copied by hand (tests/unit/test_docs.py also flags a measured-looking number typed in prose, and in the
comments and docstrings of qserve/ and exporters/: hand_numbers(), code_numbers() and tests/unit/docs_numbers.txt).
`make reports` runs this after every stage; tests/unit/test_docs.py runs it with --check.

    python -m benchmarks.render.tables --hand-numbers   # the measured-looking numbers typed by hand, per file
"""

from __future__ import annotations

import argparse
import ast
import difflib
import inspect
import io
import re
import sys
import tokenize
from pathlib import Path
from typing import Callable

from benchmarks.harness import ROOT
from benchmarks.render.blocks import bench, int8, long_text, openvino, other_models, pipelines, serving, training

MARKER = re.compile(
    r"^(?P<indent>[ ]*)<!-- (?P<kind>table|text):(?P<name>[a-z0-9-]+) -->\n(?P<body>.*?)"
    r"^(?P=indent)<!-- /(?P=kind) -->$",
    re.M | re.S,
)
"""A block between its markers; indented as a whole (inside a list item), its lines are written with that indent."""


TABLES: dict[str, Callable[[], str]] = {
    "main-job": pipelines.main_job,
    "main-job-long-text": long_text.main_job_long_text,
    "embedded-default": pipelines.embedded_default,
    "embedded-default-amd": pipelines.embedded_default_amd,
    "int8-invariance": int8.int8_invariance,
    "variants-invariance": int8.variants_invariance,
    "rows-side-by-side": int8.rows_side_by_side,
    "precision": training.precision,
    "serve": serving.serve,
    "long-text-policies": long_text.long_text_policies,
    "serve-windows": long_text.serve_windows,
    "stages": bench.stages,
    "flood": serving.flood,
    "gate-multilabel": other_models.gate_multilabel,
    "checkpoint-cost": training.checkpoint_cost,
    "seed-precision": training.seed_precision,
    "pipelines-by-cpu": pipelines.pipelines_by_cpu,
    "embedded-default-amd-run": pipelines.embedded_default_amd_run,
    "embedded-default-run": pipelines.embedded_default_run,
    "embedded-default-choice": pipelines.embedded_default_choice,
    "pipeline-fast-amd": pipelines.pipeline_fast_amd,
    "serve-overhead": serving.serve_overhead,
    "serve-overhead-xeon": serving.serve_overhead_xeon,
    "serving-lanes": serving.serving_lanes,
    "ov-breakdown-xeon": openvino.ov_breakdown_xeon,
    "export-ov-bf16-hint": openvino.export_ov_bf16_hint,
    "distilbert-base-dims": int8.distilbert_base_dims,
    "int8-breakdown": int8.int8_breakdown,
    "crosscheck": bench.crosscheck,
    "b1-modes": bench.b1_modes,
    "bench-repeat": bench.bench_repeat,
    "bench-time": bench.bench_time,
    "serve-text": serving.serve_text,
    "serve-protocols": serving.serve_protocols,
    "predict": serving.predict_text,
    "checkpoint-cost-text": training.checkpoint_cost_text,
    "main-job-precision-probe": training.main_job_precision_probe,
    "precision-findings": training.precision_findings,
    "optimizer-step": training.optimizer_step,
    "serve-protocol-cost": serving.serve_protocol_cost,
    "serve-protocol-cost-xeon": serving.serve_protocol_cost_xeon,
    "openvino": openvino.openvino,
    "export-ov-invariance": openvino.export_ov_invariance,
    "serve-buckets": serving.serve_buckets,
    "lifecycle": serving.lifecycle,
    "byo-bert": other_models.byo_bert,
    "int8-invariance-picked": int8.int8_invariance_picked,
    "rows-side-by-side-text": int8.rows_side_by_side_text,
    "int8-invariance-base-dims": int8.int8_invariance_base_dims,
    "serve-ray-sizing": serving.serve_ray_sizing,
    "long-text-default": long_text.long_text_default,
    "long-text-findings": long_text.long_text_findings,
    "bench-eval-cut": bench.bench_eval_cut,
    "export-smoothing": int8.export_smoothing,
    "image": serving.image,
}


UNITS = r"(?:ms|s|min|h|%|x|×|MB|MiB|GB|GiB|KB|req/s|texts/s|rows/s|seq/s|sequences/s|samples/s|GOP/s|points)"
NUMBER = r"\d[\d,]*(?:\.\d+)?"
# A figure with a unit (a range counts once: "0.97-1.06x"), one in scientific notation (an error, a Δprob) or
# with three decimals or more (an F1, a threshold, a logit error); not a version (1.45.2) or a date.
HAND_NUMBER = re.compile(
    rf"(?<![\w.,/-])(?:{NUMBER}(?:\s?[-–]\s?{NUMBER})?\s?{UNITS}(?![\w/])|{NUMBER}e-?\d+"
    rf"|\d+\.\d{{3,}}(?!\d|\.\d))"
)
_NOT_PROSE = re.compile(r"^```.*?^```[^\n]*$|<!--.*?-->|`[^`\n]*`", re.M | re.S)


def hand_numbers(text: str) -> list[str]:
    """The measured-looking numbers typed in a page's prose and hand-written tables: figures with a unit or in
    scientific notation, outside rendered blocks, code (fenced or inline) and HTML comments."""
    prose = _NOT_PROSE.sub(" ", MARKER.sub(" ", text))
    return [re.sub(r"\s+", " ", m.group(0)) for m in HAND_NUMBER.finditer(prose)]


def markdown_files(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


CODE = ("qserve", "exporters")
"""The packages whose comments and docstrings hold no measured number (it lives in docs/, beside its report)."""
SETTING = re.compile(rf"\d+\s?(?:ms|s|min|h|%|x|×)|{NUMBER}e-?\d+")
"""In code, a whole number with a time unit, % or x is a setting or a bar (a 5 ms wait, a 95% interval, 16x the
batch) and scientific notation a tolerance or a learning rate; the rest of what HAND_NUMBER finds looks measured
(a decimal or a range with a unit, a size, a rate, a bare number with 3+ decimals)."""


def code_prose(source: str) -> str:
    """A Python module's comments and docstrings (every string statement), the docstrings' indented command lines
    (code, like a page's fenced blocks) left out."""
    parts = [t.string for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        for stmt in body if isinstance(body, list) else []:
            if (
                isinstance(stmt, ast.Expr)
                and isinstance(stmt.value, ast.Constant)
                and isinstance(stmt.value.value, str)
            ):
                parts.append(re.sub(r"(?m)^    .*$", "", inspect.cleandoc(stmt.value.value)))
    return "\n\n".join(parts)


def code_numbers(source: str) -> list[str]:
    """The measured-looking numbers in a module's comments and docstrings (inline code aside), settings aside."""
    return [n for n in hand_numbers(code_prose(source)) if not SETTING.fullmatch(n)]


def code_files(root: Path = ROOT) -> list[Path]:
    return sorted(p for d in CODE for p in (root / d).rglob("*.py"))


def typed_numbers(root: Path = ROOT) -> list[tuple[str, str]]:
    """(file, number) for every measured-looking number typed by hand in the pages and in the code's prose."""
    found = [(p, n) for p in markdown_files(root) for n in hand_numbers(p.read_text(encoding="utf-8"))]
    found += [(p, n) for p in code_files(root) for n in code_numbers(p.read_text(encoding="utf-8"))]
    return [(str(p.relative_to(root)), n) for p, n in found]


def render_file(text: str, rendered: dict[str, str], where: str = "") -> str:
    def sub(m: re.Match[str]) -> str:
        name = m["name"]
        if name not in TABLES:
            raise SystemExit(f"{where}: unknown table {name!r}; known: {', '.join(TABLES)}")
        if name not in rendered:
            rendered[name] = TABLES[name]()
        ind = m["indent"]
        body = "\n".join(ind + line if line else line for line in rendered[name].split("\n"))
        return f"{ind}<!-- {m['kind']}:{name} -->\n{body}\n{ind}<!-- /{m['kind']} -->"

    return MARKER.sub(sub, text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 with a diff if any table is stale")
    p.add_argument(
        "--hand-numbers",
        action="store_true",
        help="print the measured-looking numbers typed in prose and in qserve/'s and exporters/' comments and "
        "docstrings, one `FILE<TAB>NUMBER` line each (the format of tests/unit/docs_numbers.txt); write nothing",
    )
    p.add_argument(
        "files",
        nargs="*",
        type=Path,
        help="markdown files (default: README.md and docs/**/*.md; .py with --hand-numbers)",
    )
    args = p.parse_args(argv)
    if args.hand_numbers:
        for path in args.files or [*markdown_files(), *code_files()]:
            find = code_numbers if path.suffix == ".py" else hand_numbers
            for n in find(path.read_text(encoding="utf-8")):
                print(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}\t{n}")
        return 0
    rendered: dict[str, str] = {}
    stale = []
    for path in args.files or markdown_files():
        text = path.read_text(encoding="utf-8")
        new = render_file(text, rendered, str(path))
        if new == text:
            continue
        if args.check:
            stale.append(path)
            sys.stdout.writelines(
                difflib.unified_diff(
                    text.splitlines(True),
                    new.splitlines(True),
                    f"{path} (committed)",
                    f"{path} (from the reports' JSON)",
                )
            )
        else:
            path.write_text(new, encoding="utf-8")
            print(f"updated {path}")
    if stale:
        print(
            f"\n{len(stale)} file(s) hold tables that disagree with their reports' JSON: "
            f"{', '.join(map(str, stale))}; run `python -m benchmarks.render.tables`",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
