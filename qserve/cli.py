"""The composition root: one sub-command per stage, plus `pipeline`.

    qserve --help
    qserve pipeline                       # train -> export -> bench -> report (embedded default)
    qserve export models/minilm-imdb --bits 8

Each stage's `register(subparsers)` adds its sub-command; heavy imports stay in the commands, so `--help` is instant.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Callable

from qserve import QserveError, __version__
from qserve.modeling import skip_unused_imports

# module that owns each sub-command, in help order
COMMANDS = [
    ("pipeline", "qserve.pipeline"),
    ("train", "qserve.training.train"),
    ("export", "exporters.cli"),
    ("export", "qserve.repair"),  # adds --repair and the gate's data flags to the export command
    ("variants", "exporters.cli"),
    ("bench", "qserve.bench.cli"),
    ("report", "qserve.bench.cli"),
    ("gate", "qserve.gate.cli"),
    ("serve", "qserve.serve.cli"),
    ("loadtest", "qserve.serve.cli"),
    ("predict", "qserve.predict.cli"),
    ("deploy", "qserve.serve.infra.deploy"),
]


# commands that load a model: transformers is told scikit-learn and scipy are absent (modeling.skip_unused_imports)
MODEL_COMMANDS = frozenset({"pipeline", "train", "export", "bench", "gate", "serve", "predict"})


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Every command's parser; with `command`, only the module that owns it registers: `main` passes the command
    it runs, so `qserve serve` imports no training, export or bench code (part of a container's start to
    ready, docs/deploy.md)."""
    parser = argparse.ArgumentParser(
        prog="qserve",
        description="Fine-tune, quantize, benchmark and serve transformer text classifiers.",
    )
    parser.add_argument("--version", action="version", version=f"qserve {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    seen = set()
    for name, module in COMMANDS:
        if module in seen or command not in (None, name):
            continue
        seen.add(module)
        importlib.import_module(module).register(sub)
    return parser


def command_func(args: argparse.Namespace) -> Callable[[argparse.Namespace], int]:
    """The function that runs the parsed command; `train --compare` goes to the study here, since the study runs
    train in children and train cannot import it back."""
    if args.command == "train" and getattr(args, "compare", False):
        return importlib.import_module("qserve.training.study").run_compare
    return args.func


def command_named(argv: list[str]) -> str | None:
    """The command `argv` names (its first word that is not a flag: qserve's own flags take no value), or None."""
    word = next((a for a in argv if not a.startswith("-")), None)
    return word if word in dict(COMMANDS) else None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(command_named(argv))
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
