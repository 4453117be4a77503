"""Measure the swap-policy table: each swapped op's twinkle kernel against Inductor's code for its
reference, at the sizes of decode, prefill and a training step, replayed from CUDA graphs.

``python -m twinkle_fx.bench.swap_table --out DIR`` (CUDA only) prints one line per op, phase and size
and writes ``swap-table.json``; :data:`twinkle_fx.compiler.regions.splice.DECISIONS` is written from it.
Both implementations run ``REPS`` times inside one captured CUDA graph, so launch overhead (which
CUDA graphs remove in a compiled model too) is out and the GPU time of the kernels is what counts.
The shapes are the reference workload's (Qwen2-0.5B: hidden 896, intermediate 4864, 14 query and
2 KV heads of 64).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable

import torch

from ..core.outputs import output_dir
from ..core.torch_internals import capture_cuda_graph

__all__ = ["measure_swap_table"]

REPS = 20
ROWS = {"decode": 32, "prefill": 2048, "train": 4096}
HIDDEN, INTERMEDIATE, Q_HEADS, KV_HEADS, HEAD_DIM = 896, 4864, 14, 2, 64


def _graph_us(fn: Callable[[], object], replays: int = 7) -> float:
    """Median µs of one ``fn()`` replayed from a CUDA graph holding ``REPS`` calls."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with capture_cuda_graph(graph):
        for _ in range(REPS):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / REPS)
    return statistics.median(times)


def _cases(rows: int, dtype: torch.dtype):
    import twinkle_triton
    from twinkle_triton.rms_norm import rms_norm_reference
    from twinkle_triton.rotary import apply_rotary_pos_emb_reference
    from twinkle_triton.silu_and_mul import silu_mul_reference

    def randn(*shape):
        return torch.randn(*shape, device="cuda", dtype=dtype)

    x, weight = randn(rows, HIDDEN), 1 + 0.1 * randn(HIDDEN)
    gate, up = randn(rows, INTERMEDIATE), randn(rows, INTERMEDIATE)
    q = randn(1, rows, Q_HEADS, HEAD_DIM).transpose(1, 2)
    k = randn(1, rows, KV_HEADS, HEAD_DIM).transpose(1, 2)
    cos, sin = randn(1, rows, HEAD_DIM), randn(1, rows, HEAD_DIM)
    return {
        # (policy kernel name, rows of the region's first argument, twinkle, reference, tensor args,
        #  how many leading args get gradients in training)
        "rms_norm": ("RMSNorm", rows, lambda a, w: twinkle_triton.rms_norm(a, w, 1e-6),
                     lambda a, w: rms_norm_reference(a, w, 1e-6), (x, weight), 2),
        "silu_mul": ("SwiGLUMLP", rows, twinkle_triton.silu_mul, silu_mul_reference, (gate, up), 2),
        "rotary": ("apply_rotary_pos_emb", rows * Q_HEADS, twinkle_triton.apply_rotary_pos_emb,
                   apply_rotary_pos_emb_reference, (q, k, cos, sin), 2),
    }


def _phase_fn(fn: Callable[..., object], args: tuple, training: bool, n_grad: int) -> Callable[[], object]:
    if not training:
        def forward() -> object:
            with torch.no_grad():
                return fn(*args)
        return forward
    leaves = tuple(a.detach().requires_grad_(i < n_grad) for i, a in enumerate(args))
    wants = [a for a in leaves if a.requires_grad]

    def forward_backward() -> object:
        out = fn(*leaves)
        outs = out if isinstance(out, tuple) else (out,)
        return torch.autograd.grad(outs, wants, [torch.ones_like(o) for o in outs])

    return forward_backward


def measure_swap_table(dtype: torch.dtype = torch.bfloat16, progress: Callable[[str], None] = print) -> list[dict]:
    """One record per op, phase and size: twinkle µs, Inductor µs and twinkle's speed-up."""
    records = []
    for size, rows in ROWS.items():
        for op, (kernel, region_rows, twinkle, reference, args, n_grad) in _cases(rows, dtype).items():
            for training in (False, True):
                if training and size == "decode":
                    continue
                torch.compiler.reset()
                compiled = torch.compile(reference, dynamic=False)
                ours = _graph_us(_phase_fn(twinkle, args, training, n_grad))
                theirs = _graph_us(_phase_fn(compiled, args, training, n_grad))
                record = {"op": op, "kernel": kernel, "phase": "training" if training else "inference", "size": size,
                          "rows": region_rows, "twinkle_us": ours, "inductor_us": theirs, "speedup": theirs / ours}
                progress(f"{op:9s} {record['phase']:9s} {size:7s} rows {region_rows:6d}: twinkle {ours:8.1f} us, "
                         f"inductor {theirs:8.1f} us, twinkle speed-up {theirs / ours:.2f}x")
                records.append(record)
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=output_dir, help="directory for swap-table.json")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("swap_table: needs a CUDA device (the table is per device).")
    records = measure_swap_table()
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "records": records}
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "swap-table.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
