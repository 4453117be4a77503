"""The speed-up, sizes and memory items: median times of the original and the kernel (eager at every
size, both under ``torch.compile`` where the kernel can compile) and their peak memory on a GPU."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from .report import FAIL, NA, PASS, SPEEDUP_BAR, WARN, KernelCheck, SpeedCase
from .runner import Runner, shape_of

__all__ = ["check_speed"]


def check_speed(check: KernelCheck, runner: Runner, sizes: list[tuple[int, int]], dtype: torch.dtype,
                progress: Callable[[str], None], started: float) -> None:
    """Time the original and the kernel into ``check.speed``; the speed-up, sizes and memory verdicts."""
    choice, compiled = runner.t.choice, runner.compiled
    interpreted = runner.device.type == "cpu"
    timed_sizes = sizes[-1:] if interpreted else sizes
    try:
        for rows, width in timed_sizes:
            check.speed.append(_case(runner, rows, width, dtype, compiled=False))
            progress(f"    eager timing {check.speed[-1].shape}: {check.speed[-1].original_ms:.3f} -> "
                     f"{check.speed[-1].kernel_ms:.3f} ms ({since(started)})")
    except Exception as e:  # noqa: BLE001 - e.g. out of memory at the largest size: a verdict, not a crash
        for item in ("speed-up", "sizes", "memory"):
            check.verdicts[item], check.notes[item] = FAIL, f"timing raised {type(e).__name__}: {e}"
        check.speed.clear()
    progress(f"    eager timing: {len(check.speed)} size(s) ({since(started)})")
    can_compile = compiled and choice.can_torch_compile and check.speed
    compile_error = None
    if can_compile:
        rows, width = sizes[-1]
        # Dynamo caches compiled frames per code object, and every check times the same lambdas:
        # without a reset, later targets would hit the recompile limit and silently run eagerly
        torch.compiler.reset()
        try:
            check.speed.append(_case(runner, rows, width, dtype, compiled=True))
        except Exception as e:  # noqa: BLE001 - a kernel that breaks torch.compile is a finding
            compile_error = f"compiled timing raised {type(e).__name__}: {e}"
        torch.compiler.reset()
        progress(f"    compiled timing: {'failed' if compile_error else 'done'} ({since(started)})")
    if not check.speed:
        return
    eager = [s for s in check.speed if s.what.startswith("eager")]
    largest = eager[-1]
    speedups = "; ".join(f"{s.what} {s.shape}: {s.original_ms:.3f} -> {s.kernel_ms:.3f} ms = {s.speedup:.2f}x"
                         for s in check.speed)
    if interpreted:
        check.verdicts["speed-up"] = check.verdicts["sizes"] = NA
        check.notes["speed-up"] = f"Triton interpreter on the CPU: times are not speed ({speedups})"
    else:
        best = max(s.speedup for s in check.speed if s.shape == largest.shape)
        check.verdicts["speed-up"] = PASS if best >= SPEEDUP_BAR else WARN
        check.notes["speed-up"] = (speedups + ("" if can_compile else "; compiled: not timed" +
                                               ("" if compiled else " (compiled=False)") +
                                               ("" if choice.can_torch_compile else " (can_torch_compile=False)")))
        if compile_error is not None:
            check.verdicts["speed-up"] = WARN
            check.notes["speed-up"] += f"; {compile_error}"
        slower = [s for s in eager if s.speedup < 1.0]
        check.verdicts["sizes"] = WARN if slower else PASS
        check.notes["sizes"] = (f"slower than the original at {', '.join(s.shape for s in slower)}" if slower
                                else f"not slower at any of {len(eager)} sizes")
    if largest.kernel_peak_mib is None:
        check.verdicts["memory"], check.notes["memory"] = NA, "no allocator statistics on the CPU"
    else:
        ok = largest.kernel_peak_mib <= 1.1 * largest.original_peak_mib + 1
        check.verdicts["memory"] = PASS if ok else WARN
        check.notes["memory"] = (f"peak above inputs {largest.original_peak_mib:.1f} MiB (original) -> "
                                 f"{largest.kernel_peak_mib:.1f} MiB (kernel) at {largest.shape}")


def since(started: float) -> str:
    return f"{time.perf_counter() - started:.0f} s"


def _case(runner: Runner, rows: int, width: int, dtype: torch.dtype, compiled: bool) -> SpeedCase:
    inputs = runner.inputs(rows, width, dtype)
    wrt = runner.wrt(inputs)
    original, kernel = runner.calls(inputs)
    if compiled:
        original, kernel = torch.compile(original), torch.compile(kernel)
    steps = [runner.step(fn, wrt) for fn in (original, kernel)]
    timings = []
    for step in steps:  # on the checked device's clock (benchmark_kernel picks it from tensor arguments)
        for _ in range(max(runner.warmup, 1) if compiled else runner.warmup):  # compiling is no timed call
            step()
        timings.append(statistics.median(runner.clock.each_ms(step, runner.iters)))
    peaks = [_peak_mib(runner, step) for step in steps]
    what = f"{'compiled' if compiled else 'eager'} {'fwd+bwd' if runner.train else 'fwd'}"
    return SpeedCase(shape_of(inputs), str(dtype).removeprefix("torch."), what, timings[0], timings[1], peaks[0],
                     peaks[1])


def _peak_mib(runner: Runner, step: Callable[[], None]) -> float | None:
    if not runner.clock.cuda:
        return None
    before = runner.clock.allocated()
    runner.clock.reset_peak()
    step()
    return max(runner.clock.peak() - before, 0) / 2**20
