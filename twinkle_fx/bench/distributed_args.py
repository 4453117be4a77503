"""The command line of :mod:`twinkle_fx.bench.distributed`: its flags, and the combinations it refuses
before anything is built (each with the reason, one line)."""

from __future__ import annotations

import argparse
import os

from ..core.outputs import check_output_path
from .distributed_models import DEFAULT_SHAPE, MODELS, SIZES
from .distributed_results import COMPILED

__all__ = ["BACKENDS", "parse_args"]

BACKENDS = ("eager", "inductor", "twinkle", "kernelize", "kernelize+twinkle")


def _reshard_after_forward(value: str) -> bool | int | str:
    """``--reshard-after-forward``: ``true``, ``false``, ``inner`` or a group size (an int of 2 or more)."""
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    if value.lower() == "inner":
        return "inner"
    try:
        size = int(value)
    except ValueError:
        size = 0
    if size < 2:
        raise argparse.ArgumentTypeError(f"takes true, false, inner or a group size of 2 or more ranks, not {value!r}")
    return size


def _positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"takes a whole number of 1 or more, not {value!r}")
    return number


def parse_args(argv: list[str] | None = None, description: str | None = None) -> argparse.Namespace:
    """The command line of :mod:`twinkle_fx.bench.distributed`, every flag checked against the others."""
    parser = argparse.ArgumentParser(prog="python -m twinkle_fx.bench.distributed", description=description)
    parser.add_argument("--model", choices=tuple(MODELS), default="qwen2",
                        help="qwen2: Qwen2ForCausalLM, reference size Qwen2-0.5B; llama3b: LlamaForCausalLM, "
                             "reference size Llama-3.2-3B")
    parser.add_argument("--size", choices=SIZES, default="tiny",
                        help="reference: the --model's own shape; tiny and small: the same architecture shrunk for "
                             "CPU processes and the Triton interpreter")
    parser.add_argument("--parallel", choices=("ddp", "fsdp2", "none"), default="ddp",
                        help="none: one process, no wrapper and no process group (the single-GPU baseline)")
    parser.add_argument("--backend", choices=BACKENDS, default="twinkle")
    parser.add_argument("--compiler", choices=("inductor", "aot_eager", "eager"), default="inductor",
                        help="inner compiler of the twinkle backends (default inductor)")
    parser.add_argument("--regional", action="store_true",
                        help="compile each decoder layer instead of the whole model (compiled backends)")
    parser.add_argument("--swap-policy", choices=("measured", "always"), default=None,
                        help="the twinkle backends' swap_policy option (default: twinkle_fx.compile's, \"measured\" "
                             "in training without --cudagraphs: Inductor's code kept where the per-op table measured "
                             "it faster; \"always\" with them)")
    parser.add_argument("--no-fused-loss", dest="fused_loss", action="store_false",
                        help="leave the LM head + loss unswapped (bind no fused-loss head)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=None, help="sequences per rank and micro-step (default: 4 for reference)")
    parser.add_argument("--seq", type=int, default=None, help="tokens per sequence (default: 1024 for reference)")
    parser.add_argument("--accum", type=int, default=1, help="gradient accumulation: micro-steps per optimizer step")
    parser.add_argument("--dtype", choices=("bf16", "fp32"), default=None,
                        help="parameter dtype (default: bf16 on GPU, fp32 on CPU; fp32 with --mixed-precision)")
    parser.add_argument("--mixed-precision", action="store_true",
                        help="FSDP2 MixedPrecisionPolicy: fp32 master weights, bf16 compute, fp32 gradient reduction")
    parser.add_argument("--reshard-after-forward", type=_reshard_after_forward, default=True,
                        metavar="true|false|inner|N",
                        help="FSDP2 fully_shard(reshard_after_forward=...) of every decoder-layer unit: true (the "
                             "default) frees each unit's gathered parameters after its forward and gathers them "
                             "again for its backward; false keeps them from forward to backward (no second "
                             "all-gather per unit, at the cost of holding them: ZeRO-2's memory, not ZeRO-3's); "
                             "inner: true for every unit but the last, whose backward starts right after its "
                             "forward (torchtitan's default); N keeps them sharded over groups of N ranks in "
                             "between (N divides the shard group, 1 < N < shard group), so the backward's "
                             "all-gather stays within the group")
    parser.add_argument("--layers-per-unit", type=_positive, default=1, metavar="N",
                        help="FSDP2: N consecutive decoder layers per fully_shard unit (fully_shard([layers...])), "
                             "so one all-gather and one reduce-scatter move N layers' parameters; 1 (the default) "
                             "shards every layer on its own. Larger units mean fewer, larger collectives and more "
                             "gathered parameters held at once")
    parser.add_argument("--reduce-dtype", choices=("fp32", "bf16"), default=None,
                        help="FSDP2 MixedPrecisionPolicy(reduce_dtype=...): the dtype gradients are reduce-scattered "
                             "(and, with --replicate, all-reduced) in; fp32 sums bf16 gradients in fp32 (rounded to "
                             "bf16 once, not at every hop of the ring) at twice the bytes. Default: the gradients' own dtype (fp32 with "
                             "--mixed-precision)")
    parser.add_argument("--replicate", type=_positive, default=1, metavar="N",
                        help="FSDP2 on a 2-D device mesh (HSDP): N replicas, each sharding the model over world/N "
                             "ranks; gradients are reduce-scattered within a replica and all-reduced across "
                             "replicas. On several hosts N is the number of hosts, so the shards of a replica "
                             "stay on one host's fast links. 1 (the default): one 1-D mesh over all ranks")
    parser.add_argument("--no-reshard-after-forward", dest="reshard_after_forward", action="store_const", const=False,
                        help="the same as --reshard-after-forward false")
    parser.add_argument("--prefetch", type=int, default=0, metavar="N",
                        help="FSDP2: each decoder-layer unit starts the all-gathers of the next N units in its "
                             "forward (set_modules_to_forward_prefetch) and of the N before it in its backward "
                             "(set_modules_to_backward_prefetch); 0 (the default) leaves FSDP2's own order: "
                             "forward all-gathers issued as each unit starts, one unit ahead in backward")
    parser.add_argument("--sm-carveout", type=_positive, default=None, metavar="N",
                        help="cuBLAS GEMMs target N fewer SMs than the GPU has (torch's experimental SM carveout; "
                             "torch 2.11 applies it on the cuBLASLt path, TORCH_BLAS_PREFER_CUBLASLT=1), leaving them "
                             "to the collectives' kernels beside them: a GEMM sized for every SM waits for the ones "
                             "NCCL holds. Pair it with --nccl-ctas N")
    parser.add_argument("--nccl-ctas", type=_positive, default=None, metavar="N",
                        help="NCCL runs each collective on at most N CTAs (SMs), NCCL_MAX_CTAS; default: NCCL's own "
                             "choice for the topology")
    parser.add_argument("--collectives", choices=("nccl", "copy-engine"), default="nccl",
                        help="FSDP2's all-gathers and reduce-scatters: nccl (FSDP2's own, NCCL's kernels on SMs) or "
                             "copy-engine (twinkle_fx.distributed.use_copy_engine_collectives: the GPUs' copy engines "
                             "read each other's buffers over NVLink and only the gradient sum runs on SMs, so the "
                             "GEMMs beside them keep every SM; one host's GPUs, CUDA)")
    parser.add_argument("--checkpoint", action="store_true", help="activation checkpointing of every decoder layer")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--fused-adamw", action="store_true",
                        help="AdamW(fused=True): one fused kernel set for the whole step instead of torch's "
                             "default multi-tensor one (the optimizer step is 19.5 ms of an FSDP2 step on DTensors); "
                             "under FSDP2 it updates each rank's shards (DTensors) in place")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bucket-cap-mb", type=float, default=None,
                        help="DDP bucket size; small values give several buckets, so DDPOptimizer splits the graph")
    parser.add_argument("--ddp-static-graph", action="store_true",
                        help="DDP(static_graph=True): the same parameters get gradients every step, so DDP can fix "
                             "its bucket order after the first step and skip its per-step search for unused ones")
    parser.add_argument("--grad-as-bucket-view", action="store_true",
                        help="DDP(gradient_as_bucket_view=True): .grad tensors are views of the all-reduce buckets "
                             "(no copy of the gradients into them, one copy less of 1 GB per step for the reference)")
    parser.add_argument("--ddp-comm-hook", choices=("none", "allreduce"), default="none",
                        help="allreduce: DDP's built-in C++ all-reduce hook, which divides each bucket once before "
                             "reducing it; without a hook DDP's reducer divides every gradient on its own (one "
                             "kernel launch per parameter, 291 for the reference, every step)")
    parser.add_argument("--no-broadcast-buffers", dest="broadcast_buffers", action="store_false",
                        help="DDP(broadcast_buffers=False): rank 0's buffers are not broadcast before every "
                             "forward (Qwen2's only buffer is the rotary inv_freq, a constant)")
    parser.add_argument("--persistent-grads", action="store_true",
                        help="with --cudagraphs and one device: keep a zeroed .grad buffer per parameter even "
                             "when the backward could hand its gradients over (no accumulation, no DDP)")
    parser.add_argument("--tied-embedding-ddp", action="store_true",
                        help="wrap with twinkle_fx.distributed.tied_embedding_ddp: the tied embedding / LM-head "
                             "weight (272 MB in bf16 for the reference) leaves DDP's buckets; the head's gradient "
                             "is all-reduced while the layers run backward, the embedding's as rows at the end")
    parser.add_argument("--optimize-ddp", choices=("ddp_optimizer", "no_optimization", "python_reducer"), default=None,
                        help="compiled DDP: split the graph at bucket boundaries (torch's default; with --regional "
                             "no_optimization is), compile it whole, or reduce in compiled autograd (python_reducer, "
                             "the default with --compiled-autograd)")
    parser.add_argument("--compiled-autograd", action="store_true",
                        help="capture the backward with compiled autograd (torch._dynamo.config.compiled_autograd)")
    parser.add_argument("--compare-single", type=int, default=None, metavar="WORLD",
                        help="with --parallel none: run twice, with --batch (the speed baseline of a WORLD-GPU run) "
                             "and with WORLD x --batch (its global batch: the loss baseline)")
    parser.add_argument("--baseline", action="append", default=[],
                        help="a --parallel none --out file (--compare-single writes both baselines): the table "
                             "compares with its runs; may be given more than once")
    parser.add_argument("--report", action="store_true", help="every rank prints its twinkle compile report, once")
    parser.add_argument("--out", default=None, help="rank 0 writes the runs and tables here (JSON)")
    parser.add_argument("--cudagraphs", action="store_true",
                        help="replay the compiled graphs (whole model or each layer) as CUDA graphs "
                             "(mode='reduce-overhead'); the table says how many were recorded and re-recorded")
    parser.add_argument("--profile", default=None, metavar="DIR",
                        help="after the timed steps, 3 more under torch.profiler on every rank: DIR/rank<r>/"
                             "profile_trace.json and profile_report.txt (rank 0's report is printed)")
    args = parser.parse_args(argv)
    batch, seq = DEFAULT_SHAPE[args.size]
    args.batch = batch if args.batch is None else args.batch
    args.seq = seq if args.seq is None else args.seq
    compiled = args.backend in COMPILED
    if args.regional and not compiled:
        parser.error(f"--regional compiles decoder layers: it needs a compiled --backend ({', '.join(COMPILED)}), "
                     f"not {args.backend}")
    if args.swap_policy is not None and not args.backend.endswith("twinkle"):
        parser.error(f"--swap-policy is the twinkle backend's option: use it with --backend twinkle or "
                     f"kernelize+twinkle, not {args.backend}")
    if args.mixed_precision and args.parallel != "fsdp2":
        parser.error("--mixed-precision is FSDP2's MixedPrecisionPolicy: use it with --parallel fsdp2 "
                     "(DDP and none train in --dtype)")
    fsdp_only = (args.reshard_after_forward is not True or args.prefetch or args.layers_per_unit != 1
                 or args.reduce_dtype or args.replicate != 1 or args.collectives != "nccl")
    if fsdp_only and args.parallel != "fsdp2":
        parser.error("--reshard-after-forward, --no-reshard-after-forward, --prefetch, --layers-per-unit, "
                     "--reduce-dtype, --replicate and --collectives are FSDP2 options: use them with --parallel fsdp2")
    layers = MODELS[args.model].sizes[args.size]["num_hidden_layers"]
    if args.layers_per_unit > layers:
        parser.error(f"--layers-per-unit {args.layers_per_unit}: --model {args.model} --size {args.size} has "
                     f"{layers} decoder layers; give 1 to {layers}")
    if args.prefetch < 0:
        parser.error(f"--prefetch must be 0 or more layers, got {args.prefetch}")
    if args.mixed_precision and args.dtype == "bf16":
        parser.error("--mixed-precision keeps fp32 master weights: leave --dtype out (or fp32)")
    if args.compiled_autograd:
        if not compiled or args.parallel == "fsdp2":
            parser.error("--compiled-autograd needs a compiled --backend and --parallel ddp or none")
        if args.optimize_ddp in ("ddp_optimizer", "no_optimization"):
            parser.error(f"--compiled-autograd works with --optimize-ddp python_reducer, not {args.optimize_ddp} "
                         "(torch._dynamo.config.optimize_ddp says so)")
        args.optimize_ddp = args.optimize_ddp or "python_reducer"
    elif args.optimize_ddp == "python_reducer":
        parser.error("--optimize-ddp python_reducer needs --compiled-autograd")
    # --regional: a layer's graph is not worth splitting at bucket boundaries (compile_layers keeps it whole
    # on its own; this keeps --backend inductor's layers whole too)
    args.optimize_ddp = args.optimize_ddp or ("no_optimization" if args.regional else "ddp_optimizer")
    if args.cudagraphs and (not compiled or args.compiler != "inductor"):
        parser.error("--cudagraphs needs a compiled --backend with --compiler inductor")
    if args.cudagraphs and args.parallel == "fsdp2" and args.backend == "inductor":
        parser.error("--backend inductor --cudagraphs under FSDP2: Inductor's CUDA graphs read every parameter at "
                     "the address they were recorded with, and FSDP2 gathers the parameters into new memory every "
                     "step, so the graphs are recorded again and again (measured on an H100, the Qwen2-0.5B shape, "
                     "regional: 192 to 240 graphs instead of 48, steps of 1.7 s while re-recording); use --backend "
                     "twinkle --cudagraphs (it copies FSDP2's parameters into the graphs at each replay) or leave "
                     "--cudagraphs out")
    if args.cudagraphs and args.parallel == "fsdp2" and args.accum > 1:
        parser.error("--cudagraphs with FSDP2 and --accum: between micro-steps FSDP2 keeps each unsharded "
                     "parameter's gradient, which is the backward graph's output, and the next replay overwrites it "
                     "(pytorch/pytorch#169545); leave one of them out")
    ddp_only = (args.ddp_static_graph or args.grad_as_bucket_view or args.tied_embedding_ddp
                or args.ddp_comm_hook != "none" or not args.broadcast_buffers)
    if ddp_only and args.parallel != "ddp":
        parser.error("--ddp-static-graph, --grad-as-bucket-view, --tied-embedding-ddp, --ddp-comm-hook and "
                     "--no-broadcast-buffers are DistributedDataParallel options: use them with --parallel ddp")
    if args.ddp_comm_hook != "none" and args.compiled_autograd:
        parser.error("--ddp-comm-hook with --compiled-autograd: DDP's Python reducer all-reduces each gradient in "
                     "its own hook and never runs the C++ reducer's built-in hook; leave one of them out")
    if args.persistent_grads and (not args.cudagraphs or args.parallel == "fsdp2"):
        parser.error("--persistent-grads is how --cudagraphs runs keep gradients: use it with --cudagraphs and "
                     "--parallel ddp or none (FSDP2's gradients are its reduce-scatter's output, not a graph's)")
    if args.ddp_static_graph and args.accum > 1:
        parser.error("--ddp-static-graph with --accum: DDP(static_graph=True) under no_sync() fails an internal "
                     "assert on its first backward, and past it stops all-reducing gradients "
                     "(https://github.com/pytorch/pytorch/issues/143580, fix pending in pytorch/pytorch#187732); "
                     "leave one of them out")
    if args.compare_single is not None and (args.parallel != "none" or args.compare_single < 2):
        parser.error("--compare-single WORLD (>= 2) runs the single-device baselines: use it with --parallel none")
    for name in ("steps", "batch", "seq", "accum"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    _check_files(parser, args)
    return args


def _check_files(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The files a run reads and writes, before it runs: rank 0 writes ``--out``, every rank its ``--profile``
    folder (``RANK`` is torchrun's; the other ranks may not see rank 0's disk)."""
    for path in args.baseline:
        if not os.path.isfile(path):
            parser.error(f"--baseline {path}: no such file; give the JSON a --parallel none run wrote with --out")
    try:
        if int(os.environ.get("RANK", "0")) == 0:
            check_output_path("--out", args.out, file_name="distributed.json")
        check_output_path("--profile", args.profile, directory=True)
    except ValueError as e:
        parser.error(str(e))
