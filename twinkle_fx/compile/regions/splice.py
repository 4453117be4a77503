"""Splice a bound kernel into the graph: the shape guard, a traceable call or an opaque wrapper, and
the rewrite of the region into that one call (:func:`place_kernel`, which ends in :func:`replace_region`).

The call goes right after the region's last node (its inputs are all defined by then), or, where
the graph reads an output before that, right after its last input; each output the rest of the
graph reads is re-pointed at the call's result; region nodes nothing reads
any more are erased, except nodes with side effects, which stay with whatever they depend on.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx

from ...core.modes import Mode
from ...core.selection import KernelChoice
from ...core.torch_internals import tree_leaves
from ..dynamo_internals import example_value, provenance, set_example_value
from ..reasons import KeepRegion, ReasonKind
from ..swap_policy import keep_inductor_reason
from .equivalence import static_inputs
from .kernel_call import KernelCall
from .opaque import opaque_call
from .region import Region, region_graph_module

__all__ = ["place_kernel", "replace_region", "has_side_effects"]


def _describe(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}"
    return repr(value)


def _random_like(value: object) -> object:
    """A real tensor with ``value``'s metadata (normal for floats, small non-negative integers else)."""
    if not isinstance(value, torch.Tensor):
        return value
    if value.is_floating_point() or value.is_complex():
        # a private generator: compiling must not move the user's random stream
        generator = torch.Generator(device=value.device).manual_seed(0)
        return torch.randn(value.shape, dtype=value.dtype, device=value.device, generator=generator)
    return torch.zeros(value.shape, dtype=value.dtype, device=value.device)


def place_kernel(
    gm: fx.GraphModule, region: Region, call: KernelCall, choice: KernelChoice, *, device: str, mode: Mode,
    swap_policy: str,
) -> tuple[str, fx.Node, dict[fx.Node, fx.Node]]:
    """Rewrite ``region`` of ``gm`` to call ``call``; returns how (for the report), the call node, and
    what replaced each output. ``swap_policy``: ``BackendOptions.applied_swap_policy`` (see :mod:`..swap_policy`).

    A kernel declared ``can_torch_compile`` is run once on fake inputs: its outputs must have the
    region's shapes and dtypes (the shape guard), and it is then called directly so its custom
    ops enter the graph. Otherwise it is run once on random inputs of the region's shapes (it
    cannot see fake tensors) under the same guard, and wrapped in an opaque custom op (see
    :mod:`.opaque`). A kernel that fails either trial is never installed: the region is kept
    (:class:`KeepRegion`, with the error), so the compiled model never crashes where the original runs.
    """
    first = example_value(region.call_args[0]) if region.call_args else None
    kept = keep_inductor_reason(swap_policy, choice.name, device, mode, first)
    if kept is not None:
        raise KeepRegion(ReasonKind.SWAP_POLICY, kept)
    statics = static_inputs([example_value(n) for n in region.call_args] + [example_value(n) for n in region.outputs])
    inputs, expected = statics.values[: len(region.call_args)], statics.values[len(region.call_args):]
    if choice.can_torch_compile:
        trial = "fake tensors of the region's shapes"
        try:
            with statics.mode:
                result = call(*inputs)
        except Exception as e:  # the kernel's own error, shown in the report
            raise KeepRegion(ReasonKind.KERNEL_FAILED, f"the kernel fails on {trial}: {e!r}", e) from None
    else:
        if Mode.TRAINING in mode and not choice.has_backward:
            raise KeepRegion(ReasonKind.INFERENCE_ONLY, "inference-only kernel (has_backward=False) in training")
        trial = "random inputs of the region's shapes"
        try:
            with torch.no_grad():
                result = call(*[_random_like(v) for v in inputs])
        except Exception as e:  # the kernel's own error, shown in the report
            raise KeepRegion(ReasonKind.KERNEL_FAILED, f"the kernel fails on {trial}: {e!r}", e) from None
    got = tree_leaves(result)
    if [_describe(v) for v in got] != [_describe(v) for v in expected]:
        raise KeepRegion(ReasonKind.SHAPE_GUARD, (
            f"shape guard: on {trial} the kernel returns {', '.join(map(_describe, got))} where the region "
            f"produces {', '.join(map(_describe, expected))}"
        ))
    if choice.can_torch_compile:
        how = "custom op call"
    else:
        why_opaque = "can_torch_compile=False"
        reference = region_graph_module(gm, region.nodes, region.call_args, region.outputs, region.constant_inputs)
        wrapped = opaque_call(call, reference, training=Mode.TRAINING in mode)
        if isinstance(wrapped, str):
            raise KeepRegion(ReasonKind.NOT_WRAPPABLE, f"cannot compile ({why_opaque}) and cannot be wrapped: {wrapped}")
        how, call = f"opaque custom op, {why_opaque}", wrapped
    call_node, replaced = replace_region(gm, region, call)
    return how, call_node, replaced


def has_side_effects(node: fx.Node) -> bool:
    """Impure for FX, or an in-place method (``x.add_``) or ``setitem``, which FX does not flag."""
    if node.op == "call_method" and isinstance(node.target, str):
        if node.target.endswith("_") and not node.target.startswith("__"):
            return True
    if node.op == "call_function" and node.target is operator.setitem:
        return True
    try:
        return node.is_impure(impure_random=False)
    except TypeError:  # torch < 2.12 has no impure_random
        return node.is_impure()


def _read_before(region: Region, order: dict[fx.Node, int], inside: set[fx.Node], point: fx.Node) -> tuple | None:
    """``(output, user)`` when a node outside the region reads an output before ``point``, else None."""
    for out in region.outputs:
        for user in out.users:
            if user not in inside and order[user] < order[point]:
                return out, user
    return None


def _insertion_point(region: Region, order: dict[fx.Node, int], inside: set[fx.Node]) -> fx.Node:
    """Where the call goes: after the region's last node, or, when the graph reads an output before
    that (Phi3's rotary concatenates q before it rotates k), after the call's last argument."""
    last = max(region.nodes, key=order.__getitem__)
    early = _read_before(region, order, inside, last)
    if early is None:
        return last
    if region.call_args:
        first_possible = max(region.call_args, key=order.__getitem__)
        if _read_before(region, order, inside, first_possible) is None:
            return first_possible
    out, user = early
    raise KeepRegion(ReasonKind.INTERLEAVED, f"its output {out.name} is read by {user.name} before the region's "
                     "inputs are all computed (interleaved computation)")


def replace_region(gm: fx.GraphModule, region: Region, call: Any) -> tuple[fx.Node, dict[fx.Node, fx.Node]]:
    """Insert ``call(*region.call_args)`` and route ``region.outputs`` to it.

    Returns the call node and, for each output, the node now standing for it (a later match that
    read the output reads that instead). Raises :class:`KeepRegion` before touching the graph when
    the rewrite is impossible.
    """
    graph = gm.graph
    inside = set(region.nodes)
    order = {n: i for i, n in enumerate(graph.nodes)}
    last = _insertion_point(region, order, inside)
    with graph.inserting_after(last):
        call_node = graph.call_function(call, tuple(region.call_args))
    values = [example_value(n) for n in region.outputs]
    call_node.meta.update(provenance(region.outputs[-1]))
    if len(region.outputs) == 1:
        set_example_value(call_node, values[0])
        results = [call_node]
    else:
        set_example_value(call_node, tuple(values))
        results = []
        anchor = call_node
        for i, value in enumerate(values):
            with graph.inserting_after(anchor):
                anchor = graph.call_function(operator.getitem, (call_node, i))
            set_example_value(anchor, value)
            results.append(anchor)
    replaced = {}
    for out, result in zip(region.outputs, results):
        out.replace_all_uses_with(result, delete_user_cb=lambda user: user not in inside)
        replaced[out] = result
    for node in sorted(region.nodes, key=order.__getitem__, reverse=True):
        if not node.users and not has_side_effects(node):
            graph.erase_node(node)
    return call_node, replaced
