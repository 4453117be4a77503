"""Layers whose ``forward`` another tool replaced (``kernels.kernelize``): reported, never rewritten.

Dynamo inlines whatever ``module.forward`` is, so the graph already runs the other tool's kernel;
without this pass such a model reads "no registered layer or function found". Only classes that
``kernels.kernelize`` can swap (those carrying ``kernel_layer_name``) are looked at, so the pass
costs nothing for other models. Functions that ``kernels`` wraps as modules (classes defined in the
``kernels`` package, global instances) are skipped: ``kernels.kernelize`` swaps them only through
``use_kernelized_func``.
"""

from __future__ import annotations

from ...core.admission import foreign_forward_reason
from ..graph.dynamo import module_stack
from ..pipeline import Kept, Outcome, PassState

__all__ = ["run"]


def run(state: PassState) -> list[Outcome]:
    """One Kept outcome per module instance in the graph whose forward another tool replaced (and
    that no earlier pass reported)."""
    seen = {o.location for o in state.scratch.outcomes}
    outcomes: list[Outcome] = []
    for node in state.gm.graph.nodes:
        for frame in module_stack(node):
            cls = frame.cls
            if not isinstance(cls, type) or not isinstance(getattr(cls, "kernel_layer_name", None), str):
                continue
            if cls.__module__.split(".", 1)[0] == "kernels":
                continue
            if frame.location in seen:
                continue
            seen.add(frame.location)
            module = state.modules.find(frame)
            reason = None if module is None else foreign_forward_reason(module)
            if reason is not None:
                outcomes.append(Kept("layer", f"{cls.__qualname__} -> {cls.kernel_layer_name}", frame.location, reason))
    return outcomes
