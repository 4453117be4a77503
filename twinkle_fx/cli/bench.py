"""``twinkle-fx bench``: the command line of the benchmark harness.

Examples::

    twinkle-fx bench                                   # qwen2 reference workload, all backends
    twinkle-fx bench --model llama --backends eager,inductor,twinkle --out results/
    twinkle-fx bench --micro --out results/            # kernel microbenchmarks
    twinkle-fx bench --tiny                            # CPU smoke test: eager and kernelize, ~20 s
    twinkle-fx bench --tiny --backends eager,twinkle   # + a compiled backend: about a minute more each
    twinkle-fx bench --plot results/bench-qwen2.json   # table + PNG again from a saved run
    twinkle-fx bench --tiny --profile prof/            # + prof/<backend>/profile_trace.json, profile_report.txt
    twinkle-fx bench --inference --out results/        # prefill latency + decode tok/s, CUDA graphs rows
    twinkle-fx bench --matrix --out results/           # the training step of six model shapes, one table
    twinkle-fx bench --matrix --models qwen2,qwen3_moe --tiny   # the same loop on tiny configs on the CPU
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import names
from .common import (CommandError, StepProgress, check_names, check_output, choose_device, comma_list, device_name,
                     non_negative_int, positive_float, positive_int, quiet_profiler)

__all__ = ["add_parser", "run"]

_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}

# (full run, --tiny) defaults; an explicit flag always wins
_MODEL_DEFAULTS = {"batch": (4, 2), "seq": (1024, 32), "dtype": ("bf16", "fp32"), "steps": (20, 2), "warmup": (3, 1)}
_MICRO_DEFAULTS = {"dtype": ("bf16", "fp32"), "steps": (50, 2), "warmup": (5, 1)}
# the full run: each way of running the model, plain and with CUDA graphs (the fastest twinkle_fx
# configurations, eager and compiled, are the CUDA-graph ones: docs/performance.md), and the Liger anchor
_MODEL_BACKENDS = ("eager,inductor,inductor+cudagraphs,twinkle,twinkle+cudagraphs,kernelize,kernelize+cudagraphs,"
                   "liger")
# --tiny: the backends that run in seconds on a CPU. Measured on the 2-core CI machine (busy):
# eager + kernelize 20.5 s in all; each compiled backend adds ~40-60 s of Inductor compilation
# (twinkle alone: 57 s), so the full list took 3.5 minutes.
_TINY_MODEL_BACKENDS = "eager,kernelize"
_MICRO_BACKENDS = "eager,inductor,twinkle,liger,cce"
# the inference workload: (full run, --tiny) defaults
_INFERENCE_DEFAULTS = {"prefill": (2048, 32), "decode_batch": (32, 2), "context": (1024, 16), "steps": (20, 2),
                       "warmup": (3, 1)}
_INFERENCE_BACKENDS = "eager,kernelize,kernelize+cudagraphs,inductor,inductor+cudagraphs,twinkle,twinkle+cudagraphs"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``bench`` subcommand to the ``twinkle-fx`` parser."""
    parser = subparsers.add_parser(
        "bench",
        help="benchmark backends on a training step, or the kernels (--micro)",
        description="Benchmark a transformers training step (forward + backward with labels) under each "
                    "backend, each on a fresh model with the same seed; or, with --micro, every twinkle_triton "
                    "kernel against eager, Inductor and Liger with the device's copy bandwidth as roofline. "
                    "Exit status 1 when a row failed or disagrees with eager (WRONG).",
        epilog=__doc__.split("Examples::", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", default="qwen2", help=f"workload, one of {', '.join(names.WORKLOADS)} (qwen2, the "
                                                          "default: Qwen2-0.5B shape; every family of the built-in "
                                                          "mapping is one, see twinkle_fx.bench.workloads)")
    parser.add_argument("--backends", type=comma_list, help=f"comma-separated; default {_MODEL_BACKENDS} "
                                           f"(--tiny: {_TINY_MODEL_BACKENDS}; --micro: {_MICRO_BACKENDS}); a "
                                           "twinkle backend followed by -<graph rewrite> runs without that rewrite "
                                           "(twinkle+cudagraphs-embedding_grad), a row to set beside the backend's")
    parser.add_argument("--batch", type=positive_int, help="sequences per step (default 4; --tiny 2)")
    parser.add_argument("--seq", type=positive_int, help="tokens per sequence (default 1024; --tiny 32)")
    parser.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), help="default bf16 (--tiny fp32)")
    parser.add_argument("--steps", type=positive_int, help="timed steps (default 20; --micro: timed calls, default "
                                                           "50; --tiny 2)")
    parser.add_argument("--warmup", type=non_negative_int,
                        help="untimed steps after the first (default 3; --micro 5; --tiny 1)")
    parser.add_argument("--micro", action="store_true", help="kernel microbenchmarks instead of the model")
    parser.add_argument("--ops", type=comma_list, help="--micro: comma-separated ops (each with all its cases) or cases "
                        "(\"moe_swiglu_experts mixtral\"); default all")
    parser.add_argument("--out", type=Path, help="directory for the JSON result and the PNG chart")
    parser.add_argument("--tiny", action="store_true",
                        help="a tiny config on the CPU through the Triton interpreter, the same code path: ~20 s "
                             "with the default eager,kernelize on a 2-core CPU; each compiled backend (inductor, "
                             "twinkle, ...) adds about a minute of Inductor compilation")
    parser.add_argument("--device", type=device_name, help="default cuda when available (--tiny: cpu)")
    parser.add_argument("--force", action="store_true",
                        help="run the full-size workload even on a CPU (through the Triton interpreter: hours)")
    parser.add_argument("--seed", type=int, default=0, help="weights and inputs (default 0)")
    parser.add_argument("--loss-rtol", type=positive_float,
                        help="first-step loss agreement with eager, relative (default: the dtype's loss_rtol in "
                             "twinkle_fx.core.tolerances, 1e-2 bf16/fp16, 1e-5 fp32)")
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="profile a few more steps of each backend: DIR/<backend>/profile_trace.json (Chrome "
                             "trace) and profile_report.txt (top kernels, host vs device time, launches per "
                             "step; on a GPU the device time by kernel class and the time no kernel runs); with "
                             "--matrix, DIR/<model>/<backend>/")
    parser.add_argument("--repeat-first", action="store_true",
                        help="run the first backend once more after the others (a row '<name> again'): how much "
                             "the same code's time moved during the run (clocks, heat), next to the rows compared")
    parser.add_argument("--inference", action="store_true",
                        help="prefill latency and decode tokens/s (no grad) instead of the training step; backends "
                             f"default {_INFERENCE_BACKENDS}")
    parser.add_argument("--prefill", type=positive_int, help="--inference: prompt tokens, batch 1 (default 2048; --tiny 32)")
    parser.add_argument("--decode-batch", type=positive_int, help="--inference: sequences per decode step (default 32; --tiny 2)")
    parser.add_argument("--context", type=positive_int, help="--inference: tokens in the static KV cache (default 1024; "
                                                    "--tiny 16)")
    parser.add_argument("--twinkle-options", metavar="JSON",
                        help='--inference: options= of the twinkle rows, e.g. \'{"fuse_projections": true}\'')
    parser.add_argument("--matrix", action="store_true",
                        help="the training step of several models (--models) under the recipes a user chooses "
                             f"between, one table; default backends {','.join(_matrix_backends(False))} (--tiny: "
                             f"{','.join(_matrix_backends(True))}); the first is each model's reference")
    parser.add_argument("--models", type=comma_list,
                        help=f"--matrix: comma-separated workloads (default {','.join(names.MATRIX_MODELS)})")
    parser.add_argument("--plot", type=Path, metavar="JSON",
                        help="print the table and write the PNG of a saved result (next to it, or in --out)")
    parser.set_defaults(run=run)
    return parser


def _matrix_backends(tiny: bool) -> tuple[str, ...]:
    return names.TINY_MATRIX_BACKENDS if tiny else names.MATRIX_BACKENDS


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _load_saved(path: Path):
    from ..bench.results import BenchResult

    try:
        return BenchResult.load(path)
    except (ValueError, KeyError, TypeError) as e:  # JSONDecodeError is a ValueError
        raise CommandError(f"--plot {path}: not a twinkle-fx bench result ({type(e).__name__}: {e})") from None


def _default(args: argparse.Namespace, name: str, table: dict) -> object:
    value = getattr(args, name)
    return table[name][1 if args.tiny else 0] if value is None else value


def _check_arguments(args: argparse.Namespace) -> None:
    """Every argument against what it may be, before anything heavy is imported (seconds)."""
    if args.plot is not None:
        if not args.plot.is_file():
            raise CommandError(f"--plot {args.plot}: no such file (a JSON written by `twinkle-fx bench --out DIR`)")
        check_output("--out", args.out, directory=True)
        return
    if sum((args.micro, args.inference, args.matrix)) > 1:
        raise CommandError("--micro (the kernels), --inference (prefill and decode) and --matrix (training across "
                           "models) are three benchmarks; give one")
    if args.models is not None and not args.matrix:
        raise CommandError("--models lists the models of --matrix; add --matrix or use --model")
    if args.micro and args.profile is not None:
        raise CommandError("--profile profiles the model benchmark's backends; leave out --micro (or profile one "
                           "kernel with torch.profiler, see README 'For kernel authors')")
    if args.repeat_first and (args.micro or args.inference):
        raise CommandError("--repeat-first repeats the first backend of the training benchmark (or --matrix); leave "
                           "it out of --micro and --inference")
    if args.ops is not None and not args.micro:
        raise CommandError("--ops chooses the kernels of --micro; add --micro or leave it out")
    check_output("--out", args.out, directory=True)
    check_output("--profile", args.profile, directory=True)
    if args.micro:
        check_names("--ops", args.ops or (), names.MICRO_OPS + names.MICRO_CASE_NAMES, "op")
        check_names("--backends", args.backends or (), names.MICRO_IMPLS, "backend")
        return
    check_names("--model", [args.model], names.WORKLOADS, "model")
    check_names("--models", args.models or (), names.WORKLOADS, "model")
    if args.inference:
        check_names("--backends", args.backends or (), names.INFERENCE_BACKENDS, "backend")
    elif unknown := [name for name in args.backends or () if not names.is_model_backend(name)]:
        raise CommandError(f"--backends: unknown backend(s) {', '.join(map(repr, unknown))}; valid: "
                           f"{', '.join(names.MODEL_BACKENDS)}, and a twinkle backend followed by -<graph rewrite>\n"
                           f"(twinkle+cudagraphs-embedding_grad: that backend without the rewrite; twinkle backends: "
                           f"{', '.join(names.TWINKLE_BACKENDS)}; rewrites: {', '.join(names.GRAPH_REWRITES)})")
    if args.twinkle_options is not None:
        if not args.inference:
            raise CommandError("--twinkle-options sets the twinkle rows of --inference; add --inference or leave it out")
        try:
            options = json.loads(args.twinkle_options)
        except json.JSONDecodeError as e:
            raise CommandError(f"--twinkle-options is not JSON: {e}") from None
        if not isinstance(options, dict):
            raise CommandError(f"--twinkle-options must be a JSON object ({{\"name\": value, ...}}), got "
                               f"{args.twinkle_options}")


def run(args: argparse.Namespace) -> int:
    """Run ``twinkle-fx bench`` with parsed ``args``; returns the exit status."""
    _check_arguments(args)
    if args.plot is not None:
        from ..bench.report import format_table, plot

        result = _load_saved(args.plot)
        print(format_table(result))
        png = (args.out or args.plot.parent) / (args.plot.stem + ".png")
        png.parent.mkdir(parents=True, exist_ok=True)
        print(f"\nwrote {png}" if plot(result, png) else "\nmatplotlib is not installed: no PNG")
        return 0

    quiet_profiler()
    what = ("kernel microbenchmarks (LLM-size tensors)" if args.micro else
            "the training step of several models (full size)" if args.matrix else
            f"{args.model} {'inference' if args.inference else 'training step'} (full size)")
    device = choose_device(args.device, default_cpu=args.tiny, command="twinkle-fx bench",
                           full_size=None if args.tiny else what, force=args.force)
    import torch

    from ..bench.report import format_table, write_outputs

    if args.tiny:
        # tiny ops gain nothing from intra-op threads, and on a busy 2-core machine their OpenMP
        # barriers made an eager step 300x slower (2 ms -> 700 ms) while another process compiled
        torch.set_num_threads(1)
    if args.inference:
        return _run_inference(args, device)
    if args.matrix:
        return _run_matrix(args, device)
    if args.micro:
        from ..bench.micro import MicroBenchOptions, run_micro_bench

        options = MicroBenchOptions(
            impls=args.backends or _MICRO_BACKENDS.split(","),
            dtype=getattr(torch, _DTYPES[_default(args, "dtype", _MICRO_DEFAULTS)]),
            reps=_default(args, "steps", _MICRO_DEFAULTS), warmup=_default(args, "warmup", _MICRO_DEFAULTS),
            device=device, tiny=args.tiny, seed=args.seed, ops=args.ops or [],
        )
        result, stem = run_micro_bench(options, progress=_progress), "bench-micro"
    else:
        from ..bench.model_bench import ModelBenchOptions, run_model_bench

        options = ModelBenchOptions(
            model=args.model,
            backends=args.backends or (_TINY_MODEL_BACKENDS if args.tiny else _MODEL_BACKENDS).split(","),
            batch=_default(args, "batch", _MODEL_DEFAULTS), seq=_default(args, "seq", _MODEL_DEFAULTS),
            dtype=getattr(torch, _DTYPES[_default(args, "dtype", _MODEL_DEFAULTS)]),
            steps=_default(args, "steps", _MODEL_DEFAULTS), warmup=_default(args, "warmup", _MODEL_DEFAULTS),
            device=device, tiny=args.tiny, seed=args.seed, loss_rtol=args.loss_rtol, profile_dir=args.profile,
            repeat_first=args.repeat_first,
        )
        result, stem = run_model_bench(options, progress=_progress, step_progress=StepProgress), f"bench-{args.model}"

    print()
    print(format_table(result))
    if args.out is not None:
        written = write_outputs(result, args.out, stem)
        print("\nwrote " + ", ".join(map(str, written)))
        if len(written) == 1:
            print("matplotlib is not installed: no PNG (render it elsewhere with `twinkle-fx bench --plot JSON`)")
    return 1 if any(row.status in ("failed", "wrong") for row in result.rows) else 0


def _run_inference(args: argparse.Namespace, device) -> int:
    import torch

    from ..bench.inference import InferenceBenchOptions, run_inference_bench
    from ..bench.report import format_table

    options = InferenceBenchOptions(
        model=args.model, backends=args.backends or _INFERENCE_BACKENDS.split(","),
        prefill=_default(args, "prefill", _INFERENCE_DEFAULTS),
        decode_batch=_default(args, "decode_batch", _INFERENCE_DEFAULTS),
        context=_default(args, "context", _INFERENCE_DEFAULTS),
        dtype=getattr(torch, _DTYPES[_default(args, "dtype", _MODEL_DEFAULTS)]),
        steps=_default(args, "steps", _INFERENCE_DEFAULTS), warmup=_default(args, "warmup", _INFERENCE_DEFAULTS),
        device=device, tiny=args.tiny, seed=args.seed,
        options=None if args.twinkle_options is None else json.loads(args.twinkle_options),
    )
    result = run_inference_bench(options, progress=_progress)
    print()
    print(format_table(result))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"bench-inference-{args.model}.json"
        result.save(path)
        print(f"\nwrote {path}")
    return 1 if any(row.status in ("failed", "wrong") for row in result.rows) else 0


def _run_matrix(args: argparse.Namespace, device) -> int:
    import torch

    from ..bench.matrix import format_matrix, matrix_failed, run_matrix
    from ..bench.model_bench import ModelBenchOptions

    options = ModelBenchOptions(
        model="", backends=args.backends or list(_matrix_backends(args.tiny)),
        batch=_default(args, "batch", _MODEL_DEFAULTS), seq=_default(args, "seq", _MODEL_DEFAULTS),
        dtype=getattr(torch, _DTYPES[_default(args, "dtype", _MODEL_DEFAULTS)]),
        steps=_default(args, "steps", _MODEL_DEFAULTS), warmup=_default(args, "warmup", _MODEL_DEFAULTS),
        device=device, tiny=args.tiny, seed=args.seed, loss_rtol=args.loss_rtol, profile_dir=args.profile,
        repeat_first=args.repeat_first,
    )
    matrix = run_matrix(tuple(args.models or names.MATRIX_MODELS), options, progress=_progress)
    print()
    print(format_matrix(matrix))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / "bench-matrix.json"
        path.write_text(json.dumps(matrix, indent=1))
        print(f"\nwrote {path}")
    return 1 if matrix_failed(matrix) else 0
