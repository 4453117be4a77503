"""Graph breaks: where Dynamo ended a graph early, and which registered region that split.

A break inside a registered layer or function means Dynamo did not inline that call: the graph
stops before it and the callee's frame is compiled on its own, without the module or function
marker. So no region is ever found for it; this pass reports it instead, from the break's user
stack (:func:`~..dynamo_internals.graph_break`), innermost frame first, naming the class whose own
``forward`` holds the frame. Decorated forwards are unwrapped: transformers wraps every
``*ForCausalLM.forward`` in one shared wrapper, whose frames belong to no class.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

import torch

from ...core.selection import is_layer_target
from ..graph.dynamo import Frame
from ..pipeline import Kept, Outcome, PassState
from ...core.reasons import Reason, ReasonKind

__all__ = ["run"]


def _lines(code: Any) -> tuple[int, int]:
    last = max((line for _, _, line in code.co_lines() if line is not None), default=code.co_firstlineno)
    return code.co_firstlineno, last


def _own_code(cls: type) -> Any:
    """The code of ``cls``'s own ``forward``, under any decorators (None when it defines none)."""
    forward = cls.__dict__.get("forward")
    if forward is None:
        return None
    return getattr(inspect.unwrap(forward), "__code__", None)


def _registered_classes(state: PassState) -> list[tuple[type, str]]:
    classes = dict(state.registry.bindings())
    todo = [torch.nn.Module]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if isinstance(cls.__dict__.get("kernel_layer_name"), str):
            classes.setdefault(cls, cls.__dict__["kernel_layer_name"])
    return [(cls, state.registry.kernel_name_for(cls) or name) for cls, name in classes.items()
            if is_layer_target(state.registry, cls)]


def _containing_target(state: PassState, frame: Frame, classes: list[tuple[type, str]]) -> tuple[str, str] | None:
    """``(kind, target)`` when ``frame`` lies in a registered layer's own forward or a registered function."""
    for target in state.registry.function_targets():
        module_name, _, func_name = target.rpartition(".")
        module = sys.modules.get(module_name)
        if module is None or getattr(module, "__file__", None) != frame.filename:
            continue
        function = getattr(module, func_name, None)
        code = getattr(inspect.unwrap(function), "__code__", None) if callable(function) else None
        if frame.name == func_name or (code is not None and _lines(code)[0] <= frame.lineno <= _lines(code)[1]):
            return "function", target
    for cls, kernel_name in classes:
        code = _own_code(cls)
        if code is not None and code.co_filename == frame.filename:
            first, last = _lines(code)
            if first <= frame.lineno <= last:
                return "layer", f"{cls.__qualname__} -> {kernel_name}"
    return None


def run(state: PassState) -> list[Outcome]:
    """One Kept outcome per registered layer or function whose call a graph break split."""
    found = state.graph_break
    classes = _registered_classes(state) if found is not None or state.compiled_code is not None else []
    outcomes: list[Outcome] = []
    code = state.compiled_code
    if code is not None and state.counted_breaks and found is None:
        # The frame compiled is (the rest of) a registered forward or function after a break no
        # earlier graph ended at: Dynamo could not inline it into its caller (a break on its first
        # line inside nn.Sequential makes Dynamo run the caller eagerly and compile the callee on
        # its own, from the break on).
        start = Frame(code.co_filename, code.co_firstlineno, code.co_name)
        hit = _containing_target(state, start, classes)
        if hit is not None:
            kind, target = hit
            why = state.counted_breaks[-1] if state.counted_breaks else "Dynamo compiled it as a frame of its own"
            outcomes.append(Kept(kind, target, str(start), Reason(
                ReasonKind.GRAPH_BREAK, f"graph break split the region: {why} (its code is compiled as a frame of "
                "its own, so it is no region of a graph)")))
    if found is None:
        return outcomes
    for frame in found.user_stack:
        hit = _containing_target(state, frame, classes)
        if hit is not None:
            kind, target = hit
            outcomes.append(Kept(kind, target, f"{frame.filename}:{frame.lineno}",
                                 Reason(ReasonKind.GRAPH_BREAK, f"graph break split the region: {found.reason}")))
    return outcomes
