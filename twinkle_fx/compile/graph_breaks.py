"""Graph breaks: where Dynamo ended a graph early, and which registered region that split.

A break inside a registered layer or function means Dynamo did not inline that call: the graph
stops before it and the callee's frame is compiled on its own, without the module or function
marker. So no region is ever found for it; this pass reports it instead, from the break's user
stack (``gm.compile_subgraph_reason``).
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from ..selection import is_layer_target
from .regions import GraphContext
from .report import RegionReport

__all__ = ["note_graph_break"]


def _last_line(code: Any) -> int:
    return max((line for _, _, line in code.co_lines() if line is not None), default=code.co_firstlineno)


def _registered_classes(ctx: GraphContext) -> list[tuple[type, str]]:
    classes = dict(ctx.registry.bindings())
    todo = [torch.nn.Module]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if isinstance(cls.__dict__.get("kernel_layer_name"), str):
            classes.setdefault(cls, cls.__dict__["kernel_layer_name"])
    return [(cls, ctx.registry.kernel_name_for(cls) or name) for cls, name in classes.items()
            if is_layer_target(ctx.registry, cls)]


def _containing_target(ctx: GraphContext, frame: Any) -> tuple[str, str] | None:
    """``(kind, target)`` when ``frame`` lies in a registered layer's forward or a registered function."""
    for target in ctx.registry.function_targets():
        module_name, _, func_name = target.rpartition(".")
        module = sys.modules.get(module_name)
        if frame.name == func_name and module is not None and getattr(module, "__file__", None) == frame.filename:
            return "function", target
    for cls, kernel_name in _registered_classes(ctx):
        code = getattr(cls.__dict__.get("forward"), "__code__", None)
        if code is not None and code.co_filename == frame.filename and code.co_firstlineno <= frame.lineno <= _last_line(code):
            return "layer", f"{cls.__qualname__} -> {kernel_name}"
    return None


def note_graph_break(ctx: GraphContext, reports: list[RegionReport]) -> tuple[int, str | None]:
    """Report registered targets a graph break split; returns (count, the break's description)."""
    reason = ctx.graph_break
    if reason is None or not getattr(reason, "graph_break", False):
        return 0, None
    stack = list(getattr(reason, "user_stack", None) or [])
    first_line = str(getattr(reason, "reason", "")).strip().splitlines()[0] if getattr(reason, "reason", "") else "?"
    where = f"{stack[-1].filename}:{stack[-1].lineno} in {stack[-1].name}" if stack else "unknown location"
    description = f"{first_line} ({where})"
    found = 0
    for frame in stack:
        hit = _containing_target(ctx, frame)
        if hit is not None:
            kind, target = hit
            reports.append(RegionReport(kind, target, f"{frame.filename}:{frame.lineno}",
                                        reason=f"graph break split the region: {first_line}"))
            found += 1
    return found, description
