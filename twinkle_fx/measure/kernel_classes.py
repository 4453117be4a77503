"""A step's GPU time by what the kernels compute: GEMM, attention, norm, pointwise, loss, optimizer,
communication, copies, and the time the GPU runs nothing.

A kernel's class comes from the name ``torch.profiler`` records for it: cuBLAS's (``nvjet_*``, ``*gemm*``),
cuDNN's and FlashAttention's, NCCL's, ATen's CUDA kernels, Inductor's generated Triton kernels (named for
the ATen ops they fuse: ``triton_red_fused_add_mean_mul_pow_rsqrt_0`` is an RMSNorm, ``triton_poi_*`` a
pointwise kernel, ``triton_tem_*`` a GEMM template) and twinkle_triton's. The first class whose marks the
lower-cased name contains wins, in the order of :data:`CLASSES`: a fused kernel that casts inside a norm is
a norm, not a copy. Copies and fills on the copy engines are not kernels here (the trace's ``kernel``
events only). ``idle`` is the part of the profiled span in which no kernel runs on any stream: the GPU
waiting for the host.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .overlap import Kernel, busy_time

__all__ = ["CLASSES", "KernelClasses", "format_kernel_classes", "format_launch_shapes", "kernel_class",
           "kernel_classes", "launch_shapes"]

# (class, marks): the first class with a mark in the lower-cased kernel name wins
CLASSES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("communication", ("nccl",)),
    ("optimizer", ("fusedoptimizer", "fused_adam", "adam", "sgd_")),
    ("loss", ("cross_entropy", "crossentropy", "log_softmax", "nll_loss", "flce", "_cce_", "logsumexp")),
    ("attention", ("flash", "fmha", "attention", "sdpa", "scaled_dot_product", "gqa")),
    ("GEMM", ("gemm", "gemv", "nvjet", "cutlass", "xmma", "cublas", "splitkreduce", "triton_tem", "matmul",
              "_gate_up_kernel", "_rows_to_pairs_kernel", "_weight_grad_kernel")),
    ("norm", ("norm", "rsqrt")),
    ("copy", ("memcpy", "memset", "copy_kernel", "copyfunctor", "chunk_cat", "split_with_sizes", "catarray",
              "fill_kernel", "zero", "index_copy", "index_put", "scatter", "gather")),
    ("pointwise", ("triton_poi", "elementwise", "rotary", "silu", "swiglu", "gelu", "gated_act", "mul_add",
                   "add_gelu")),
    ("reduction", ("triton_red", "triton_per", "reduce_kernel", "reduce", "sum_")),
)


def kernel_class(name: str) -> str:
    """The class of a kernel by its name (``other`` when no class claims it).

    Examples:
        >>> kernel_class("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT")
        'GEMM'
        >>> kernel_class("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0")
        'norm'
        >>> kernel_class("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)")
        'communication'
    """
    lowered = name.lower()
    return next((kind for kind, marks in CLASSES if any(mark in lowered for mark in marks)), "other")


@dataclass
class KernelClasses:
    """Per step (milliseconds): each class's kernel time and kernel count, the span from the first kernel's
    start to the last one's end, and the part of it in which no kernel runs."""

    steps: int
    ms: dict[str, float] = field(default_factory=dict)  # kernels running side by side (streams) both count
    calls: dict[str, float] = field(default_factory=dict)
    span_ms: float = 0.0
    idle_ms: float = 0.0

    def to_json(self) -> dict[str, object]:
        return {"steps": self.steps, "ms": self.ms, "calls": self.calls, "span_ms": self.span_ms,
                "idle_ms": self.idle_ms}


def kernel_classes(kernels: Iterable[Kernel | tuple[int, str, float, float]], *, steps: int = 1) -> KernelClasses:
    """Kernel time per class and the idle time, per step, of ``kernels`` (microsecond intervals, as
    :func:`twinkle_fx.measure.overlap.kernel_intervals` reads them from a trace of ``steps`` steps).

    Examples:
        >>> split = kernel_classes([(7, "nvjet_gemm", 0.0, 600.0), (7, "triton_poi_fused_mul_silu_0", 600.0, 800.0),
        ...                         (7, "nvjet_gemm", 1000.0, 1600.0)], steps=1)
        >>> split.ms, split.idle_ms
        ({'GEMM': 1.2, 'pointwise': 0.2}, 0.2)
    """
    kernels = [Kernel(*k) for k in kernels]
    time: dict[str, float] = {}
    calls: dict[str, float] = {}
    for kernel in kernels:
        kind = kernel_class(kernel.name)
        time[kind] = time.get(kind, 0.0) + (kernel.end - kernel.start)
        calls[kind] = calls.get(kind, 0.0) + 1
    order = sorted(time, key=lambda kind: -time[kind])
    span = (max(k.end for k in kernels) - min(k.start for k in kernels)) if kernels else 0.0
    busy = busy_time((k.start, k.end) for k in kernels)
    per_step = 1e3 * steps
    return KernelClasses(steps, {kind: round(time[kind] / per_step, 6) for kind in order},
                         {kind: calls[kind] / steps for kind in order}, span / per_step, (span - busy) / per_step)


def format_kernel_classes(split: KernelClasses) -> str:
    """A few lines for a profile report: each class's ms and share of the span, then idle."""
    lines = [f"device time per step by kernel class ({split.steps} step(s); side-by-side kernels both count):"]
    for kind, ms in split.ms.items():
        share = f"{ms / split.span_ms:5.0%}" if split.span_ms else "    -"
        lines.append(f"  {kind:<14}{ms:9.3f} ms  {share} of the span  {split.calls[kind]:8.1f} kernels")
    share = f"{split.idle_ms / split.span_ms:5.0%}" if split.span_ms else "    -"
    lines.append(f"  {'idle':<14}{split.idle_ms:9.3f} ms  {share} of the span  (no kernel on any stream)")
    return "\n".join(lines)


def launch_shapes(trace: dict[str, Any], *, kind: str = "GEMM", steps: int = 1, top: int = 20) -> list[dict[str, Any]]:
    """The kernels of class ``kind`` in a ``torch.profiler`` Chrome trace, by name and launch grid, per step:
    one entry per (kernel, grid) with its calls, ms and µs a call, the ``top`` with the most time.

    A library GEMM's name says its tile and layout, its grid how many tiles: two launches of one name and grid
    are one problem shape, so their µs a call compare across runs (two rows of a benchmark, two clocks), where
    a kernel's total time mixes every shape it served. Not for persistent kernels, whose grid is the SM count
    whatever the shape (cuBLAS's ``nvjet_sm90_*`` on Hopper launch 2 x 66 CTAs on an H100 or H200): their
    launches group by name only, and the calls a step then say which products they served.

    Examples:
        >>> def kernel(name, dur, grid):
        ...     return {"ph": "X", "cat": "kernel", "name": name, "dur": dur, "args": {"grid": grid}}
        >>> trace = {"traceEvents": [kernel("nvjet_tst_256x128_NNT", 100.0, [8, 16, 1]),
        ...                          kernel("nvjet_tst_256x128_NNT", 300.0, [8, 64, 1]),
        ...                          kernel("nvjet_tst_256x128_NNT", 110.0, [8, 16, 1]),
        ...                          kernel("triton_poi_fused_mul_0", 50.0, [64, 1, 1])]}
        >>> [(s["grid"], s["calls"], s["us_per_call"]) for s in launch_shapes(trace)]
        [([8, 64, 1], 1.0, 300.0), ([8, 16, 1], 2.0, 105.0)]
    """
    groups: dict[tuple[str, tuple[int, ...]], list[float]] = {}
    for event in trace.get("traceEvents", []):
        if event.get("cat") != "kernel" or event.get("ph") != "X" or kernel_class(event.get("name", "")) != kind:
            continue
        grid = tuple(event.get("args", {}).get("grid", ()))
        groups.setdefault((event["name"], grid), []).append(float(event["dur"]))
    rows = [{"name": name, "grid": list(grid), "calls": len(durations) / steps,
             "ms": round(sum(durations) / steps / 1e3, 6), "us_per_call": round(sum(durations) / len(durations), 3)}
            for (name, grid), durations in groups.items()]
    return sorted(rows, key=lambda row: -row["ms"])[:top]


def format_launch_shapes(rows: list[dict[str, Any]], kind: str = "GEMM") -> str:
    """A few lines for a profile report: ms, calls and µs a call per step of each (kernel, grid)."""
    lines = [f"{kind} kernels by launch grid (one grid of one kernel is one problem shape, unless the kernel is "
             "persistent: one CTA or pair an SM whatever the shape), per step:",
             f"{'ms':>9}  {'calls':>6}  {'us/call':>9}  grid            kernel"]
    lines += [f"{row['ms']:9.3f}  {row['calls']:6.1f}  {row['us_per_call']:9.1f}  "
              f"{'x'.join(map(str, row['grid'])):<15} {row['name'][:80]}" for row in rows]
    return "\n".join(lines)
