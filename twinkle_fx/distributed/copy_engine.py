"""FSDP2's all-gathers and reduce-scatters as copy-engine transfers, which leave every SM to the GEMMs.

NCCL moves FSDP2's bytes with kernels: on a pair of H200s each all-gather and reduce-scatter holds 24 SMs while
it runs, and the GEMMs beside it, cuBLAS's persistent kernels sized for every SM, wait for them (1.5x their time
alone in a profiled Llama-3.2-3B step, ``docs/performance.md``). Within one host a GPU can read the others'
memory over NVLink with its copy engines, the DMA units behind ``cudaMemcpy``, which run beside kernels without
an SM. :func:`use_copy_engine_collectives` gives every FSDP2 unit of a model communication buffers in symmetric
memory (``torch.distributed._symmetric_memory``: each rank's buffer mapped into every other rank's address
space) and replaces its collectives:

- all-gather: FSDP2 copies this rank's shards into its slice of the output; each rank then pulls every other
  rank's slice straight into its own output, one copy per peer;
- reduce-scatter: each rank pulls its chunk of every other rank's gradients into a staging buffer, one copy per
  peer, and sums or averages them with its own chunk in one pointwise kernel, the only SM work.

Each collective runs on the stream FSDP2 gives it, between two barriers on its buffer (a one-block kernel each):
the first says every rank's input is in place, the second that every peer has read it, so FSDP2 may reuse the
buffer. The copies pull rather than push, so a rank only ever writes its own memory.

Copy engines reach only the GPUs of one host: with several hosts, shard within each host and replicate across
hosts (HSDP), and the replicas' all-reduce stays NCCL's.
"""

from __future__ import annotations

import functools
import logging
import socket
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..core.torch_internals import fsdp_comm_bases, fsdp_unit, symmetric_memory

logger = logging.getLogger(__name__)

__all__ = ["gather_shards", "reduce_chunks", "use_copy_engine_collectives"]

# (peer rank, numel, element offset) -> that many elements of the peer's buffer from that offset, readable here
PeerBuffer = Callable[[int, int, int], torch.Tensor]


def gather_shards(output: torch.Tensor, rank: int, world: int, peer_buffer: PeerBuffer) -> None:
    """The all-gather's transfers: ``output`` (world x n elements, flat) holds this rank's shard in its own slice;
    every other rank's slice is pulled from that rank's buffer. Ranks start with different peers, so no rank's
    links are read by every other rank at once."""
    n = output.numel() // world
    for step in range(1, world):
        peer = (rank + step) % world
        output[peer * n:(peer + 1) * n].copy_(peer_buffer(peer, n, peer * n))


def reduce_chunks(output: torch.Tensor, input: torch.Tensor, rank: int, world: int, peer_buffer: PeerBuffer,
                  *, average: bool) -> None:
    """The reduce-scatter's transfers and sum: ``input`` (world x n elements, flat) is this rank's gradients,
    chunk ``p`` for rank ``p``; ``output`` (n) gets the sum (``average``: the mean) of chunk ``rank`` over all
    ranks. The peers' chunks are pulled into a staging buffer, then reduced with this rank's own in one kernel
    that computes in fp32 and rounds once (as NCCL's sum of two bf16 values does)."""
    n = output.numel()
    own = input[rank * n:(rank + 1) * n]
    if world == 2:  # one pointwise kernel on the two chunks: 3n elements of traffic
        staged = torch.empty_like(output)
        staged.copy_(peer_buffer(1 - rank, n, rank * n))
        if average and own.element_size() == 2:
            # bf16 / fp16: own + (peer - own) / 2 computed in fp32, where it is exact, and rounded once
            torch.lerp(own, staged, 0.5, out=output)
        else:
            torch.add(own, staged, out=output)
            if average:  # fp32: a lerp would round peer - own; halving the rounded sum is exact
                output.mul_(0.5)
        return
    staged = torch.empty((world, n), dtype=input.dtype, device=input.device)
    staged[rank].copy_(own)
    for step in range(1, world):
        peer = (rank + step) % world
        staged[peer].copy_(peer_buffer(peer, n, rank * n))
    if average:
        torch.mean(staged, dim=0, out=output)
    else:
        torch.sum(staged, dim=0, out=output)


class _SymmetricBuffers:
    """Communication buffers in symmetric memory: torch's pool for it keeps one allocation per buffer (no
    splitting) and caches each rank's mapping of the others' (the rendezvous) per allocation, so FSDP2 allocating
    and freeing its buffers every step exchanges handles only when the pool grows."""

    def allocate(self, size: Sequence[int | torch.SymInt], *, dtype: torch.dtype,
                 device: torch.device) -> torch.Tensor:
        with torch.cuda.use_mem_pool(symmetric_memory().get_mem_pool(device)):
            return torch.empty(*size, dtype=dtype, device=device)

    @staticmethod
    def _handle(buffer: torch.Tensor, group: dist.ProcessGroup) -> Any:
        if buffer.storage_offset():
            raise ValueError("a copy-engine collective needs the buffer its allocate() returned, not a view into it")
        return symmetric_memory().rendezvous(buffer, group.group_name)


def _peer_buffer(handle: Any, dtype: torch.dtype) -> PeerBuffer:
    return lambda peer, numel, offset: handle.get_buffer(peer, (numel,), dtype, offset)


@functools.cache
def _tell_nccl_reduce_scatter(op: str) -> None:
    """Once per reduce op in the process, not once per unit and step."""
    logger.warning("copy-engine reduce-scatter: reduce op %s is not a sum or an average; these reduce-scatters run "
                   "as NCCL's", op)


@functools.cache
def _comm_classes() -> tuple[type, type]:
    """The two collectives as subclasses of FSDP2's own interfaces (built on first use: the interfaces are private
    torch names, reached through :mod:`twinkle_fx.core.torch_internals`)."""
    all_gather_base, reduce_scatter_base = fsdp_comm_bases()

    class AllGather(_SymmetricBuffers, all_gather_base):
        """FSDP2's all-gather (``FSDPModule.set_custom_all_gather``) as copy-engine pulls."""

        def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                     async_op: bool = False) -> None:
            handle = self._handle(output_tensor, group)
            rank, world, n = group.rank(), group.size(), input_tensor.numel()
            own = output_tensor[rank * n:(rank + 1) * n]
            if input_tensor.data_ptr() != own.data_ptr():  # FSDP2 copies its shards in place; anyone else may not
                own.copy_(input_tensor)
            handle.barrier(channel=0)  # every rank's slice is in place
            gather_shards(output_tensor, rank, world, _peer_buffer(handle, output_tensor.dtype))
            handle.barrier(channel=0)  # every peer has read this rank's slice
            return None  # ordered on the stream FSDP2 runs it on: nothing to wait for

    class ReduceScatter(_SymmetricBuffers, reduce_scatter_base):
        """FSDP2's reduce-scatter (``FSDPModule.set_custom_reduce_scatter``): copy-engine pulls of this
        rank's chunk of every peer's gradients, then one sum or mean kernel."""

        def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                     op: Any, async_op: bool = False) -> None:
            if op not in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
                # FSDP2 asks for a pre-multiplied sum only with a custom gradient divide factor
                _tell_nccl_reduce_scatter(str(op))
                dist.reduce_scatter_tensor(output_tensor, input_tensor, op=op, group=group)
                return None
            handle = self._handle(input_tensor, group)
            handle.barrier(channel=0)  # every rank's gradients are in place
            reduce_chunks(output_tensor, input_tensor, group.rank(), group.size(),
                          _peer_buffer(handle, input_tensor.dtype), average=op == dist.ReduceOp.AVG)
            handle.barrier(channel=0)  # every peer has read its chunk of this rank's gradients
            return None

    return AllGather, ReduceScatter


def use_copy_engine_collectives(model: nn.Module) -> int:
    """Route the all-gathers and reduce-scatters of every FSDP2 unit in ``model`` through copy-engine transfers
    over symmetric memory (the module docstring says how). Call it on every rank after ``fully_shard`` and before
    the first forward. Each shard group is checked once first: on one host, on CUDA, and a small all-gather and
    reduce-scatter through the new path give NCCL's results. Returns the number of units.

    Raises:
        ValueError: no FSDP2 unit in ``model``; a unit that is not on a CUDA device; a shard group that spans
            hosts (shard within a host and replicate across hosts: HSDP).
        RuntimeError: the check collectives disagree with NCCL's.

    Examples:
        >>> from torch import nn
        >>> use_copy_engine_collectives(nn.Linear(2, 2))
        Traceback (most recent call last):
        ...
        ValueError: use_copy_engine_collectives: Linear has no FSDP2 unit; call fully_shard on its layers and on it first
    """
    groups = [(name, module, unit) for name, module in model.named_modules()
              if (unit := fsdp_unit(module)) is not None]
    if not groups:
        raise ValueError(f"use_copy_engine_collectives: {type(model).__name__} has no FSDP2 unit; call "
                         "fully_shard on its layers and on it first")
    checked: set[str] = set()
    for name, module, (device, group) in groups:
        if device.type != "cuda":
            raise ValueError(f"use_copy_engine_collectives: the FSDP2 unit {name or 'at the root'} "
                             f"({type(module).__name__}) is on {device}; copy engines move GPU memory (CUDA) only")
        if group.size() > 1 and group.group_name not in checked:
            _check_group(group, device)
            checked.add(group.group_name)
    all_gather, reduce_scatter = _comm_classes()
    for _, module, _ in groups:
        module.set_custom_all_gather(all_gather())
        module.set_custom_reduce_scatter(reduce_scatter())
    logger.info("copy-engine collectives on %d FSDP2 units (shard groups of %s ranks)", len(groups),
                ", ".join(sorted({str(group.size()) for _, _, (_, group) in groups})))
    return len(groups)


def _check_group(group: dist.ProcessGroup, device: torch.device) -> None:
    """One host, then a small all-gather and reduce-scatter (sum and mean) through the copy engines against
    NCCL's, on every rank of ``group`` (a collective)."""
    hosts: list[str | None] = [None] * group.size()
    dist.all_gather_object(hosts, socket.gethostname(), group=group)
    if len(set(hosts)) > 1:
        raise ValueError(f"use_copy_engine_collectives: the shard group spans {len(set(hosts))} hosts\n"
                         f"Its ranks run on {sorted(set(hosts))}; copy engines reach the GPUs of one host only. Shard "
                         "within each host and replicate across hosts (HSDP: fully_shard(..., "
                         "mesh=init_device_mesh('cuda', (hosts, gpus_per_host))))")
    all_gather, reduce_scatter = _comm_classes()
    rank, world, n = group.rank(), group.size(), 1000
    generator = torch.Generator(device=device).manual_seed(rank)
    shard = torch.randn(n, generator=generator, device=device, dtype=torch.bfloat16)
    gather = all_gather()
    gathered = gather.allocate((world * n,), dtype=shard.dtype, device=device)
    gathered[rank * n:(rank + 1) * n].copy_(shard)
    gather(gathered, gathered[rank * n:(rank + 1) * n], group)
    expected = torch.empty_like(gathered)
    dist.all_gather_into_tensor(expected, shard, group=group)
    mismatches = []
    if not torch.equal(gathered, expected):
        mismatches.append("all-gather")
    scatter = reduce_scatter()
    for op, name in ((dist.ReduceOp.SUM, "sum"), (dist.ReduceOp.AVG, "mean")):
        grads = scatter.allocate((world * n,), dtype=torch.float32, device=device)
        grads.copy_(torch.randn(world * n, generator=generator, device=device))
        out = scatter.allocate((n,), dtype=grads.dtype, device=device)
        scatter(out, grads, group, op)
        reference = torch.empty_like(out)
        dist.reduce_scatter_tensor(reference, grads, op=op, group=group)
        if not torch.allclose(out, reference, rtol=1e-5, atol=1e-5):
            mismatches.append(f"reduce-scatter ({name}, largest difference {(out - reference).abs().max():.3g})")
    if mismatches:
        raise RuntimeError(f"use_copy_engine_collectives: on rank {rank} of {world} the copy-engine "
                           f"{' and '.join(mismatches)} disagreed with NCCL's\nKeeping NCCL's collectives (leaving "
                           "this call out) is the safe choice")
