"""The ``twinkle-fx`` command (also ``python -m twinkle_fx``): a dispatcher over subcommands.

Each subcommand lives in its own module with ``add_parser(subparsers)``, which adds its parser and
sets ``run`` (``run(args) -> exit status``) as its default; adding a command is one line in COMMANDS.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> module providing add_parser(subparsers)
COMMANDS = {
    "bench": "twinkle_fx.bench.cli",
    "check": "twinkle_fx.check",
    "explain": "twinkle_fx.explain",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="twinkle-fx", description="Swap fast kernels into PyTorch models.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMANDS.values():
        importlib.import_module(module).add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``) and run the chosen subcommand; returns its exit status."""
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
