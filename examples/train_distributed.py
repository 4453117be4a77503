"""Data-parallel training of a Qwen2ForCausalLM with twinkle_fx kernels: DDP or FSDP2, on N GPUs or CPU processes.

Every rank builds the same model from the same seed, takes its own shard of the same global batch
(``--batch`` rows per rank; the global batch depends only on ``--seed``, the step and
``batch x world size``), so the losses of a 2-process run equal those of a 1-process run with twice
the ``--batch``. Prints the loss of each step (averaged over ranks), global tokens/s, and at the end
what twinkle_fx swapped on each rank.

Backends: ``eager``; ``inductor`` (plain ``torch.compile``); ``twinkle`` (``torch.compile(model,
backend="twinkle")`` with the built-in kernels; ``--compiler`` picks its inner compiler);
``kernelize`` (``kernelize_model`` with the built-in kernels, eager); ``kernelize+twinkle`` (both: the
fused-loss head only comes from the eager swap, the compiled root module being no graph region).
The compiled backends compile
the DDP- or FSDP2-wrapped model, so DDP's graph splitting at bucket boundaries (Dynamo's
DDPOptimizer) is part of what runs.

Run on GPUs (NCCL), the reference size:

    torchrun --nproc_per_node 2 examples/train_distributed.py --size reference --parallel ddp --backend twinkle
    torchrun --nproc_per_node 2 examples/train_distributed.py --size reference --parallel fsdp2 --backend twinkle
    torchrun --nproc_per_node 1 examples/train_distributed.py --size reference --parallel ddp --backend twinkle --batch 8

Without a GPU (gloo on CPU, the Triton kernels through the interpreter), the tiny size (the default):

    torchrun --nproc_per_node 2 examples/train_distributed.py --size tiny --parallel ddp --backend kernelize
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

# NVLink multicast (NVLS) stays off on the GPU machines; it must be set before NCCL initialises.
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

if not torch.cuda.is_available():
    # No GPU: the Triton kernels run through the interpreter (must be set before triton.jit runs).
    os.environ.setdefault("TRITON_INTERPRET", "1")

SIZES: dict[str, dict[str, Any]] = {
    # small enough for the Triton interpreter on a 2-core CPU, big enough (4 MB in fp32) that DDP
    # buckets of 1 MB (the least DDPOptimizer accepts: its first bucket is 1 MB) split it in several
    "tiny": dict(hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=256),
    "small": dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=8192),
    # the reference workload of the benchmark harness (twinkle_fx/bench/workloads.py: "qwen2"): the Qwen2-0.5B shape
    "reference": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                      num_key_value_heads=2, vocab_size=151936),
}
# per-rank batch x sequence length when not given
DEFAULT_SHAPE = {"tiny": (1, 8), "small": (4, 256), "reference": (4, 1024)}


@dataclass
class RankSwaps:
    """What twinkle_fx swapped on one rank: compile-report regions or kernelized modules/functions."""

    rank: int
    graphs: int = 0
    graph_breaks: int = 0
    swapped: dict[str, int] = field(default_factory=dict)  # "layer Qwen2RMSNorm -> RMSNorm -> RMSNorm": count
    kept: dict[str, int] = field(default_factory=dict)  # "<target>: <reason>": count
    graphs_with_swaps: int = 0

    @property
    def total(self) -> int:
        return sum(self.swapped.values())

    def __str__(self) -> str:
        head = f"rank {self.rank}: {self.total} swap(s)"
        if self.graphs:
            head += (f"; {self.graphs} compiled graph(s), {self.graphs_with_swaps} with backend swaps,"
                     f" {self.graph_breaks} ended at a graph break")
        lines = [head, *(f"  {n} x {what}" for what, n in sorted(self.swapped.items()))]
        lines += [f"  kept {n} x {what}" for what, n in sorted(self.kept.items())]
        return "\n".join(lines)


@dataclass
class RunResult:
    """What rank 0 reports (``--json`` writes it)."""

    args: dict[str, Any]
    world_size: int
    device: str
    losses: list[float]
    tokens_per_s: list[float]
    swaps: list[RankSwaps]

    @property
    def steady_tokens_per_s(self) -> float:
        """Mean over steps after the first two (compilation, warm-up), or over all when fewer."""
        steady = self.tokens_per_s[2:] or self.tokens_per_s
        return sum(steady) / len(steady)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=tuple(SIZES), default="tiny")
    parser.add_argument("--parallel", choices=("ddp", "fsdp2"), default="ddp")
    parser.add_argument("--backend", choices=("eager", "inductor", "twinkle", "kernelize", "kernelize+twinkle"),
                        default="twinkle")
    parser.add_argument("--compiler", choices=("inductor", "aot_eager", "eager"), default="inductor",
                        help="inner compiler of --backend twinkle (default inductor)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=None, help="sequences per rank (default: 4 for reference)")
    parser.add_argument("--seq", type=int, default=None, help="tokens per sequence (default: 1024 for reference)")
    parser.add_argument("--dtype", choices=("bf16", "fp32"), default=None,
                        help="parameter dtype (default: bf16 on GPU, fp32 on CPU)")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bucket-cap-mb", type=float, default=None,
                        help="DDP bucket size; small values give several buckets, so DDPOptimizer splits the graph")
    parser.add_argument("--optimize-ddp", choices=("ddp_optimizer", "no_optimization"), default="ddp_optimizer",
                        help="compiled DDP: split the graph at bucket boundaries (torch's default) or compile it whole")
    parser.add_argument("--report", action="store_true", help="rank 0 prints the twinkle compile report of every graph")
    parser.add_argument("--json", default=None, help="rank 0 writes the result here")
    args = parser.parse_args(argv)
    batch, seq = DEFAULT_SHAPE[args.size]
    args.batch = args.batch or batch
    args.seq = args.seq or seq
    return args


def init_distributed() -> tuple[int, int, torch.device]:
    """The process group from torchrun's environment: NCCL on this rank's GPU, else gloo on CPU."""
    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size(), device


def build_model(size: str, dtype: torch.dtype, device: torch.device, seed: int) -> torch.nn.Module:
    """The same weights on every rank: built on CPU from ``seed``, then moved (``from_config(dtype=...)``
    keeps the rotary ``inv_freq`` fp32 as in real bf16 training)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**SIZES[size], tie_word_embeddings=True, max_position_embeddings=4096,
                         attn_implementation="sdpa", use_cache=False)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM._from_config(config, dtype=dtype)
    return model.to(device).train()


def global_batch(step: int, rows: int, seq: int, vocab: int, seed: int) -> torch.Tensor:
    """Step ``step``'s global batch (on CPU), learnable: each row counts up from a random start by a
    random stride in 1..7 (mod vocab), so the loss falls as the model picks the rule up."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    start = torch.randint(0, vocab, (rows, 1), generator=generator)
    stride = torch.randint(1, 8, (rows, 1), generator=generator)
    return (start + stride * torch.arange(seq)) % vocab


def wrap(model: torch.nn.Module, parallel: str, device: torch.device, bucket_cap_mb: float | None) -> torch.nn.Module:
    if parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        kwargs = {} if bucket_cap_mb is None else {"bucket_cap_mb": bucket_cap_mb}
        return DDP(model, device_ids=[device.index] if device.type == "cuda" else None, **kwargs)
    from torch.distributed.fsdp import fully_shard

    # one FSDP group per decoder layer, the root holds the (tied) embedding / LM head and final norm
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    return model


def kernel_swaps_eager(rank: int, model: torch.nn.Module) -> RankSwaps:
    from twinkle_fx.function import patched_functions
    from twinkle_fx.eager.layers import swapped_forward

    swapped = Counter(
        f"kernelized {type(module).__name__} -> {forward.kernel_name}"
        for module in model.modules()
        if (forward := swapped_forward(module)) is not None
    )
    swapped.update(f"patched {name}" for name in patched_functions())
    return RankSwaps(rank, swapped=dict(swapped))


def kernel_swaps_compiled(rank: int, report) -> RankSwaps:
    return RankSwaps(
        rank, graphs=report.graph_count, graph_breaks=report.graph_breaks,
        swapped=dict(Counter(f"{r.kind} {r.target}" for r in report.swapped)),
        kept=dict(Counter(f"{r.kind} {r.target}: {r.reason}" for r in report.not_swapped)),
        graphs_with_swaps=sum(any(r.swapped for r in g.regions) for g in report.graphs),
    )


def train(args: argparse.Namespace, rank: int, world: int, device: torch.device) -> RunResult:
    """Build, wrap, prepare (``--backend``), train ``--steps`` steps; the process group must exist.

    Registrations are private to the call and kernelize is undone at the end, so a process can run
    several configurations one after another.
    """
    import twinkle_fx
    from twinkle_fx.builtin import use_builtin_kernels
    from twinkle_fx.compile import collect_reports

    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype or ("bf16" if device.type == "cuda" else "fp32")]
    torch._dynamo.reset()
    with (torch._dynamo.config.patch(optimize_ddp=args.optimize_ddp), twinkle_fx.scoped_registry(),
          collect_reports() as report):
        kernelize = args.backend.startswith("kernelize")
        if args.backend != "eager" and args.backend != "inductor":
            use_builtin_kernels(devices=(device.type,), models=("qwen2",))
        model = build_model(args.size, dtype, device, args.seed)
        if kernelize:
            # kernelize+twinkle: the compiled root module is no graph region, so the fused-loss head
            # (CausalLMFusedLoss on *ForCausalLM) only comes from the eager swap
            mode = "train+compile" if args.backend.endswith("twinkle") else "train"
            twinkle_fx.kernelize_model(model, mode=mode, device=device.type)
        wrapped = wrap(model, args.parallel, device, args.bucket_cap_mb)
        if args.backend == "inductor":
            wrapped = torch.compile(wrapped)
        elif args.backend.endswith("twinkle"):
            wrapped = torch.compile(wrapped, backend="twinkle", options={"compiler": args.compiler})
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
        losses, tokens_per_s = [], []
        try:
            for step in range(args.steps):
                batch = global_batch(step, args.batch * world, args.seq, model.config.vocab_size, args.seed)
                input_ids = batch[rank * args.batch:(rank + 1) * args.batch].to(device)
                _sync(device)
                start = time.perf_counter()
                loss = wrapped(input_ids=input_ids, labels=input_ids).loss
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                mean_loss = loss.detach().float()
                dist.all_reduce(mean_loss)  # SUM: gloo has no AVG
                _sync(device)
                elapsed = time.perf_counter() - start
                losses.append(mean_loss.item() / world)
                tokens_per_s.append(args.batch * world * args.seq / elapsed)
                if rank == 0:
                    print(f"step {step:3d}  loss {losses[-1]:.6f}  {tokens_per_s[-1]:,.0f} tokens/s  "
                          f"({elapsed * 1e3:.1f} ms)", flush=True)
            if args.report and rank == 0 and args.backend.endswith("twinkle"):
                print(report.summary(), flush=True)
            mine = kernel_swaps_compiled(rank, report)
            if kernelize:
                mine.swapped.update(kernel_swaps_eager(rank, model).swapped)
        finally:
            if kernelize:
                twinkle_fx.undo_kernelize(model)  # function patches are process-wide
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, asdict(mine))
    torch._dynamo.reset()
    return RunResult(vars(args), world, str(device), losses, tokens_per_s, [RankSwaps(**s) for s in everyone])


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank, world, device = init_distributed()
    try:
        if rank == 0:
            print(f"{args.parallel} x {world} on {device.type}, backend {args.backend}"
                  f"{' (' + args.compiler + ')' if args.backend.endswith('twinkle') else ''}, size {args.size}, "
                  f"batch {args.batch} x {args.seq} per rank", flush=True)
        result = train(args, rank, world, device)
        if rank == 0:
            print(f"tokens/s (global, mean of steps 2+): {result.steady_tokens_per_s:,.0f}")
            print("twinkle_fx swaps per rank:")
            for swaps in result.swaps:
                print(swaps)
            if args.json:
                payload = {**asdict(result), "steady_tokens_per_s": result.steady_tokens_per_s}
                with open(args.json, "w") as f:
                    json.dump(payload, f, indent=1)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
