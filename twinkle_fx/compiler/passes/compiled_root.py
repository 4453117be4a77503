"""The compiled module itself: a target class the graph rewrite cannot swap, reported instead.

Dynamo's module stack names the submodules a node came from, never the module whose ``forward``
is the frame being compiled, and that forward's return value is rebuilt outside the graph. So a
kernel bound to the compiled module's class (the built-in fused-loss head bound to
``*ForCausalLM``) cannot be applied by a rewrite. Without this pass it would be silently unused;
the report says so and how to get it (``twinkle_fx.compile``, or ``kernelize_model`` first).
Whether the root is a target is the selection's answer, as everywhere: subclasses of bound
classes and classes tagged with a registered ``kernel_layer_name`` are.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from ...core.caches import owns_cache
from ...core.selection import select_layer_kernel
from ...core.swaps import swapped_forward
from ...core.torch_internals import current_compile_context
from ..graph.dynamo import SourceRef, input_source, parse_source
from ..pipeline import Kept, Outcome, PassState
from ...core.reasons import Reason, ReasonKind

__all__ = ["run"]

# module -> the frame compilation (Dynamo's CompileContext) that reported it. DDPOptimizer hands the
# backend one subgraph per gradient bucket of the same frame, each with the root's parameters among
# its inputs: without this the root was reported once per bucket (26 times for Qwen2-0.5B, 25 MB buckets).
_REPORTED: weakref.WeakKeyDictionary[torch.nn.Module, Any] = weakref.WeakKeyDictionary()
owns_cache(__name__, _REPORTED.clear)


def _frame_parameter(state: PassState) -> tuple[SourceRef, torch.Tensor] | None:
    """One parameter input read through a local of the compiled frame, and its tensor."""
    for node, value in state.placeholder_values.items():
        ref = parse_source(input_source(node))
        if ref is not None and ref.scope == "L" and ref.member == "parameter" and isinstance(value, torch.Tensor):
            return ref, value
    return None


def _holds(module: torch.nn.Module, ref: SourceRef, tensor: torch.Tensor) -> bool:
    """Whether ``module`` is the frame local ``ref`` starts from (it holds the parameter on that path)."""
    for key in ref.modules:
        module = module._modules.get(key)
        if module is None:
            return False
    return module._parameters.get(ref.attribute) is tensor


def _target_classes(state: PassState) -> tuple[type, ...]:
    """Classes bound explicitly, their subclasses, and classes tagged (or inheriting a tag) with a
    registered ``kernel_layer_name``: where the heap must be searched when the frame cannot say."""
    names = set(state.registry.layer_kernel_names())
    bound = tuple(state.registry.bindings())
    found: set[type] = set()
    todo = [torch.nn.Module]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if (bound and issubclass(cls, bound)) or getattr(cls, "kernel_layer_name", None) in names:
            found.add(cls)
    return tuple(found)


def run(state: PassState) -> list[Outcome]:
    """A Kept outcome for the compiled module when a kernel is selected for its class."""
    found = _frame_parameter(state)
    if found is None:
        return []
    ref, tensor = found
    root = state.modules.resolve(SourceRef(ref.scope, ref.name, (), None, None, ref.items))
    if isinstance(root, torch.nn.Module):
        candidates = [root]
    else:  # the frame is not at hand (a backend called directly): search the heap, once
        classes = _target_classes(state)
        candidates = state.modules.instances(classes) if classes else []
    for module in candidates:
        if not isinstance(module, torch.nn.Module) or swapped_forward(module) is not None:
            continue
        if not _holds(module, ref, tensor):
            continue
        selection = select_layer_kernel(state.registry, type(module), state.device, state.mode)
        if selection is None or selection.choice is None:
            continue
        compilation = current_compile_context()
        if compilation is not None:
            if _REPORTED.get(module) is compilation:
                return []  # another piece of this frame's compilation already reported it
            _REPORTED[module] = compilation
        return [Kept(
            "layer", selection.target, "<compiled module>", Reason(ReasonKind.COMPILED_ROOT, (
                "the module being compiled, which a graph rewrite never swaps (its forward is the compiled "
                "frame, no graph region): twinkle_fx.compile(model) installs this kernel before compiling, "
                "as does torch.compile(kernelize_model(model, mode=...), backend='twinkle')")),
            kernel=str(selection.choice),
        )]
    return []
