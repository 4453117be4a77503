"""``twinkle-fx check``: the kernel author's checklist (:func:`twinkle_fx.cli.checklist.check_kernels`)
for every registered kernel, as a table on stdout and optionally a JSON file."""

from __future__ import annotations

import argparse
import importlib
import json
import runpy
import sys
from pathlib import Path

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``check`` subcommand to the ``twinkle-fx`` parser."""
    parser = subparsers.add_parser(
        "check", help="the kernel author's checklist for every registered kernel",
        description="Check every registered kernel against the original it replaces: correctness forward and "
                    "backward over several sizes and dtypes, speed-up (eager and compiled), peak memory, "
                    "fallback, profiler rows, docstring. Exit status 1 on a correctness failure.",
        epilog="examples:\n  twinkle-fx check                       # the built-in kernels on the GPU\n"
               "  twinkle-fx check --tiny                # the same on the CPU, small sizes (CI)\n"
               "  twinkle-fx check --no-builtin --setup my_kernels_setup.py --out check.json",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="small sizes, few timed calls, the CPU by default")
    parser.add_argument("--device", help="default cuda when available (--tiny: cpu)")
    parser.add_argument("--dtypes", help="comma-separated fp32,bf16,fp16 (default fp32,bf16; GPU adds fp16)")
    parser.add_argument("--kernels", help="comma-separated kernel names, classes or functions to check (default all)")
    parser.add_argument("--setup", action="append", default=[], metavar="FILE_OR_MODULE",
                        help="a Python file or module that registers your kernels (run before checking; repeatable)")
    parser.add_argument("--no-builtin", action="store_true", help="do not register the built-in kernels")
    parser.add_argument("--models", default="qwen2",
                        help="built-in model families whose layers the built-in kernels are checked against "
                             "(comma-separated, or 'all'; default qwen2)")
    parser.add_argument("--compile", dest="compiled", action=argparse.BooleanOptionalAction, default=None,
                        help="also time under torch.compile (default: on a GPU without --tiny)")
    parser.add_argument("--out", type=Path, help="write the report as JSON to this file")
    parser.set_defaults(run=run)
    return parser


def _run_setup(spec: str) -> None:
    path = Path(spec)
    if path.suffix == ".py" or path.is_file():
        if not path.is_file():
            raise SystemExit(f"twinkle-fx check: --setup {spec}: no such file")
        sys.path.insert(0, str(path.resolve().parent))
        runpy.run_path(str(path), run_name="__twinkle_check_setup__")
    else:
        importlib.import_module(spec)


def run(args: argparse.Namespace) -> int:
    """Run ``twinkle-fx check`` with parsed ``args``; returns the exit status (1: a correctness failure)."""
    import torch

    from ..bench.environment import resolve_device
    from ..builtin import BUILTIN_MODELS, use_builtin_kernels
    from ..registry import scoped_registry
    from ..settings import use_triton_interpreter
    from .checklist import check_kernels

    device = resolve_device(args.device, tiny=args.tiny)
    if device.type == "cpu":
        use_triton_interpreter(command="twinkle-fx check")
        torch.set_num_threads(1)  # tiny ops: intra-op threads only add barriers (see bench --tiny)
    models = list(BUILTIN_MODELS) if args.models == "all" else [m.strip() for m in args.models.split(",") if m.strip()]

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    with scoped_registry():
        try:
            if not args.no_builtin:
                use_builtin_kernels(devices=(device.type,), models=models)
            for spec in args.setup:
                _run_setup(spec)
            report = check_kernels(
                device=device, tiny=args.tiny, compiled=args.compiled, progress=progress,
                dtypes=[d.strip() for d in args.dtypes.split(",")] if args.dtypes else None,
                kernels=[k.strip() for k in args.kernels.split(",")] if args.kernels else None,
            )
        except ValueError as e:
            raise SystemExit(f"twinkle-fx check: {e}") from None
    print(report)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report.to_json(), indent=2, default=str) + "\n")
        print(f"\nwrote {args.out}")
    return 1 if report.failed else 0
