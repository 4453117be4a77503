"""NCCL all-reduce bandwidth between the GPUs of one host, alone and beside a GEMM stream (DDP's
gradient all-reduce runs while the backward's GEMMs occupy the SMs).

Run with torchrun, one process per GPU::

    torchrun --standalone --nproc_per_node 2 tools/allreduce_probe.py --sizes-mb 100,1000

Rank 0 prints, per size, the median time of one all-reduce of bf16 data and its bus bandwidth
(``2 (n - 1) / n x bytes / time``), first alone, then while every rank runs 8192 x 8192 bf16
GEMMs on a second stream. ``--json`` writes the rows.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch
import torch.distributed as dist

from twinkle_fx.core.outputs import output_file


def _time_all_reduce(buffer: torch.Tensor, reps: int, busy: bool) -> float:
    """Median ms of one all-reduce of ``buffer`` (with ``busy``, GEMMs run on another stream meanwhile)."""
    side = torch.cuda.Stream()
    a = torch.randn(8192, 8192, device=buffer.device, dtype=torch.bfloat16)
    times = []
    for _ in range(reps + 2):
        dist.barrier()
        torch.cuda.synchronize()
        if busy:
            with torch.cuda.stream(side):
                for _ in range(16):  # ~1.1 TFLOP: longer than the all-reduce
                    a @ a
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dist.all_reduce(buffer)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times[2:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", default="100,1000")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--json", type=output_file)
    args = parser.parse_args()
    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl")
    world = dist.get_world_size()
    rows = []
    for size_mb in (int(s) for s in args.sizes_mb.split(",")):
        buffer = torch.ones(size_mb * 2**20 // 2, device="cuda", dtype=torch.bfloat16)
        for busy in (False, True):
            ms = _time_all_reduce(buffer, args.reps, busy)
            busbw = 2 * (world - 1) / world * buffer.numel() * 2 / (ms / 1e3) / 1e9
            rows.append({"size_mb": size_mb, "beside_gemm": busy, "ms": round(ms, 3), "busbw_gbs": round(busbw, 1)})
            if rank == 0:
                print(f"all-reduce {size_mb:5d} MB bf16, {'beside GEMMs' if busy else 'alone       '}: {ms:8.3f} ms, "
                      f"bus bandwidth {busbw:6.1f} GB/s (world {world}; NCCL env: "
                      f"{ {k: v for k, v in os.environ.items() if k.startswith('NCCL_')} })", flush=True)
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
