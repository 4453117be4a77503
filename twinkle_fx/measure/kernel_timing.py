"""``benchmark_kernel``: time one callable the way the custom-kernel quick-start guide does.

It times with the device clock (:class:`~.clock.DeviceClock`, the benchmark harness's too): CUDA
events around each call on a GPU, ``time.perf_counter`` on the CPU (under the Triton interpreter such timings say
how slow the interpreter is, not how fast a kernel is).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .clock import DeviceClock

__all__ = ["KernelTiming", "benchmark_kernel"]


@dataclass(frozen=True)
class KernelTiming:
    """What :func:`benchmark_kernel` measured.

    Dividing two results gives the ratio of their medians, so ``time_torch / time_custom`` is the
    speed-up of the custom kernel (the guide's idiom); ``float(result)`` is the median in ms.
    """

    name: str
    median_ms: float
    min_ms: float
    max_ms: float
    iters: int
    warmup: int
    device: str
    timer: str  # "cuda events" or "perf_counter"
    gbps: float | None = None  # bytes / median time, when the bytes were given
    tflops: float | None = None  # flops / median time, when the flops were given

    def __truediv__(self, other: "KernelTiming") -> float:
        if not isinstance(other, KernelTiming):
            return NotImplemented
        return self.median_ms / other.median_ms

    def __float__(self) -> float:
        return self.median_ms

    def __str__(self) -> str:
        rates = [f"{self.gbps:,.1f} GB/s" if self.gbps is not None else "",
                 f"{self.tflops:,.3f} TFLOP/s" if self.tflops is not None else ""]
        rate = ", ".join(r for r in rates if r)
        return (f"{self.name}: median {self.median_ms:.4f} ms (min {self.min_ms:.4f}, max {self.max_ms:.4f}) over "
                f"{self.iters} calls after {self.warmup} warm-up{', ' + rate if rate else ''} "
                f"[{self.timer} on {self.device}]")


def _device_of(args: tuple, kwargs: dict) -> torch.device:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value.device
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def benchmark_kernel(fn: Callable[..., Any], *args: Any, warmup: int = 20, iters: int = 100,
                     bytes: int | None = None, flops: int | None = None, **kwargs: Any) -> KernelTiming:
    """Time ``fn(*args, **kwargs)``: ``warmup`` untimed calls (compilation, autotuning), then ``iters``
    calls timed one by one.

    The device is that of the first tensor argument (else CUDA when available): on CUDA each call is
    timed with CUDA events (GPU time, no host sync inside the loop), on the CPU with
    ``time.perf_counter``.

    Args:
        fn (`Callable`): what to time; ``args`` and ``kwargs`` are passed to it.
        warmup (`int`, defaults to 20): untimed calls first.
        iters (`int`, defaults to 100): timed calls.
        bytes (`int`, *optional*): bytes one call must read and write; adds GB/s.
        flops (`int`, *optional*): floating-point operations of one call; adds TFLOP/s.

    Returns:
        [`KernelTiming`]: median, min and max ms (and GB/s, TFLOP/s); ``a / b`` is the ratio of medians.

    Raises:
        ValueError: ``iters`` below 1 or ``warmup`` below 0.

    Examples:
        >>> import torch, twinkle_triton
        >>> from twinkle_fx import benchmark_kernel
        >>> x, bias = torch.randn(64, 256), torch.randn(256)
        >>> custom = benchmark_kernel(twinkle_triton.fused_add_gelu, x, bias, warmup=1, iters=3)
        >>> torch_ = benchmark_kernel(lambda x, b: torch.nn.functional.gelu(x + b), x, bias, warmup=1, iters=3)
        >>> speedup = torch_ / custom   # the guide's `time_torch / time_custom`
    """
    if iters < 1:
        raise ValueError(f"benchmark_kernel: iters must be at least 1 (got {iters}).")
    if warmup < 0:
        raise ValueError(f"benchmark_kernel: warmup cannot be negative (got {warmup}).")
    clock = DeviceClock(_device_of(args, kwargs))

    def call() -> None:
        fn(*args, **kwargs)

    for _ in range(warmup):
        call()
    clock.synchronize()
    times = clock.each_ms(call, iters)
    median = statistics.median(times)
    seconds = median * 1e-3
    device = (torch.cuda.get_device_name(clock.device) if clock.cuda else "cpu")
    return KernelTiming(
        name=getattr(fn, "__name__", type(fn).__name__),
        median_ms=median, min_ms=min(times), max_ms=max(times), iters=iters, warmup=warmup,
        device=device, timer="cuda events" if clock.cuda else "perf_counter",
        gbps=None if bytes is None or seconds <= 0 else bytes / seconds / 1e9,
        tflops=None if flops is None or seconds <= 0 else flops / seconds / 1e12,
    )
