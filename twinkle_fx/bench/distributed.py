"""The distributed training benchmark: a transformers causal LM trained with twinkle_fx kernels under DDP or
FSDP2, on N GPUs or CPU processes (``torchrun --nproc_per_node N -m twinkle_fx.bench.distributed ...``; one
process with ``python -m twinkle_fx.bench.distributed --parallel none ...``).

``--model`` picks the architecture (``qwen2``: Qwen2ForCausalLM; ``llama3b``: LlamaForCausalLM) and ``--size``
its shape: ``reference`` is the model's own (Qwen2-0.5B, Llama-3.2-3B), ``tiny`` and ``small`` shrink it for CPU
processes. Every rank builds the same model from the same seed, takes its own shard of the same global batch
(``--batch`` rows per rank and micro-step; the global batch depends only on ``--seed``, the
micro-step and ``batch x world size``), so the losses of a 2-process run equal those of a 1-process
run with twice the ``--batch``. At the end rank 0 prints ONE table for the run: global tokens/s and
ms/step (steps after the first two), the peak GPU memory of every rank, the loss of every step
(averaged over ranks and micro-steps) and what twinkle_fx swapped on each rank.

Backends: ``eager``; ``inductor`` (plain ``torch.compile``); ``twinkle`` (``twinkle_fx.compile``:
the fused-loss head installed on the model, everything else rewritten by ``backend="twinkle"``;
``--compiler`` picks its inner compiler); ``kernelize`` (``kernelize_model`` with the built-in
kernels, eager, the head included); ``kernelize+twinkle`` (both: the eager swaps, head included,
then ``backend="twinkle"`` compiles the rest). ``--no-fused-loss`` leaves the head unbound for all.
Whole-model compilation compiles the DDP- or FSDP2-wrapped model, so DDP's graph splitting at
bucket boundaries (Dynamo's DDPOptimizer, ``--optimize-ddp``) is part of what runs; ``--regional``
compiles each decoder layer instead (``twinkle_fx.compiler.compile_layers``: one small
graph all layers share, the head installed eagerly on the uncompiled root; ``--backend inductor
--regional``: ``torch.compile`` of each layer).

Options a training run needs: ``--mixed-precision`` (FSDP2's MixedPrecisionPolicy: fp32 master
weights, bf16 parameters in compute, fp32 gradient reduction), ``--checkpoint`` (activation
checkpointing of every decoder layer), ``--accum N`` (gradient accumulation: N micro-steps per
optimizer step, gradients synchronised on the last), ``--compiled-autograd`` (DDP: the backward
captured by compiled autograd, gradients reduced by DDP's Python reducer), ``--cudagraphs`` (the compiled
graphs replayed as CUDA graphs, ``mode="reduce-overhead"``: under DDP or with ``--accum`` each parameter
gets its own ``.grad`` buffer, zeroed in place, because a gradient that *is* a CUDA graph's output is
overwritten by the next replay, pytorch/pytorch#169545; a single-device step without accumulation takes
the graph's gradients as they are; under FSDP2 the twinkle backend copies the gathered parameters into the
graphs at each replay, since FSDP2 gathers them into new memory every step, ``--backend inductor`` is refused
(it would record the graphs again every step) and so is ``--accum``). FSDP2's own choices:
``--reshard-after-forward true|false|inner|N``, ``--prefetch N`` (explicit all-gather prefetching),
``--layers-per-unit N`` (decoder layers per ``fully_shard`` unit), ``--reduce-dtype fp32|bf16`` (the gradients'
collectives), ``--nccl-ctas N`` and ``--sm-carveout N`` (SMs for the collectives, SMs the GEMMs leave them),
``--replicate N`` (HSDP: a (replicate, shard) mesh of N replicas, one per host), ``--collectives copy-engine``
(the all-gathers and reduce-scatters as copy-engine transfers, ``twinkle_fx.distributed.use_copy_engine_collectives``),
``--fused-adamw``
(the fused optimizer on the shards). DDP's own costs: ``--ddp-comm-hook allreduce`` (one division per bucket
instead of one per gradient), ``--no-broadcast-buffers``, ``--ddp-static-graph``, ``--grad-as-bucket-view``.
``--profile DIR`` runs three more steps under torch.profiler on every rank and writes a Chrome trace and a
report (device vs wall time, top kernels, NCCL included) per rank; on GPUs the report and the table add the
rank's exposed communication (:mod:`twinkle_fx.measure.overlap`).

Run on GPUs (NCCL), the reference sizes:

    torchrun --nproc_per_node 2 -m twinkle_fx.bench.distributed --size reference --parallel ddp --backend twinkle \
        --regional
    torchrun --nproc_per_node 2 -m twinkle_fx.bench.distributed --model llama3b --size reference --parallel fsdp2 \
        --backend twinkle --regional --fused-adamw

The single-GPU baselines of a 2-GPU run (the same per-GPU batch for speed, the 2-GPU global batch
for the losses), then the 2-GPU run compared with them:

    python -m twinkle_fx.bench.distributed --size reference --parallel none --backend twinkle --compare-single 2 \
        --out single.json
    torchrun --nproc_per_node 2 -m twinkle_fx.bench.distributed --size reference --parallel ddp --backend twinkle \
        --baseline single.json --out ddp.json

HSDP on 2 hosts of 8 GPUs (the same command on each; HEAD: the first host's address):

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HEAD:29500 --rdzv-id run1 \
        -m twinkle_fx.bench.distributed --model llama3b --size reference --parallel fsdp2 --replicate 2 \
        --backend twinkle --regional --fused-adamw

Without a GPU (gloo on CPU, the Triton kernels through the interpreter), the tiny size (the default):

    torchrun --nproc_per_node 2 -m twinkle_fx.bench.distributed --model llama3b --size tiny --parallel fsdp2 \
        --backend twinkle --compiler aot_eager --regional
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import sys
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

# NVLink multicast (NVLS) stays off on the GPU machines; it must be set before NCCL initialises.
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from . import distributed_args  # noqa: E402
from .distributed_models import MODELS, build_model, global_batch  # noqa: E402
from .distributed_results import (  # noqa: E402
    RankSwaps, RunResult, describe_args, kernel_swaps_compiled, load_baseline, table,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (:func:`.distributed_args.parse_args`), described by this module's first paragraph."""
    return distributed_args.parse_args(argv, description=__doc__.split("\n\n")[0].replace("\n", " "))


def init_distributed(parallel: str = "ddp") -> tuple[int, int, torch.device]:
    """The process group from torchrun's environment: NCCL on this rank's GPU, else gloo on CPU.

    ``parallel="none"`` makes no process group: one process, on GPU ``LOCAL_RANK`` (0 without torchrun).
    """
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    if parallel == "none":
        if int(os.environ.get("WORLD_SIZE", 1)) != 1:
            raise SystemExit("--parallel none runs one process: launch it without torchrun or with --nproc_per_node 1")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        return 0, 1, device
    if any(name not in os.environ for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
        raise SystemExit(f"--parallel {parallel} runs one process per device: launch it with torchrun --nproc_per_node "
                         "N -m twinkle_fx.bench.distributed ..., or use --parallel none for one process")
    if device.type == "cuda":
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size(), device


def wrap(model: torch.nn.Module, args: argparse.Namespace, device: torch.device) -> torch.nn.Module:
    if args.parallel == "none":
        return model
    if args.parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        kwargs = {} if args.bucket_cap_mb is None else {"bucket_cap_mb": args.bucket_cap_mb}
        kwargs.update(static_graph=args.ddp_static_graph, gradient_as_bucket_view=args.grad_as_bucket_view,
                      broadcast_buffers=args.broadcast_buffers, device_ids=[device.index] if device.type == "cuda" else None)
        if args.tied_embedding_ddp:
            from twinkle_fx.distributed import tied_embedding_ddp

            ddp = tied_embedding_ddp(model, **kwargs)
        else:
            ddp = DDP(model, **kwargs)
        if args.ddp_comm_hook == "allreduce":  # before the first backward, as DDP requires
            ddp._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
        return ddp
    return shard_model(model, args, device)


def fsdp_units(model: torch.nn.Module, layers_per_unit: int) -> list[list[torch.nn.Module]]:
    """The decoder layers in ``fully_shard`` units of ``layers_per_unit`` consecutive layers (the last unit may be
    shorter)."""
    layers = list(model.model.layers)
    return [layers[i:i + layers_per_unit] for i in range(0, len(layers), layers_per_unit)]


def device_mesh(args: argparse.Namespace, device: torch.device):
    """FSDP2's mesh: None (``fully_shard``'s own 1-D mesh over the world) or, with ``--replicate N``, the 2-D
    (replicate, shard) mesh of HSDP. Ranks fill it row by row, so a shard group is world/N consecutive ranks:
    one host's processes under torchrun, whose ranks are numbered host by host."""
    if args.replicate == 1:
        return None
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    return init_device_mesh(device.type, (args.replicate, world // args.replicate),
                            mesh_dim_names=("replicate", "shard"))


def mixed_precision(args: argparse.Namespace):
    """``--mixed-precision`` and ``--reduce-dtype`` as FSDP2's MixedPrecisionPolicy (None: FSDP2's default, compute
    and reduce in the parameters' dtype)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    reduce = {"fp32": torch.float32, "bf16": torch.bfloat16, None: None}[args.reduce_dtype]
    if args.mixed_precision:
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=reduce or torch.float32)
    if reduce is not None:
        # the parameters stay in --dtype for compute; only the gradients are cast for their collectives
        return MixedPrecisionPolicy(reduce_dtype=reduce)
    return None


def shard_model(model: torch.nn.Module, args: argparse.Namespace, device: torch.device) -> torch.nn.Module:
    """FSDP2: a ``fully_shard`` unit per ``--layers-per-unit`` decoder layers, then the root (the tied embedding /
    LM head and the final norm), on ``--replicate``'s mesh, with ``--prefetch``'s explicit all-gather order."""
    from torch.distributed.fsdp import fully_shard

    kwargs = {}
    if (policy := mixed_precision(args)) is not None:
        kwargs["mp_policy"] = policy
    if (mesh := device_mesh(args, device)) is not None:
        kwargs["mesh"] = mesh
    units = fsdp_units(model, args.layers_per_unit)
    for index, unit in enumerate(units):
        reshard = args.reshard_after_forward
        if reshard == "inner":
            # the last unit's backward follows its forward at once: resharding it would only gather it again
            reshard = index < len(units) - 1
        fully_shard(unit if len(unit) > 1 else unit[0], reshard_after_forward=reshard, **kwargs)
    fully_shard(model, **kwargs)  # the root: FSDP2 keeps it gathered from forward to backward on its own
    if args.prefetch:
        # explicit prefetching: more all-gathers in flight (more gathered units held) for more overlap; a unit is
        # addressed through its first layer (every layer of a unit shares its FSDP state)
        heads = [unit[0] for unit in units]
        for i, head in enumerate(heads):
            head.set_modules_to_forward_prefetch(heads[i + 1:i + 1 + args.prefetch])
            head.set_modules_to_backward_prefetch(heads[max(0, i - args.prefetch):i][::-1])
    if getattr(args, "collectives", "nccl") == "copy-engine":
        from twinkle_fx.distributed import use_copy_engine_collectives

        try:
            use_copy_engine_collectives(model)
        except ValueError as e:
            raise SystemExit(f"error: --collectives copy-engine: {e}") from None
    return model


def check_world(args: argparse.Namespace, world: int) -> None:
    """What only the world size decides.

    Raises:
        ValueError: ``--replicate N`` where N does not split ``world`` into equal shard groups, or
            ``--reshard-after-forward N`` where N does not split a shard group into groups of N ranks.
    """
    replicas = getattr(args, "replicate", 1)
    if world % replicas:
        raise ValueError(f"--replicate {replicas}: HSDP needs the {world} processes in {replicas} equal shard groups; "
                         f"give a divisor of {world} (the number of hosts, each running the same --nproc-per-node)")
    shard = world // replicas
    n = args.reshard_after_forward
    if isinstance(n, int) and not isinstance(n, bool) and (shard % n or not 1 < n < shard):
        group = f"the world size {world}" if replicas == 1 else f"the shard group of {shard} (world {world} / --replicate {replicas})"
        raise ValueError(f"--reshard-after-forward {n}: FSDP2 reshards each layer to groups of {n} ranks after its "
                         f"forward, so {n} must divide {group} and lie between 2 and {shard - 1}"
                         + ("; on 2 ranks use true or false" if shard == 2 else ""))


def compile_model(model: torch.nn.Module, wrapped: torch.nn.Module, args: argparse.Namespace) -> torch.nn.Module:
    """``--backend`` / ``--regional``: what the training loop calls (``wrapped`` itself when regional or eager)."""
    import twinkle_fx
    from twinkle_fx.compiler import compile_layers

    options = {"compiler": args.compiler, **({"cudagraphs": True} if args.cudagraphs else {}),
               **({"swap_policy": args.swap_policy} if args.swap_policy else {})}
    inductor_mode = {"mode": "reduce-overhead"} if args.cudagraphs else {}
    if args.regional:
        # the layers are compiled in place (nn.Module.compile): the wrappers keep working on them
        if args.backend == "inductor":
            for layer in model.model.layers:
                layer.compile(**inductor_mode)
        else:  # twinkle: the head installed on the uncompiled root; kernelize+twinkle: kernelize did it
            compile_layers(model, layers=model.model.layers, options=options, fused_loss=args.fused_loss)
        return wrapped
    if args.backend == "inductor":
        return torch.compile(wrapped, **inductor_mode)
    if args.backend == "twinkle":
        # the head on the model (DDP's .module; FSDP2's root is the model), the rest by the backend
        return twinkle_fx.compile(wrapped, options=options, fused_loss=args.fused_loss)
    if args.backend == "kernelize+twinkle":
        return torch.compile(wrapped, backend="twinkle", options=options)
    return wrapped


def kernel_swaps_eager(model: torch.nn.Module) -> dict[str, int]:
    from twinkle_fx.function import patched_functions
    from twinkle_fx.core.swaps import swapped_forward

    swapped = Counter(
        f"kernelized {type(module).__name__} -> {forward.kernel_name}"
        for module in model.modules()
        if (forward := swapped_forward(module)) is not None
    )
    swapped.update(f"patched {name}" for name in patched_functions())
    return dict(swapped)


def _gather(value: Any, world: int) -> list[Any]:
    if not dist.is_initialized():
        return [value]
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, value)
    return everyone


def persistent_grads(args: argparse.Namespace) -> bool:
    """Whether ``--cudagraphs`` needs a ``.grad`` buffer per parameter, zeroed in place every step.

    A gradient that *is* a CUDA graph's output is overwritten by the graph's next replay
    (pytorch/pytorch#169545): with accumulation the next micro-step's backward would add into it, and
    DDP keeps ``.grad`` across steps (its bucket views). A single-device step without accumulation
    hands the gradients over (``zero_grad(set_to_none=True)``): the optimizer reads them before the next
    replay, and no add per parameter runs. FSDP2 needs no buffer: its post-backward copies each layer's
    gradients into the reduce-scatter input and drops them before the layer's graph replays again (with
    ``--accum`` it would keep them: parse_args refuses that).
    """
    return args.cudagraphs and (args.parallel == "ddp" or args.accum > 1 or args.persistent_grads)


def _skip_sync(wrapped: torch.nn.Module, model: torch.nn.Module, args: argparse.Namespace, sync: bool):
    """Gradient accumulation: no gradient reduction on the micro-steps before the last."""
    if args.parallel == "ddp" and not sync:
        return wrapped.no_sync()  # an OptimizedModule passes the attribute to the DDP module
    if args.parallel == "fsdp2":
        model.set_requires_gradient_sync(sync)
    return contextlib.nullcontext()


def train(args: argparse.Namespace, rank: int, world: int, device: torch.device) -> RunResult:
    """Build, wrap, prepare (``--backend``), train ``--steps`` steps; the process group must exist
    (unless ``--parallel none``).

    Registrations are private to the call and the eager swaps are undone at the end, so a process
    can run several configurations one after another.
    """
    import twinkle_fx
    from twinkle_fx.builtin import use_builtin_kernels
    from twinkle_fx.compiler import collect_reports
    from twinkle_fx.compiler.inner.inductor_options import cudagraph_tree_summary
    from twinkle_fx.core.torch_internals import dynamo_config_patch, foreach_zero

    default = "fp32" if args.mixed_precision or device.type != "cuda" else "bf16"
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype or default]
    check_world(args, world)
    torch.compiler.reset()
    if device.type == "cuda":
        gc.collect()  # an earlier run's model, optimizer and graphs (reference cycles) go before the peak is reset
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    patches = dict(optimize_ddp=args.optimize_ddp, compiled_autograd=args.compiled_autograd)
    with dynamo_config_patch(patches), twinkle_fx.scoped_registry(), collect_reports() as report:
        kernelize = args.backend.startswith("kernelize")
        if args.backend not in ("eager", "inductor"):
            use_builtin_kernels(devices=(device.type,), models=(MODELS[args.model].family,), fused_loss=args.fused_loss)
        model = build_model(args.model, args.size, dtype, device, args.seed)
        if args.checkpoint:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if kernelize:
            mode = "train+compile" if args.backend.endswith("twinkle") else "train"
            twinkle_fx.kernelize_model(model, mode=mode, device=device.type)
        if args.regional:  # layers compiled before fully_shard / DDP wrap them (the modules stay)
            compile_model(model, model, args)
            wrapped = run = wrap(model, args, device)
        else:
            wrapped = wrap(model, args, device)
            run = compile_model(model, wrapped, args)
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, **({"fused": True} if args.fused_adamw else {}))
        params = list(model.parameters())
        keep_grads = persistent_grads(args)
        if keep_grads:  # the backward adds into these buffers instead of handing over its output
            for p in params:
                p.grad = torch.zeros_like(p)
        losses, tokens_per_s, step_ms = [], [], []
        communication = None
        sharding = _sharding(model) if args.parallel == "fsdp2" else ""

        def one_step(micro: list[torch.Tensor]) -> torch.Tensor:
            total = torch.zeros((), device=device)
            for m, input_ids in enumerate(micro):
                with _skip_sync(wrapped, model, args, sync=m == args.accum - 1):
                    loss = run(input_ids=input_ids, labels=input_ids).loss
                    (loss / args.accum).backward()
                total += loss.detach().float()
            optimizer.step()
            if keep_grads:  # one multi-tensor launch, not one zero_() per parameter
                foreach_zero([p.grad for p in params if p.grad is not None])
            else:
                optimizer.zero_grad(set_to_none=True)
            if world > 1:
                dist.all_reduce(total)  # SUM: gloo has no AVG
            return total

        def batches(step: int) -> list[torch.Tensor]:
            return [global_batch(step * args.accum + m, args.batch * world, args.seq, model.config.vocab_size,
                                 args.seed)[rank * args.batch:(rank + 1) * args.batch].to(device)
                    for m in range(args.accum)]

        try:
            for step in range(args.steps):
                micro = batches(step)
                _sync(device)
                start = time.perf_counter()
                total = one_step(micro)
                _sync(device)
                elapsed = time.perf_counter() - start
                losses.append(total.item() / world / args.accum)
                step_ms.append(elapsed * 1e3)
                tokens_per_s.append(args.batch * world * args.seq * args.accum / elapsed)
                if rank == 0:
                    print(f"step {step:3d}  loss {losses[-1]:.6f}  {tokens_per_s[-1]:,.0f} tokens/s  "
                          f"({elapsed * 1e3:.1f} ms)", flush=True)
            if args.profile:
                # after the timed steps (the profiler's overhead never reaches them), every rank
                from twinkle_fx.bench.profile import profile_steps
                from twinkle_fx.measure.clock import DeviceClock

                micro = batches(args.steps)
                summary = profile_steps(lambda: one_step(micro), DeviceClock(device), Path(args.profile) / f"rank{rank}",
                                        steps=3, title=describe_args(args, world, device), communication=True)
                communication = summary.communication  # None on the CPU: gloo runs no kernels
                if rank == 0:
                    print(Path(summary.report).read_text(), flush=True)
            # recorded, never recorded, re-recorded (a parameter at a new address each step would re-record
            # every step): read before torch.compiler.reset() drops the trees
            graphs = cudagraph_tree_summary(device.index) if args.cudagraphs and device.type == "cuda" else ""
            mine = kernel_swaps_compiled(rank, report)
            for what, n in kernel_swaps_eager(model).items():  # kernelize, or the head on the root
                mine.swapped[what] = mine.swapped.get(what, 0) + n
            if args.report:
                # once per rank: one summary over all of this rank's graphs (DDP's pieces included)
                print(f"rank {rank} twinkle_fx report:\n{report.summary()}", flush=True)
        finally:
            twinkle_fx.undo_kernelize(model)  # function patches are process-wide; the head is an eager swap
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    everyone = _gather((asdict(mine), peak, graphs, communication), world)
    torch.compiler.reset()
    return RunResult(vars(args).copy(), world, str(device), losses, tokens_per_s,
                     [RankSwaps(**s) for s, _, _, _ in everyone], step_ms, [p for _, p, _, _ in everyone],
                     [g for _, _, g, _ in everyone if g], sharding,
                     [c for _, _, _, c in everyone] if any(c for *_, c in everyone) else [])


def _sharding(model: torch.nn.Module) -> str:
    """How fully_shard placed a decoder layer's parameters: ``(Replicate(), Shard(dim=0)) on mesh (replicate 2,
    shard 2)`` under HSDP, ``(Shard(dim=0),) on mesh (4)`` on a 1-D mesh."""
    param = next(model.model.layers[0].parameters())
    mesh = param.device_mesh
    names = mesh.mesh_dim_names or ("",) * mesh.ndim
    dims = ", ".join(f"{name} {size}".strip() for name, size in zip(names, mesh.shape))
    return f"{tuple(param.placements)} on mesh ({dims})"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _load_baseline(path: str) -> list[RunResult]:
    try:
        return load_baseline(path)
    except (OSError, ValueError, KeyError, TypeError) as e:  # JSONDecodeError is a ValueError
        raise SystemExit(f"error: --baseline {path}: not what a --parallel none --out run writes "
                         f"({type(e).__name__}: {str(e)[:80]})") from None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        from twinkle_fx.core.settings import use_triton_interpreter

        use_triton_interpreter(command="python -m twinkle_fx.bench.distributed")  # before the kernels are imported
    baseline = [run for path in args.baseline for run in _load_baseline(path)]
    if args.nccl_ctas:  # NCCL reads it when the process group makes its communicator
        os.environ["NCCL_MAX_CTAS"] = str(args.nccl_ctas)
    rank, world, device = init_distributed(args.parallel)
    if args.sm_carveout and device.type == "cuda":
        from twinkle_fx.core.torch_internals import set_gemm_sm_carveout

        set_gemm_sm_carveout(args.sm_carveout)
    try:
        try:
            check_world(args, world)
        except ValueError as e:
            raise SystemExit(f"error: {e}") from None
        configs = [args]
        if args.compare_single:
            configs.append(argparse.Namespace(**{**vars(args), "batch": args.batch * args.compare_single}))
        results = []
        for config in configs:
            if rank == 0:
                print(f"{config.parallel} x {world} on {device.type}, backend {config.backend}, model {config.model} "
                      f"size {config.size}, "
                      f"batch {config.batch} x {config.seq} per rank", flush=True)
            results.append(train(config, rank, world, device))
        if rank == 0:
            tables = [table(result, [*baseline, *results]) for result in results]
            print("\n\n".join(tables), flush=True)
            if args.out:
                from ..measure.environment import describe_environment

                with open(args.out, "w") as f:
                    json.dump({"environment": describe_environment(device), "runs": [r.to_json() for r in results],
                               "tables": tables}, f, indent=1)
        if dist.is_initialized():
            # the other ranks wait while rank 0 writes: a gloo rank that tears its connections down while a peer
            # still holds them aborts its process at exit ("terminate called without an active exception")
            dist.barrier()
    finally:
        if dist.is_initialized():
            # DDP modules left in reference cycles go first: a DDP reducer that dropped the group's last reference
            # would wait for gloo's worker threads while holding the GIL, which a worker may need (a hang at exit)
            gc.collect()
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
