"""`python -m qserve.serve serve|loadtest ...`: the two serving commands without the rest of the CLI.

python -m qserve.serve serve models/minilm-imdb-variants/onnx-int8 --port 8000
"""

import argparse
import logging
import sys

from qserve import QserveError
from qserve.serve.cli import register


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m qserve.serve")
    register(parser.add_subparsers(dest="command", metavar="COMMAND", required=True))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except QserveError as e:
        print(f"qserve {args.command}: error: {e}", file=sys.stderr)
        return 2


sys.exit(main())
