"""Timing and peak memory of a benchmark's steps and calls, on the device clock
(:class:`twinkle_fx.measure.clock.DeviceClock`: CUDA events on a GPU, ``time.perf_counter`` on the
CPU, where memory is reported as n/a, ``None``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..measure.clock import CACHE_FLUSH_KERNEL, DeviceClock
from ..measure.gpu_state import GpuState, GpuStateSampler

__all__ = ["StepTiming", "time_training_steps", "time_calls", "kernel_ms", "copy_ms", "host_us", "GIB"]

GIB = float(1 << 30)


@dataclass
class StepTiming:
    """What :func:`time_training_steps` measured; memory fields are None on the CPU."""

    first_step_s: float
    first_loss: float
    # the loss of one more step after the timed ones: a replay where CUDA graphs are recorded (the first
    # step runs the compiled code without them), so a graph that replays something else shows here
    last_loss: float | None = None
    step_ms: list[float] = field(default_factory=list)
    host_ms: list[float] = field(default_factory=list)  # host side of the timed steps (DeviceClock.host_ms)
    peak_bytes: int | None = None  # over the warm-up and timed steps (where CUDA graphs are recorded)
    peak_reserved_bytes: int | None = None  # idem, reserved by the allocator (CUDA-graph pools included)
    first_step_peak_bytes: int | None = None  # over the first (compiling) step
    resident_bytes: int | None = None  # allocated before the first step: weights, inputs
    gpu_state: GpuState | None = None  # clocks, power, temperature during the timed steps (None: not sampled)

    @property
    def mean_ms(self) -> float:
        return statistics.fmean(self.step_ms)

    @property
    def median_ms(self) -> float:
        return statistics.median(self.step_ms)


def time_training_steps(step: Callable[[], torch.Tensor], clock: DeviceClock, *, warmup: int, steps: int,
                        on_first_step: Callable[[StepTiming], None] | None = None,
                        on_step: Callable[[], None] | None = None) -> StepTiming:
    """Run ``step`` (returns the loss) once for the first-step time and loss, ``warmup`` more times
    untimed, then ``steps`` times with one timing each.

    The first step is timed by the host clock, because for compiled backends it is mostly
    compilation on the host. The peak is reset after the first step so it describes the warm-up and
    timed steps (CUDA graphs are recorded in a warm-up step); the first step's own peak
    (compile-time autotuning buffers included) is kept apart.
    ``on_first_step`` sees the timing right after the first step (for progress lines); ``on_step``
    runs after each later step, outside the timed intervals (a progress bar).
    """
    if steps < 1:
        raise ValueError(f"steps must be at least 1 (got {steps}).")
    resident = clock.allocated()
    clock.reset_peak()
    loss, first_s = clock.wall(step)
    timing = StepTiming(first_step_s=first_s, first_loss=float(loss), resident_bytes=resident,
                        first_step_peak_bytes=clock.peak())
    if on_first_step is not None:
        on_first_step(timing)
    # the peak covers the warm-up steps with the timed ones: CUDA graphs (mode="reduce-overhead",
    # kernelize_model(cuda_graphs=True)) are recorded in a warm-up step, and their memory is allocated
    # there; a replay allocates nothing, so a peak over the timed steps alone showed a graphed H100
    # training row at 0.93 GiB against its pool's 7.26 GiB reserved
    clock.reset_peak()
    for _ in range(warmup):
        step()
        if on_step is not None:
            on_step()
    with GpuStateSampler(clock.device) as sampler:
        timing.step_ms = clock.each_ms(step, steps, after_each=on_step)
    timing.gpu_state = sampler.state
    timing.peak_bytes = clock.peak()
    timing.peak_reserved_bytes = clock.peak_reserved()
    timing.host_ms = [clock.host_ms(step) for _ in range(min(steps, 5))]
    timing.last_loss = float(step())
    return timing


def time_calls(fn: Callable[[], Any], clock: DeviceClock, *, warmup: int, reps: int) -> tuple[float, int | None]:
    """``(median ms, peak extra bytes)`` of ``fn``: ``warmup`` untimed calls (compilation,
    autotuning), ``reps`` timed calls each starting with a cold L2, then on CUDA one more call under
    a fresh peak whose excess over what was allocated before it is the extra memory ``fn`` needs
    (None on the CPU)."""
    for _ in range(warmup):
        fn()
    median = statistics.median(clock.each_ms(fn, max(reps, 1), flush_cache=True))
    if not clock.cuda:
        return median, None
    before = clock.allocated()
    clock.reset_peak()
    fn()
    return median, max(clock.peak() - before, 0)


def kernel_ms(fn: Callable[[], Any], clock: DeviceClock, *, reps: int) -> float | None:
    """Device time of ``fn``'s kernels (copies and fills too) per call, summed from the profiler over ``reps``
    calls, each starting with a cold L2 as in :func:`time_calls`; None off a GPU.

    What the call costs the GPU where launches are not waited for (a CUDA graph's replay, a busy stream):
    :func:`time_calls` times from the event before the call to the one after, so for small kernels behind a
    slow host (a backward through autograd) it measures the host."""
    if not clock.cuda:
        return None
    from torch.profiler import ProfilerActivity, profile

    from ..measure.profiler_events import device_us

    flush = clock.cache_flusher()
    fn()
    clock.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(max(reps, 1)):
            flush()
            fn()
        clock.synchronize()
    return sum(device_us(e) for e in prof.key_averages() if CACHE_FLUSH_KERNEL not in e.key) / max(reps, 1) / 1e3


def copy_ms(clock: DeviceClock, n_bytes: int, *, warmup: int, reps: int) -> float:
    """Milliseconds of a device-to-device ``Tensor.copy_`` of ``n_bytes`` (it moves ``2 * n_bytes``:
    read and write): the bandwidth roofline the benchmarks compare memory-bound work with."""
    src = torch.ones(n_bytes // 4, device=clock.device, dtype=torch.float32)
    dst = torch.empty_like(src)
    ms, _ = time_calls(lambda: dst.copy_(src), clock, warmup=warmup, reps=reps)
    return ms


def host_us(fn: Callable[[], Any], clock: DeviceClock, *, calls: int, repeats: int = 3) -> float:
    """Microseconds of host time per call of ``fn`` over ``calls`` back-to-back calls, the device
    not synchronised in between (so a call's cost is its Python, dispatch and launch work, not its
    kernels, as long as the device queue does not fill up). The best of ``repeats`` rounds: the
    first round may pay the caching allocator's ``cudaMalloc`` of new blocks (milliseconds)."""
    best = float("inf")
    for _ in range(repeats):
        clock.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, time.perf_counter() - start)
        clock.synchronize()
    return best / calls * 1e6
