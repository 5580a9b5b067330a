"""`qserve bench` and `qserve report`: measure variants, (re-)render reports.

    qserve bench models/minilm-imdb-variants/* --batch-sizes 1,8,32 --seq-lens 32,128,256 --threads 2
    qserve report benchmarks/reports/minilm-l6-distilbert-cpu-t2

Writes report.json/csv/md/html and its charts into --out (default benchmarks/reports/<model>-<device>-t<threads>,
or benchmarks/reports/<--name>; a non-empty one needs --force). A VARIANT_DIR holding variant directories stands
for all of them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from qserve import QserveError
from qserve.bench.config import BenchConfig
from qserve.bench.report import write_reports
from qserve.bench.runner import run_bench
from qserve.benchreport import load_report
from qserve.configflags import add_flags, build


def expand_variant_dirs(paths: list[str]) -> list[Path]:
    """Each path is a variant dir (has manifest.json) or a folder of them (expanded, sorted)."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir() and not (p / "manifest.json").exists():
            kids = sorted(k for k in p.iterdir() if k.is_dir() and (k / "manifest.json").exists())
            if kids:
                out.extend(kids)
                continue
        if not p.exists():
            raise QserveError(f"VARIANT_DIR {p} does not exist; pass directories written by `qserve export`")
        out.append(p)  # a broken variant is still benchmarked, so its failure is reported
    return out


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "bench",
        help="benchmark variants (latency, throughput, memory, size, accuracy): each CPU variant in its own "
        "process, the CUDA ones in one shared worker (--isolation)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("variants", nargs="+", metavar="VARIANT_DIR", help="variant directories (or a folder of them)")
    add_flags(p, BenchConfig)
    p.set_defaults(func=cmd_bench)

    r = subparsers.add_parser(
        "report",
        help="re-render report.md/csv/html and plots from a bench report.json",
        description="Re-render report.md, report.csv, report.html and the PNG plots from report.json.",
    )
    r.add_argument("report", metavar="REPORT_JSON_OR_DIR", help="report.json or the directory holding it")
    r.add_argument("--out", type=Path, default=None, help="write here instead of beside report.json")
    r.set_defaults(func=cmd_report)


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    return build(BenchConfig, args, error=QserveError).validate()


def cmd_bench(args) -> int:
    cfg = config_from_args(args)
    report = run_bench(expand_variant_dirs(args.variants), cfg)
    out = Path(report["run"]["out"])
    print((out / "report.md").read_text(encoding="utf-8").split("\n## ", 1)[0].rstrip())
    print(f"\nwrote {out}/report.md, report.html, report.json, report.csv and plots")
    failed = [v["name"] for v in report["variants"] if v["status"] != "ok"]
    if failed:
        print(f"{len(failed)} variant(s) failed: {', '.join(failed)} (details in report.md)")
        return 1
    return 0


def cmd_report(args) -> int:
    report, where = load_report(args.report)
    out = args.out or where
    written = write_reports(report, out, write_json=Path(out).resolve() != where.resolve())
    print("wrote " + ", ".join(str(p) for p in written))
    return 0
