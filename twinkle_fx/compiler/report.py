"""What the backend did: every candidate region, the kernel chosen or why not, per graph.

``str(report)`` is the readable form (``python -m twinkle_fx explain`` prints it); the fields are
there for tests and tools.

Examples:
    >>> from twinkle_fx.compiler import collect_reports
    >>> with collect_reports() as report:                                         # doctest: +SKIP
    ...     torch.compile(model, backend="twinkle")(input_ids)
    >>> print(report.summary())                                                    # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import contextvars
import difflib
from collections.abc import Iterator
from dataclasses import dataclass, field

from .pipeline import Kept, Outcome
from ..core.reasons import Reason

__all__ = ["RegionReport", "GraphReport", "CompileReport", "collect_reports", "active_reports"]


@dataclass
class RegionReport:
    """One candidate region: swapped (``kernel`` and ``how``) or kept (``reason``: ``reason.kind`` is
    a :class:`~twinkle_fx.core.reasons.ReasonKind`, ``str(reason)`` the sentence)."""

    kind: str  # "layer" or "function"
    target: str
    location: str
    kernel: str | None = None
    how: str | None = None
    reason: Reason | None = None
    match: str | None = None  # functions: "call", "copy" (same-named function elsewhere) or "computation"

    @classmethod
    def from_outcome(cls, outcome: Outcome) -> RegionReport:
        if isinstance(outcome, Kept):
            return cls(outcome.kind, outcome.target, outcome.location, kernel=outcome.kernel, reason=outcome.reason,
                       match=outcome.match)
        return cls(outcome.kind, outcome.target, outcome.location, kernel=outcome.kernel, how=outcome.how,
                   match=outcome.match)

    @property
    def swapped(self) -> bool:
        return self.reason is None and self.kernel is not None

    def __str__(self) -> str:
        matched = f", matched a {self.match}" if self.match else ""
        if self.swapped:
            return f"swapped {self.kind} {self.target} at {self.location}: {self.kernel} ({self.how}{matched})"
        return f"kept    {self.kind} {self.target} at {self.location}: {self.reason}"


@dataclass
class GraphReport:
    """One graph Dynamo handed to the backend."""

    index: int
    device: str
    mode: str
    compiler: str
    regions: list[RegionReport] = field(default_factory=list)
    graph_break: str | None = None  # why Dynamo ended this graph early, and where
    pass_ms: dict[str, float] = field(default_factory=dict)
    code_before: str = ""
    code_after: str = ""
    verified: str | None = None  # with verify=True: the shapes the rewrite was checked at (or why not)

    @property
    def total_ms(self) -> float:
        return sum(self.pass_ms.values())

    def diff(self) -> str:
        """Unified diff of the FX code before and after the rewrite ("" when unchanged)."""
        lines = difflib.unified_diff(
            self.code_before.splitlines(), self.code_after.splitlines(),
            f"graph {self.index} before", f"graph {self.index} after", lineterm="", n=1,
        )
        return "\n".join(lines)

    def summary(self, *, pass_times: bool = True) -> str:
        """What was swapped or kept, and why; with ``pass_times=False`` the passes' total time instead of each one's."""
        passes = (", ".join(f"{name} {ms:.1f} ms" for name, ms in self.pass_ms.items()) if pass_times
                  else f"passes took {self.total_ms:.1f} ms")
        head = f"graph {self.index} ({self.mode} on {self.device}, inner compiler {self.compiler}): {passes}"
        lines = [head]
        if self.graph_break:
            lines.append(f"  ends at a graph break: {self.graph_break}")
        if self.verified:
            lines.append(f"  verify checked {self.verified}" if not self.verified.startswith(("only", "not"))
                         else f"  verify: {self.verified}")
        lines.extend(f"  {line}" for line in _grouped(self.regions))
        if not self.regions:
            lines.append("  no registered layer or function found")
        return "\n".join(lines)

    def __str__(self) -> str:
        diff = self.diff()
        return self.summary() + ("\n" + diff if diff else "\n  (graph unchanged)")


def _grouped(regions: list[RegionReport]) -> list[str]:
    """Regions with the same target and outcome on one line: 24 RMSNorms read as one."""
    groups: dict[tuple, list[str]] = {}
    for r in regions:
        groups.setdefault((r.swapped, r.kind, r.target, r.kernel, r.how, r.reason, r.match), []).append(r.location)
    lines = []
    for (swapped, kind, target, kernel, how, reason, match), locations in groups.items():
        shown = ", ".join(locations[:3]) + (f", ... ({len(locations)} in all)" if len(locations) > 3 else "")
        matched = f", matched a {match}" if match else ""
        outcome = f": {kernel} ({how}{matched})" if swapped else f": {reason}"
        lines.append(f"{'swapped' if swapped else 'kept   '} {len(locations)} x {kind} {target}{outcome}  [{shown}]")
    return lines


@dataclass
class CompileReport:
    """Everything the backend did while the report was collected (all graphs, all recompiles)."""

    graphs: list[GraphReport] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # coverage: kernels bound to nothing, classes without a kernel

    @property
    def regions(self) -> list[RegionReport]:
        return [r for g in self.graphs for r in g.regions]

    @property
    def swapped(self) -> list[RegionReport]:
        return [r for r in self.regions if r.swapped]

    @property
    def not_swapped(self) -> list[RegionReport]:
        return [r for r in self.regions if not r.swapped]

    @property
    def graph_count(self) -> int:
        return len(self.graphs)

    @property
    def graph_breaks(self) -> int:
        return sum(g.graph_break is not None for g in self.graphs)

    def summary(self) -> str:
        ms = sum(g.total_ms for g in self.graphs)
        head = (
            f"twinkle: {self.graph_count} graph(s), {self.graph_breaks} graph break(s), "
            f"{len(self.swapped)} region(s) swapped, {len(self.not_swapped)} kept; passes took {ms:.1f} ms"
        )
        return "\n".join([head, *(g.summary() for g in self.graphs), *self.notes])

    def __str__(self) -> str:
        ms = sum(g.total_ms for g in self.graphs)
        head = (
            f"twinkle: {self.graph_count} graph(s), {self.graph_breaks} graph break(s), "
            f"{len(self.swapped)} region(s) swapped, {len(self.not_swapped)} kept; passes took {ms:.1f} ms"
        )
        return "\n".join([head, *(str(g) for g in self.graphs), *self.notes])


_COLLECTORS: contextvars.ContextVar[tuple[CompileReport, ...]] = contextvars.ContextVar("twinkle_fx_reports", default=())


def active_reports() -> tuple[CompileReport, ...]:
    return _COLLECTORS.get()


@contextlib.contextmanager
def collect_reports() -> Iterator[CompileReport]:
    """Collect the report of every graph the ``twinkle`` backend compiles inside the block.

    Compilation happens at the first call of a compiled model, so call it inside the block.
    """
    report = CompileReport()
    token = _COLLECTORS.set(_COLLECTORS.get() + (report,))
    try:
        yield report
    finally:
        _COLLECTORS.reset(token)
