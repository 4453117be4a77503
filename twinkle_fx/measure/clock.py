"""The device clock: times calls and tracks the allocator peak on one device.

On CUDA, each measured call sits between two CUDA events (GPU time, no host sync inside the timed
loop) and the peak is ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``. On
the CPU there are no events: each call is timed with ``time.perf_counter`` and memory is n/a
(``None``). :func:`~.kernel_timing.benchmark_kernel`, the checklist and the benchmark harness all
time with it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["DeviceClock", "CACHE_FLUSH_KERNEL"]

_CACHE_FLUSH_BYTES = 256 << 20  # overwritten before a timed call: more than an H100's or H200's 50 MiB of L2
# What the name of the flush's kernel holds, so that a profile of timed calls can leave it out.
CACHE_FLUSH_KERNEL = "bitwise_not"


class DeviceClock:
    """Times calls and tracks the allocator peak on one device (CUDA events or ``perf_counter``)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"

    def synchronize(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def wall(self, fn: Callable[[], Any]) -> tuple[Any, float]:
        """``(fn(), seconds)`` by the host clock, device work included (for compile-heavy first calls)."""
        self.synchronize()
        start = time.perf_counter()
        result = fn()
        self.synchronize()
        return result, time.perf_counter() - start

    def cache_flusher(self) -> Callable[[], None]:
        """A call that overwrites a 256 MiB buffer (one kernel, its name holding :data:`CACHE_FLUSH_KERNEL`), so
        that a call timed after it finds none of its inputs in L2 (CUDA)."""
        buffer = torch.empty(_CACHE_FLUSH_BYTES, dtype=torch.uint8, device=self.device)
        return buffer.bitwise_not_

    def each_ms(self, fn: Callable[[], Any], count: int, *, flush_cache: bool = False,
                after_each: Callable[[], None] | None = None) -> list[float]:
        """Milliseconds of each of ``count`` back-to-back calls of ``fn``.

        ``after_each`` (progress) runs between calls, outside the timed intervals.

        ``flush_cache`` (CUDA): overwrite a 256 MiB buffer before each call, outside the timed
        interval, so no call finds its inputs in L2 left by the previous one (H100/H200 L2 is 50
        MiB, the size of some microbenchmark inputs); the same as ``triton.testing.do_bench``.
        """
        if not self.cuda:
            times = []
            for _ in range(count):
                start = time.perf_counter()
                fn()
                times.append((time.perf_counter() - start) * 1e3)
                if after_each is not None:
                    after_each()
            return times
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(count)]
        flush = self.cache_flusher() if flush_cache else None
        for start, end in events:
            if flush is not None:
                flush()
            start.record()
            fn()
            end.record()
            if after_each is not None:
                after_each()
        torch.cuda.synchronize(self.device)
        return [start.elapsed_time(end) for start, end in events]

    def host_ms(self, fn: Callable[[], Any]) -> float:
        """Milliseconds the host spends in ``fn()`` with the device left to run behind it (no
        synchronisation inside the interval; before and after, the device is drained). Equal to
        the wall time when the host is the bottleneck, smaller when the device is (unless ``fn``
        itself waits for the device)."""
        self.synchronize()
        start = time.perf_counter()
        fn()
        elapsed = time.perf_counter() - start
        self.synchronize()
        return elapsed * 1e3

    def allocated(self) -> int | None:
        """Bytes currently allocated by tensors on the device; None on the CPU."""
        return torch.cuda.memory_allocated(self.device) if self.cuda else None

    def reset_peak(self) -> None:
        if self.cuda:
            self.synchronize()
            torch.cuda.reset_peak_memory_stats(self.device)

    def peak(self) -> int | None:
        """Bytes of the allocator peak since the last :meth:`reset_peak`; None on the CPU."""
        if not self.cuda:
            return None
        self.synchronize()
        return torch.cuda.max_memory_allocated(self.device)

    def peak_reserved(self) -> int | None:
        """Bytes the allocator held from the device at its peak since :meth:`reset_peak` (cached
        blocks and CUDA-graph pools included: a graph's replays allocate nothing, so its
        activations count here, not in :meth:`peak`); None on the CPU."""
        if not self.cuda:
            return None
        self.synchronize()
        return torch.cuda.max_memory_reserved(self.device)
