"""``twinkle-fx bench --profile DIR``: a few extra steps of each backend under ``torch.profiler``.

For each backend row, ``DIR/<row>/profile_trace.json`` (a Chrome trace: chrome://tracing or
https://ui.perfetto.dev) and ``DIR/<row>/profile_report.txt``: the top kernels by device time, host
(wall) vs device (kernels) time per step, and kernel launches per step. The profiled steps run after
the timed ones, so the profiler's overhead never reaches the reported timings. On a GPU the report also splits
the device time by kernel class (GEMM, attention, norm, pointwise, loss, optimizer, communication, copies)
and gives the time no kernel runs (:mod:`twinkle_fx.measure.kernel_classes`). On the CPU there is no
device: the report ranks operators by self CPU time and says so.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..measure.clock import DeviceClock
from ..measure.kernel_classes import (KernelClasses, format_kernel_classes, format_launch_shapes, kernel_classes,
                                      launch_shapes)
from ..measure.overlap import communication_overlap, format_overlap, kernel_intervals
from ..measure.profiler_events import device_us

__all__ = ["ProfileSummary", "profile_steps", "exposed_communication"]

# runtime calls that start work on the GPU (one per kernel; a CUDA graph replay is one launch)
_LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch",
             "hipLaunchKernel", "hipModuleLaunchKernel", "hipExtModuleLaunchKernel")
_TOP = 15


@dataclass
class ProfileSummary:
    """What one backend's profiled steps showed (kept in the row's notes and in the JSON)."""

    steps: int
    host_ms_per_step: float  # wall clock of a step, device work included
    device_ms_per_step: float | None  # sum of kernel times (None on the CPU)
    launches_per_step: float | None  # None on the CPU
    # device operations (kernels, copies, fills) per step; a CUDA-graph replay runs many for one launch
    kernels_per_step: float | None = None
    top: list[dict[str, Any]] = field(default_factory=list)  # name, calls, ms (device, or self CPU)
    # per step: ms and kernels of each kernel class, the span and its idle part (KernelClasses.to_json); GPU only
    classes: dict[str, Any] | None = None
    # GPU only: the GEMM kernels by name and launch grid (one problem shape each): calls, ms, µs a call per step
    gemms: list[dict[str, Any]] = field(default_factory=list)
    trace: str = ""
    report: str = ""
    # GPU only, with communication=True: the exposed communication per step (CommunicationOverlap.to_json)
    communication: dict[str, Any] | None = None


def profile_steps(step: Callable[[], Any], clock: DeviceClock, out_dir: Path, *, steps: int, title: str,
                  communication: bool = False) -> ProfileSummary:
    """Run ``step`` ``steps`` times under the profiler; write the trace and the report into ``out_dir``.
    ``communication``: on a GPU, also the steps' collectives and how much of them no compute hides
    (:func:`exposed_communication`), in the report and the summary."""
    from torch.profiler import ProfilerActivity, profile, record_function

    out_dir.mkdir(parents=True, exist_ok=True)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if clock.cuda else [])
    walls = []
    with profile(activities=activities) as prof:
        for index in range(steps):
            clock.synchronize()
            start = time.perf_counter()
            with record_function(f"step {index}"):
                step()
            clock.synchronize()
            walls.append((time.perf_counter() - start) * 1e3)
    trace = out_dir / "profile_trace.json"
    prof.export_chrome_trace(str(trace))
    averages = prof.key_averages()
    if clock.cuda:
        kernels = [(e.key, e.count, device_us(e) / 1e3) for e in averages if device_us(e) > 0]
        device_ms = sum(ms for _, _, ms in kernels) / steps
        launches = sum(e.count for e in averages if e.key in _LAUNCHES) / steps
        kernels_run = sum(count for _, count, _ in kernels) / steps
    else:
        kernels = [(e.key, e.count, e.self_cpu_time_total / 1e3) for e in averages
                   if e.self_cpu_time_total > 0 and not e.key.startswith("step ")]
        device_ms = launches = kernels_run = None
    kernels.sort(key=lambda k: -k[2])
    classes, gemms, exposed, section = None, [], None, ""
    if clock.cuda:
        events = json.loads(trace.read_text())  # read once: a profile of a large model's steps is tens of MB
        classes = kernel_classes(kernel_intervals(events), steps=steps).to_json()
        gemms = launch_shapes(events, steps=steps)
        if communication:
            exposed, section = exposed_communication(events, steps)
    summary = ProfileSummary(
        steps=steps, host_ms_per_step=sum(walls) / steps, device_ms_per_step=device_ms, launches_per_step=launches,
        kernels_per_step=kernels_run, top=[{"name": name, "calls": calls, "ms": ms} for name, calls, ms in kernels[:_TOP]],
        classes=classes, gemms=gemms, trace=str(trace), report=str(out_dir / "profile_report.txt"),
        communication=exposed,
    )
    Path(summary.report).write_text(format_profile(summary, title=title, device=clock.device) + section)
    return summary


def exposed_communication(events: dict[str, Any], steps: int) -> tuple[dict[str, Any], str]:
    """The exposed communication of ``steps`` profiled steps (a Chrome trace's events, parsed): collectives'
    kernels, peer copies and barriers, and how much of them no compute hides (:mod:`twinkle_fx.measure.overlap`),
    as JSON and as the report's section."""
    overlap = communication_overlap(kernel_intervals(events, peer_copies=True), steps=steps)
    return overlap.to_json(), "\n" + format_overlap(overlap)


def format_profile(summary: ProfileSummary, *, title: str, device: torch.device) -> str:
    lines = [f"{title}: {summary.steps} profiled step(s) on {device}", ""]
    lines.append(f"host (wall) time per step:   {summary.host_ms_per_step:10.3f} ms")
    if summary.device_ms_per_step is None:
        lines.append("device time per step:         n/a (no GPU: the CPU profile only)")
        lines.append("kernel launches per step:     n/a")
    else:
        busy = summary.device_ms_per_step / summary.host_ms_per_step if summary.host_ms_per_step else 0.0
        lines.append(f"device (kernel) time per step:{summary.device_ms_per_step:10.3f} ms  "
                     f"({busy:.0%} of the wall time: {'device-bound' if busy > 0.8 else 'host-bound (launches, Python)'})")
        lines.append(f"kernel launches per step:     {summary.launches_per_step:10.1f}")
        lines.append(f"device operations per step:   {summary.kernels_per_step:10.1f}  (kernels, copies, fills; "
                     "a CUDA-graph replay runs many for one launch)")
    if summary.classes:
        lines += ["", format_kernel_classes(KernelClasses(**summary.classes))]
    if summary.gemms:
        lines += ["", format_launch_shapes(summary.gemms)]
    clock = "device time" if summary.device_ms_per_step is not None else "self CPU time"
    lines += ["", f"top {len(summary.top)} by {clock} (all profiled steps):",
              f"{'ms':>10}  {'calls':>6}  name"]
    lines += [f"{row['ms']:10.3f}  {row['calls']:6d}  {row['name'][:110]}" for row in summary.top]
    lines += ["", f"Chrome trace: {summary.trace} (open in chrome://tracing or https://ui.perfetto.dev)"]
    return "\n".join(lines) + "\n"


def summary_notes(summary: ProfileSummary) -> dict[str, Any]:
    return asdict(summary)


def host_us_per_kernel(host_ms: float | None, profile: dict[str, Any] | None) -> float | None:
    """Host time of a step (timed without the profiler) over the device operations the profiled step
    ran: what the host spends per kernel call, whatever launched it (Python, Inductor's code, a
    CUDA-graph replay).

    Examples:
        >>> host_us_per_kernel(12.0, {"kernels_per_step": 1500.0})
        8.0
    """
    kernels = (profile or {}).get("kernels_per_step")
    if host_ms is None or not kernels:
        return None
    return host_ms * 1e3 / kernels
