"""`qserve gate`: a variant earns its place on the user's own data, or says why not.

    qserve gate models/minilm-l6-distilbert-imdb/variants/onnx-int8 --out benchmarks/reports/gate
    qserve gate RUN_DIR/variants/onnx-int8 --data reviews.csv --split all --calibrate-on none

Each VARIANT against its checkpoint's fp32 export on labelled data; the verdict (on agreement's lower bound, more
texts where undecided) and the calibration are sealed into its manifest.json (docs/gate.md). Exit status 1 when a
variant does not pass (failed or undecided).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from qserve import QserveError
from qserve.configflags import add_flags, build
from qserve.gate.config import GateConfig
from qserve.gate.report import markdown, write_report
from qserve.gate.run import run_gate


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "gate",
        help="a release gate: each variant vs fp32 on labelled data, with confidence "
        "intervals and calibration, sealed into its manifest",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("variants", nargs="+", metavar="VARIANT", help="variant directories (written by `qserve export`)")
    add_flags(p, GateConfig)
    p.set_defaults(func=cmd_gate)


def cmd_gate(args: argparse.Namespace) -> int:
    cfg = build(GateConfig, args, error=QserveError).validate()
    results = run_gate([Path(v) for v in args.variants], cfg)
    print(markdown(results).rstrip())
    if cfg.out:
        written = write_report(results, Path(cfg.out), cfg.force)
        print("\nwrote " + ", ".join(str(p) for p in written))
    if cfg.record:
        print(
            f"\nthe verdicts are sealed in {len(results)} manifest(s): `qserve serve --require-gate` serves a "
            "passing variant only"
        )
    return 0 if all(r["gate"]["passed"] for r in results) else 1
