"""The profiler item: the top rows of ``torch.profiler`` for the kernel's call (device time on a GPU,
self CPU time elsewhere)."""

from __future__ import annotations

import warnings
from typing import Any

import torch

from .report import PASS, WARN, KernelCheck
from .runner import Runner

__all__ = ["check_profiler"]


def check_profiler(check: KernelCheck, runner: Runner, rows: int, width: int, dtype: torch.dtype) -> None:
    """The kernel's profile into ``check.profile``; the item's verdict and note."""
    with warnings.catch_warnings():  # "Profiler clears events at the end of each cycle": one cycle here, nothing lost
        warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
        check.profile = _profile(runner, rows, width, dtype)
    check.verdicts["profiler"] = PASS if check.profile else WARN
    check.notes["profiler"] = (f"top rows by {'device' if runner.clock.cuda else 'self CPU'} time of "
                               f"{1 if runner.tiny else 3} call(s):")


def _profile(runner: Runner, rows: int, width: int, dtype: torch.dtype) -> list[dict[str, Any]]:
    from torch.profiler import ProfilerActivity, profile

    from ..measure.profiler_events import device_us

    inputs = runner.inputs(rows, width, dtype)
    step = runner.step(runner.calls(inputs)[1], runner.wrt(inputs))
    calls = 1 if runner.tiny else 3  # the interpreter's calls are slow and its rows all alike
    if not runner.tiny:
        step()  # out of the profile: first-call work (autotuning, caches)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if runner.clock.cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(calls):
            step()
        runner.clock.synchronize()
    rows_out = []
    for event in prof.key_averages():
        us, clock = (device_us(event), "device") if runner.clock.cuda else (event.self_cpu_time_total, "self CPU")
        if us > 0:
            rows_out.append({"name": event.key, "calls": event.count, "time_ms": us / 1e3, "clock": clock})
    return sorted(rows_out, key=lambda r: -r["time_ms"])[:10]
