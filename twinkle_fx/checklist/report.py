"""What :func:`check_kernels` returns: a verdict per checklist item per kernel, the numbers behind
each, and the table ``twinkle-fx check`` prints."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

__all__ = ["CheckInputs", "CorrectnessCase", "SpeedCase", "KernelCheck", "CheckReport", "CHECKLIST",
           "SPEEDUP_BAR", "PASS", "FAIL", "WARN", "NA", "SKIP"]

SPEEDUP_BAR = 1.2  # the guide's "clear speed-up over the PyTorch implementation"
PASS, FAIL, WARN, NA, SKIP = "PASS", "FAIL", "WARN", "N/A", "SKIP"
CHECKLIST = ("correctness", "speed-up", "sizes", "memory", "fallback", "profiler", "documented")


@dataclass
class CheckInputs:
    """What one check call runs: ``module`` (layers; None for functions) called with ``args`` / ``kwargs``.

    A maker passed in ``inputs=`` is ``make(rows, dtype, device) -> CheckInputs``; ``rows`` is the
    size being checked (tokens), e.g.::

        check_kernels(inputs={MyLayer: lambda rows, dtype, device: CheckInputs(
            (torch.randn(rows, 96, dtype=dtype, device=device),), module=MyLayer(96).to(device, dtype))})
    """

    args: tuple
    kwargs: dict = field(default_factory=dict)
    module: torch.nn.Module | None = None
    # positions in ``args`` that take no gradient (e.g. rotary cos/sin); other float tensors do in training
    no_grad_args: tuple[int, ...] = ()


@dataclass(frozen=True)
class CorrectnessCase:
    """One size x dtype: the worst error relative to the tolerance (``<= 1`` passes)."""

    shape: str
    dtype: str
    forward_error: float  # max |kernel - original| of the outputs
    backward_error: float | None  # of the gradients; None when checked forward only
    passed: bool
    error: str | None = None  # the kernel (or the original) raised


@dataclass(frozen=True)
class SpeedCase:
    shape: str
    dtype: str
    what: str  # "eager fwd+bwd", "compiled fwd", ...
    original_ms: float
    kernel_ms: float
    original_peak_mib: float | None = None  # GPU only
    kernel_peak_mib: float | None = None

    @property
    def speedup(self) -> float:
        return self.original_ms / self.kernel_ms if self.kernel_ms > 0 else math.inf


@dataclass
class KernelCheck:
    """The checklist for one kernel against one original."""

    kernel: str  # kernel name (layers) or the replacement (functions)
    target: str  # the original: "Qwen2MLP" or "module.func"
    kind: str  # "layer" or "function"
    source: str = ""  # where the kernel comes from
    mode: str = ""  # "train" (forward + backward) or "inference"
    verdicts: dict[str, str] = field(default_factory=dict)  # checklist item -> PASS/FAIL/WARN/N/A/SKIP
    notes: dict[str, str] = field(default_factory=dict)  # checklist item -> why / numbers
    correctness: list[CorrectnessCase] = field(default_factory=list)
    speed: list[SpeedCase] = field(default_factory=list)
    profile: list[dict[str, Any]] = field(default_factory=list)  # top profiler rows

    @property
    def failed(self) -> bool:
        return self.verdicts.get("correctness") == FAIL


@dataclass
class CheckReport:
    device: str
    tiny: bool
    dtypes: list[str]
    checks: list[KernelCheck]
    environment: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        """A correctness failure (what makes ``twinkle-fx check`` exit with status 1)."""
        return any(c.failed for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for check, raw in zip(self.checks, data["checks"]):
            for case, row in zip(check.speed, raw["speed"]):
                row["speedup"] = case.speedup
        return data

    def __str__(self) -> str:
        header = ["kernel", "original", *CHECKLIST]
        rows = [header] + [[c.kernel, c.target, *(c.verdicts.get(item, "-") for item in CHECKLIST)] for c in self.checks]
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        lines = [f"twinkle-fx check on {self.device}{' (--tiny, Triton interpreter)' if self.tiny else ''}, "
                 f"dtypes {', '.join(self.dtypes)}", ""]
        for index, row in enumerate(rows):
            lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
            if index == 0:
                lines.append("  ".join("-" * w for w in widths))
        for check in self.checks:
            lines.append("")
            lines.append(f"{check.kernel} vs {check.target} [{check.mode}] from {check.source}")
            for item in CHECKLIST:
                if item in check.notes:
                    lines.append(f"  {item}: {check.notes[item]}")
                if item == "profiler":  # its rows under its note, before the next item
                    lines.extend(f"    {row['name'][:60]:60s} {row['calls']:>5d} calls  {row['time_ms']:9.3f} ms "
                                 f"{row['clock']}" for row in check.profile[:5])
        if not self.checks:
            lines.append("(nothing registered to check)")
        return "\n".join(lines)
