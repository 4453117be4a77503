"""The compiled module itself: a target class the graph rewrite cannot swap, reported instead.

Dynamo's ``nn_module_stack`` names the submodules a node came from, never the module whose
``forward`` is the frame being compiled, and that forward's return value is rebuilt outside the
graph. So a kernel bound to the compiled module's class (the built-in fused-loss head bound to
``*ForCausalLM``) cannot be applied by a rewrite. Without this pass it would be silently unused;
the report says so and how to get it (``kernelize_model`` first).
"""

from __future__ import annotations

import gc
import re
import weakref
from typing import Any

import torch

from ..eager.layers import swapped_forward
from ..selection import select_layer_kernel
from .regions import GraphContext
from .report import RegionReport

__all__ = ["report_compiled_root"]


# module -> the frame compilation (Dynamo's CompileContext) that reported it. DDPOptimizer hands the
# backend one subgraph per gradient bucket of the same frame, each with the root's parameters among
# its inputs: without this the root was reported once per bucket (26 times for Qwen2-0.5B, 25 MB buckets).
_REPORTED: weakref.WeakKeyDictionary[torch.nn.Module, Any] = weakref.WeakKeyDictionary()

_PARAMETER_SOURCE = re.compile(r"^L\[[^\]]+\]((?:\._modules\['[^']+'\])*)\._parameters\['([^']+)'\]$")


def _frame_parameter(ctx: GraphContext) -> tuple[list[str], str, torch.Tensor] | None:
    """One parameter input as (submodule path, name, tensor), relative to a local of the compiled frame."""
    for node, value in ctx.placeholder_values.items():
        source = getattr(getattr(node.meta.get("grapharg"), "source", None), "name", None)
        match = _PARAMETER_SOURCE.match(source() if callable(source) else source or "")
        if match and isinstance(value, torch.Tensor):
            return re.findall(r"\['([^']+)'\]", match.group(1)), match.group(2), value
    return None


def _is_frame_local(module: torch.nn.Module, path: list[str], name: str, tensor: torch.Tensor) -> bool:
    for key in path:
        module = module._modules.get(key)
        if module is None:
            return False
    return module._parameters.get(name) is tensor


def _target_classes(ctx: GraphContext) -> tuple[type, ...]:
    """Classes bound explicitly, their subclasses, and classes tagged ``kernel_layer_name`` with registrations."""
    names = set(ctx.registry.layer_kernel_names())
    bound = tuple(ctx.registry.bindings())
    found: set[type] = set()
    todo = [torch.nn.Module]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if (bound and issubclass(cls, bound)) or cls.__dict__.get("kernel_layer_name") in names:
            found.add(cls)
    return tuple(found)


def report_compiled_root(ctx: GraphContext, reports: list[RegionReport]) -> int:
    """Report the compiled module when its class is a target; returns 1 if it did, else 0."""
    classes = _target_classes(ctx)
    found = _frame_parameter(ctx) if classes else None
    if found is None:
        return 0
    # one heap scan for all candidate classes (an instance refers to its own class only, so
    # subclasses of bound classes are listed too)
    for module in gc.get_referrers(*classes):
        if not isinstance(module, torch.nn.Module) or type(module) not in classes:
            continue
        if swapped_forward(module) is not None or not _is_frame_local(module, *found):
            continue
        selection = select_layer_kernel(ctx.registry, type(module), ctx.device, ctx.mode)
        if selection is None or selection.choice is None:
            continue
        compilation = torch._guards.CompileContext.try_get()
        if compilation is not None:
            if _REPORTED.get(module) is compilation:
                return 0  # another piece of a frame already reported
            _REPORTED[module] = compilation
        reports.append(RegionReport(
            "layer", selection.target, "<compiled module>", kernel=str(selection.choice),
            reason="the module being compiled is no graph region (its forward is the compiled frame): "
                   "kernelize it first, torch.compile(kernelize_model(model, mode=...), backend='twinkle')",
        ))
        return 1
    return 0
