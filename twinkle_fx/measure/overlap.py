"""Exposed communication: how much of a GPU's collective time no compute kernel hides.

The input is the kernels one GPU ran, as ``(stream, name, start, end)`` intervals in microseconds
(:func:`kernel_intervals` reads them from a ``torch.profiler`` Chrome trace). Communication is a kernel
whose name has ``nccl`` in it, and, for collectives that move their bytes with the copy engines
(:mod:`twinkle_fx.distributed.copy_engine`), a copy from another GPU's memory (``Memcpy PtoP``,
read with ``peer_copies=True``) and the symmetric-memory barrier kernel that waits for the peers;
every other kernel is compute. Local copies and fills are not kernels here: they take no SMs and hide
nothing. A collective is *exposed* for the time in which no compute kernel runs on any stream of the
same GPU: that time is on the step's critical path unless the host is the bottleneck. The time in
which nothing runs at all is the GPU waiting for the host; its largest gaps are listed with the
kernels on either side, which say where in the step the host falls behind.

The other half of the cost is what overlap does to compute: NCCL kernels occupy SMs, so a GEMM that
runs beside an all-gather can take longer than the same GEMM alone. :func:`communication_overlap`
compares each compute kernel's mean duration under communication with its mean duration alone
(kernels of the same name: the same GEMM shape on every layer), which a single profile of a steady
step supports because every decoder layer runs the same kernels, some under a collective and some not.
"""

from __future__ import annotations

import bisect
import json
import re
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

__all__ = ["CommunicationOverlap", "Kernel", "busy_time", "communication_overlap", "format_overlap", "kernel_intervals"]


class Kernel(NamedTuple):
    """One kernel on the GPU's timeline (times in microseconds)."""

    stream: int
    name: str
    start: float
    end: float


@dataclass
class CommunicationOverlap:
    """One GPU's profiled steps, per step (milliseconds)."""

    steps: int
    communication_ms: float  # time in which at least one NCCL kernel runs
    exposed_ms: float  # of that, the time in which no compute kernel runs
    compute_ms: float  # time in which at least one compute kernel runs
    span_ms: float = 0.0  # first kernel's start to last kernel's end
    idle_ms: float = 0.0  # of the span, the time in which no kernel runs (the GPU waits for the host)
    # per collective (AllGather, ReduceScatter, ...): kernels per step, their summed time and the part of it
    # that no compute kernel covers (two collectives running at once both count their shared exposed time)
    collectives: dict[str, dict[str, float]] = field(default_factory=dict)
    # compute kernels that ran under communication for at least half their time and also ran alone: their
    # time under communication over what the same kernels took alone (1.0: no slowdown), and the extra ms
    slowdown: float | None = None
    slowdown_extra_ms: float = 0.0
    slowed: list[dict[str, Any]] = field(default_factory=list)  # the kernels behind most of the extra time
    streams: dict[str, list[int]] = field(default_factory=dict)  # the streams communication and compute ran on
    # the longest stretches with nothing on the GPU, longest first: ms, and the kernels that end before and start
    # after each
    gaps: list[dict[str, Any]] = field(default_factory=list)

    @property
    def hidden_fraction(self) -> float | None:
        """The share of communication time that compute covers (None without communication)."""
        if not self.communication_ms:
            return None
        return 1.0 - self.exposed_ms / self.communication_ms

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "hidden_fraction": self.hidden_fraction}


PEER_COPY = "Memcpy PtoP"  # torch.profiler's name for a copy between two GPUs' memories
_BARRIER = "symmetric_memory::barrier"


def is_communication(name: str) -> bool:
    return "nccl" in name.lower() or name.startswith(PEER_COPY) or _BARRIER in name


_COLLECTIVE = re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z]+)")


def collective(name: str) -> str:
    """``ncclDevKernel_AllGather_RING_LL(...)`` -> ``AllGather``; a copy from a peer GPU -> ``PeerCopy``; the
    symmetric-memory barrier -> ``PeerBarrier``; a name of another form is kept (shortened)."""
    if name.startswith(PEER_COPY):
        return "PeerCopy"
    if _BARRIER in name:
        return "PeerBarrier"
    found = _COLLECTIVE.search(name)
    return found[1] if found else name.split("(")[0][:60]


def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def _length(intervals: Sequence[tuple[float, float]]) -> float:
    return sum(end - start for start, end in intervals)


def busy_time(intervals: Iterable[tuple[float, float]]) -> float:
    """The time in which at least one of ``intervals`` runs (overlaps counted once)."""
    return _length(_union(intervals))


class _Cover:
    """A union of disjoint sorted intervals that answers "how much of [start, end) do I cover" in log time."""

    def __init__(self, union: list[tuple[float, float]]):
        self.starts = [s for s, _ in union]
        self.ends = [e for _, e in union]
        self.prefix = [0.0]
        for s, e in union:
            self.prefix.append(self.prefix[-1] + e - s)

    def covered(self, start: float, end: float) -> float:
        if end <= start or not self.starts:
            return 0.0
        first = bisect.bisect_right(self.ends, start)  # the first interval that ends after start
        last = bisect.bisect_left(self.starts, end)  # past the last interval that starts before end
        if first >= last:
            return 0.0
        inside = self.prefix[last] - self.prefix[first]
        inside -= max(0.0, start - self.starts[first])  # the first interval may begin before start
        inside -= max(0.0, self.ends[last - 1] - end)  # the last may run past end
        return max(0.0, inside)


def communication_overlap(kernels: Iterable[Kernel | tuple[int, str, float, float]], *, steps: int = 1,
                          top: int = 5) -> CommunicationOverlap:
    """Exposed communication and the slowdown of compute under it, per step, from one GPU's kernels.

    Examples:
        >>> result = communication_overlap([(7, "ncclDevKernel_AllGather_RING_LL", 0, 10),
        ...                                 (7, "gemm", 4, 8)])
        >>> result.communication_ms * 1e3, result.exposed_ms * 1e3
        (10.0, 6.0)
    """
    kernels = [Kernel(*k) for k in kernels]
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    comm = [k for k in kernels if is_communication(k.name)]
    compute = [k for k in kernels if not is_communication(k.name)]
    comm_union = _union((k.start, k.end) for k in comm)
    compute_union = _union((k.start, k.end) for k in compute)
    computing, communicating = _Cover(compute_union), _Cover(comm_union)
    exposed = sum(end - start - computing.covered(start, end) for start, end in comm_union)

    per_kind: dict[str, dict[str, float]] = defaultdict(lambda: {"calls": 0.0, "ms": 0.0, "exposed_ms": 0.0})
    for k in comm:
        row = per_kind[collective(k.name)]
        row["calls"] += 1 / steps
        row["ms"] += (k.end - k.start) / 1e3 / steps
        row["exposed_ms"] += (k.end - k.start - computing.covered(k.start, k.end)) / 1e3 / steps

    # each compute kernel alone (no communication at all during it) or under communication (half its time or more)
    alone: dict[str, list[float]] = defaultdict(list)
    under: dict[str, list[float]] = defaultdict(list)
    for k in compute:
        duration = k.end - k.start
        if duration <= 0:
            continue
        shared = communicating.covered(k.start, k.end)
        if shared == 0:
            alone[k.name].append(duration)
        elif shared >= duration / 2:
            under[k.name].append(duration)
    slowed = []
    for name in under.keys() & alone.keys():
        expected = statistics.fmean(alone[name]) * len(under[name])
        actual = sum(under[name])
        slowed.append({"name": name, "calls": len(under[name]) / steps, "ratio": actual / expected,
                       "extra_ms": (actual - expected) / 1e3 / steps})
    actual = sum(sum(under[s["name"]]) for s in slowed)
    expected = sum(statistics.fmean(alone[s["name"]]) * len(under[s["name"]]) for s in slowed)
    slowed.sort(key=lambda s: -s["extra_ms"])
    span = max((k.end for k in kernels), default=0.0) - min((k.start for k in kernels), default=0.0)
    return CommunicationOverlap(
        gaps=_idle_gaps(kernels, top),
        steps=steps,
        communication_ms=_length(comm_union) / 1e3 / steps,
        exposed_ms=exposed / 1e3 / steps,
        compute_ms=_length(compute_union) / 1e3 / steps,
        span_ms=span / 1e3 / steps,
        idle_ms=(span - _length(_union([*comm_union, *compute_union]))) / 1e3 / steps,
        collectives={name: dict(row) for name, row in sorted(per_kind.items())},
        slowdown=actual / expected if expected else None,
        slowdown_extra_ms=(actual - expected) / 1e3 / steps,
        slowed=slowed[:top],
        streams={"communication": sorted({k.stream for k in comm}), "compute": sorted({k.stream for k in compute})},
    )


def _idle_gaps(kernels: list[Kernel], top: int) -> list[dict[str, Any]]:
    """The ``top`` longest stretches between kernels with nothing running, with the kernel that ended last before
    each and the first that starts after it."""
    ordered = sorted(kernels, key=lambda k: k.start)
    gaps = []
    end, before = None, None
    for k in ordered:
        if end is not None and k.start > end:
            gaps.append({"ms": (k.start - end) / 1e3, "before": before.name[:90], "after": k.name[:90]})
        if end is None or k.end > end:
            end, before = k.end, k
    return sorted(gaps, key=lambda g: -g["ms"])[:top]


def kernel_intervals(trace: str | Path | dict[str, Any], device: int | None = None, *,
                     peer_copies: bool = False) -> list[Kernel]:
    """The kernels of a ``torch.profiler`` Chrome trace (``export_chrome_trace``): its events of category
    ``kernel``, on GPU ``device`` (all GPUs when None), as :class:`Kernel` intervals; with ``peer_copies`` also
    its copies from another GPU's memory (category ``gpu_memcpy``, ``Memcpy PtoP``), the transfers of
    copy-engine collectives."""
    if not isinstance(trace, dict):
        trace = json.loads(Path(trace).read_text())
    kernels = []
    for event in trace.get("traceEvents", []):
        category = event.get("cat")
        peer_copy = peer_copies and category == "gpu_memcpy" and event.get("name", "").startswith(PEER_COPY)
        if (category != "kernel" and not peer_copy) or event.get("ph") != "X":
            continue
        args = event.get("args", {})
        if device is not None and args.get("device", device) != device:
            continue
        start = float(event["ts"])
        kernels.append(Kernel(int(args.get("stream", -1)), event.get("name", ""), start, start + float(event["dur"])))
    return kernels


def format_overlap(overlap: CommunicationOverlap) -> str:
    """A few lines for a profile report."""
    hidden = overlap.hidden_fraction
    lines = [f"communication per step (NCCL kernels, peer copies and barriers, {overlap.steps} step(s)):",
             f"  {overlap.communication_ms:8.2f} ms with a collective running, {overlap.exposed_ms:8.2f} ms of it exposed "
             f"(no compute kernel running){'' if hidden is None else f'; {hidden:.0%} hidden'}",
             f"  {overlap.compute_ms:8.2f} ms with a compute kernel running, {overlap.idle_ms:8.2f} ms with no kernel "
             f"(of {overlap.span_ms:.2f} ms from the first kernel to the last)"]
    for name, row in overlap.collectives.items():
        lines.append(f"  {name:<16} {row['calls']:6.1f} calls  {row['ms']:8.2f} ms  {row['exposed_ms']:8.2f} ms exposed")
    if overlap.slowdown is not None:
        lines.append(f"  compute under communication: {overlap.slowdown:.2f}x its time alone "
                     f"(+{overlap.slowdown_extra_ms:.2f} ms per step); most of it:")
        lines += [f"    {s['ratio']:.2f}x  +{s['extra_ms']:.2f} ms  {s['calls']:.0f} calls  {s['name'][:90]}"
                  for s in overlap.slowed]
    lines.append(f"  streams: communication {overlap.streams.get('communication')}, "
                 f"compute {overlap.streams.get('compute')}")
    if overlap.gaps:
        lines.append("  longest stretches with nothing on the GPU (it waits for the host), in the profiled steps:")
        lines += [f"    {g['ms']:7.2f} ms  after {g['before'][:60]}  before {g['after'][:60]}" for g in overlap.gaps]
    return "\n".join(lines) + "\n"
