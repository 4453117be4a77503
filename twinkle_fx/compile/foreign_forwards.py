"""Layers whose ``forward`` another tool replaced (``kernels.kernelize``): reported, never rewritten.

Dynamo inlines whatever ``module.forward`` is, so the graph already runs the other tool's kernel;
without this pass such a model reads "no registered layer or function found". Only classes that
``kernels.kernelize`` can swap (those carrying ``kernel_layer_name``) are looked at, so the pass
costs nothing for other models. Functions that ``kernels`` wraps as modules (classes defined in the
``kernels`` package, global instances) are skipped: finding their instance takes a heap scan (39 ms
per graph for a tiny Qwen2 on CPU), and ``kernels.kernelize`` swaps them only through
``use_kernelized_func``.
"""

from __future__ import annotations

from ..kernels_mapping import foreign_forward
from .layer_regions import _location
from .regions import GraphContext
from .report import RegionReport

__all__ = ["report_foreign_forwards"]


def report_foreign_forwards(ctx: GraphContext, reports: list[RegionReport]) -> int:
    """One kept-region report per module instance in the graph whose forward another tool replaced
    (and that no earlier pass reported); returns how many."""
    seen = {r.location for r in reports}
    found = 0
    for node in ctx.gm.graph.nodes:
        for key, (path, cls) in (node.meta.get("nn_module_stack") or {}).items():
            if not isinstance(cls, type) or not isinstance(getattr(cls, "kernel_layer_name", None), str):
                continue
            if cls.__module__.split(".", 1)[0] == "kernels":
                continue
            location = _location(path, key)
            if location in seen:
                continue
            seen.add(location)
            module = ctx.modules.find(key, cls)
            who = None if module is None else foreign_forward(module)
            if who is None:
                continue
            reports.append(RegionReport(
                "layer", f"{cls.__qualname__} -> {cls.kernel_layer_name}", location,
                reason=f"forward replaced by {who}: the graph runs that kernel as it is (twinkle_fx leaves it)",
            ))
            found += 1
    return found
