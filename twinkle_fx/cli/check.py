"""``twinkle-fx check``: the kernel author's checklist (:func:`twinkle_fx.checklist.check_kernels`)
for every registered kernel, as a table on stdout and optionally a JSON file."""

from __future__ import annotations

import argparse
import importlib.util
import json
import runpy
import sys
from pathlib import Path

from . import names
from .common import (CommandError, check_names, check_output, choose_device, comma_list, device_name, note,
                     quiet_profiler)

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
    parser.add_argument("--device", type=device_name, help="default cuda when available (--tiny: cpu)")
    parser.add_argument("--force", action="store_true",
                        help="run the full sizes even on a CPU (through the Triton interpreter: hours)")
    parser.add_argument("--dtypes", type=comma_list,
                        help="comma-separated fp32,bf16,fp16 (default fp32,bf16; GPU adds fp16)")
    parser.add_argument("--kernels", type=comma_list,
                        help="comma-separated kernel names, classes or functions to check (default all)")
    parser.add_argument("--setup", action="append", default=[], metavar="FILE_OR_MODULE",
                        help="a Python file or module that registers your kernels (run before checking; repeatable)")
    parser.add_argument("--no-builtin", action="store_true", help="do not register the built-in kernels")
    parser.add_argument("--models", default=["qwen2"], type=comma_list,
                        help="built-in model families whose layers the built-in kernels are checked against "
                             "(comma-separated, or 'all'; default qwen2)")
    parser.add_argument("--compile", dest="compiled", action=argparse.BooleanOptionalAction, default=None,
                        help="also time under torch.compile (default: on a GPU without --tiny)")
    parser.add_argument("--out", type=Path, help="write the report as JSON to this file")
    parser.set_defaults(run=run)
    return parser


def _check_arguments(args: argparse.Namespace) -> None:
    """Every argument against what it may be, before anything heavy is imported (seconds)."""
    check_names("--dtypes", args.dtypes or (), names.DTYPES, "dtype")
    if args.models != ["all"]:
        check_names("--models", args.models, names.BUILTIN_FAMILIES, "model family")
    for spec in args.setup:
        _setup_exists(spec)
    check_output("--out", args.out, parents=True, file_name="check.json")


def _setup_exists(spec: str) -> None:
    path = Path(spec)
    if path.suffix == ".py" or path.is_file():
        if not path.is_file():
            raise CommandError(f"--setup {spec}: no such file")
        return
    # the top-level package only: finding a submodule would import (run) its parents
    top = spec.split(".")[0]
    if not top.isidentifier() or importlib.util.find_spec(top) is None:
        raise CommandError(f"--setup {spec}: no such file or module (give a .py file or an importable module name "
                           "that registers your kernels)")


def _run_setup(spec: str) -> None:
    path = Path(spec)
    if path.suffix == ".py" or path.is_file():
        sys.path.insert(0, str(path.resolve().parent))
        runpy.run_path(str(path), run_name="__twinkle_check_setup__")
        return
    try:
        importlib.import_module(spec)
    except ModuleNotFoundError as e:
        if e.name is None or not spec.startswith(e.name):
            raise  # a module the setup itself imports is missing: its traceback says where
        raise CommandError(f"--setup {spec}: no module named {e.name!r} (give a .py file or an importable module "
                           "name that registers your kernels)") from None


def run(args: argparse.Namespace) -> int:
    """Run ``twinkle-fx check`` with parsed ``args``; returns the exit status (1: a correctness failure)."""
    _check_arguments(args)
    quiet_profiler()
    device = choose_device(args.device, default_cpu=args.tiny, command="twinkle-fx check",
                           full_size=None if args.tiny else "the checklist at LLM sizes", force=args.force)
    import torch

    from ..builtin import BUILTIN_MODELS, use_builtin_kernels
    from ..core.registry import scoped_registry
    from ..checklist import check_kernels

    if device.type == "cpu":
        torch.set_num_threads(1)  # tiny ops: intra-op threads only add barriers (see bench --tiny)
    models = list(BUILTIN_MODELS) if args.models == ["all"] else args.models

    with scoped_registry():
        if not args.no_builtin:
            use_builtin_kernels(devices=(device.type,), models=models)
        for spec in args.setup:
            _run_setup(spec)
        try:
            report = check_kernels(device=device, tiny=args.tiny, compiled=args.compiled, progress=note,
                                   dtypes=args.dtypes, kernels=args.kernels)
        except ValueError as e:  # --kernels naming nothing registered: known only once the kernels are
            raise CommandError(f"--kernels: {e}") from None
    print(report)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report.to_json(), indent=2, default=str) + "\n")
        print(f"\nwrote {args.out}")
    return 1 if report.failed else 0
