"""The ``twinkle-fx`` command (also ``python -m twinkle_fx``): a dispatcher over subcommands.

Each subcommand lives in its own module with ``add_parser(subparsers)``, which adds its parser and
sets ``run`` (``run(args) -> exit status``) as its default; adding a command is one line in COMMANDS.
A bad argument is one line on stderr (``twinkle-fx <command>: error: ...``) and exit status 2, never a
traceback. A command module imports nothing heavy at module level, and ``run`` checks every argument
before it imports torch, transformers or triton (seconds on a small machine): ``--help``, ``--version``
and a mistyped flag answer at once.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from .common import CommandError

# subcommand -> module providing add_parser(subparsers)
COMMANDS = {
    "bench": "twinkle_fx.cli.bench",
    "check": "twinkle_fx.cli.check",
    "explain": "twinkle_fx.cli.explain",
}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    from .. import __version__

    parts = []
    for name in ("torch", "triton", "transformers", "kernels"):
        try:
            parts.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            parts.append(f"{name} not installed")
    return f"twinkle-fx {__version__} ({', '.join(parts)})"


class _VersionAction(argparse.Action):
    """``--version``: the versions are looked up only when asked for."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, help="print the twinkle_fx version (and torch's, ...) and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        print(_version())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    return _build()[0]


def _build() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = argparse.ArgumentParser(prog="twinkle-fx", description="Swap fast kernels into PyTorch models.")
    parser.add_argument("--version", action=_VersionAction)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMANDS.values():
        importlib.import_module(module).add_parser(subparsers)
    return parser, subparsers.choices


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``) and run the chosen subcommand; returns its exit status."""
    parser, commands = _build()
    args, unknown = parser.parse_known_args(argv)
    command = commands[args.command]
    if unknown:
        # argparse would blame the top-level parser and show its usage; the subcommand's is the useful one
        command.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return args.run(args)
    except CommandError as e:
        print(f"{command.prog}: error: {e}", file=sys.stderr)
        return 2
