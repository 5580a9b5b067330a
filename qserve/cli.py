"""The composition root: one sub-command per stage, plus `pipeline`.

    qserve --help
    qserve pipeline                       # train -> export -> bench -> report (embedded default)
    qserve export models/minilm-imdb --bits 8

Each stage module exposes `register(subparsers)` that adds its sub-command and
sets `func`; this file only wires them together. Heavy libraries are imported
inside the commands, so `qserve --help` stays instant.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Callable

from qserve import QserveError, __version__
from qserve.modeling import skip_unused_imports
from qserve.training.study import run_compare

# module that owns each sub-command, in help order
COMMANDS = [
    ("pipeline", "qserve.pipeline"),
    ("train", "qserve.training.train"),
    ("export", "exporters.cli"),
    ("variants", "exporters.cli"),
    ("bench", "qserve.bench.cli"),
    ("report", "qserve.bench.cli"),
    ("gate", "qserve.gate.cli"),
    ("serve", "qserve.serve.cli"),
    ("loadtest", "qserve.serve.cli"),
    ("predict", "qserve.predict.cli"),
    ("deploy", "qserve.serve.infra.deploy"),
]


# The commands that load a model (in this process or in children that are `qserve` again): transformers is told
# scikit-learn and scipy are absent before it imports them (modeling.skip_unused_imports: seconds of each start).
MODEL_COMMANDS = frozenset({"pipeline", "train", "export", "bench", "gate", "serve", "predict"})


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="qserve",
        description="Fine-tune, quantize, benchmark and serve transformer text classifiers.",
    )
    parser.add_argument("--version", action="version", version=f"qserve {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    seen = set()
    for _, module in COMMANDS:
        if module in seen:
            continue
        seen.add(module)
        importlib.import_module(module).register(sub)
    return parser


def command_func(args: argparse.Namespace) -> Callable[[argparse.Namespace], int]:
    """The function that runs the parsed command. `qserve train --compare` is the precision study:
    qserve.training.study runs qserve.training.train in child processes, so train cannot call the study back without an
    import circle; the composition root picks the stage instead."""
    if args.command == "train" and getattr(args, "compare", False):
        return run_compare
    return args.func


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    if args.command in MODEL_COMMANDS:
        skip_unused_imports()
    try:
        return int(command_func(args)(args) or 0)
    except QserveError as e:
        print(f"qserve {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
