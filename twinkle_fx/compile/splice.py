"""Splice a bound kernel into the graph: shape guard, traceable call or opaque wrapper, rewrite."""

from __future__ import annotations

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from ..core.modes import Mode
from ..core.selection import KernelChoice
from .dynamo_internals import example_value
from .equivalence import static_inputs
from .kernel_call import KernelCall
from .opaque import opaque_call
from .pipeline import PassState
from .reasons import KeepRegion, ReasonKind
from .regions import Region, region_graph_module
from .rewrite import replace_region
from .swap_policy import keep_inductor_reason

__all__ = ["place_kernel"]


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
    state: PassState, region: Region, call: KernelCall, choice: KernelChoice
) -> tuple[str, dict[fx.Node, fx.Node]]:
    """Rewrite ``region`` to call ``call``; returns how (for the report) and what replaced each output.

    A kernel declared ``can_torch_compile`` is run once on fake inputs: its outputs must have the
    region's shapes and dtypes (the shape guard), and it is then called directly so its custom
    ops enter the graph. Otherwise it is run once on random inputs of the region's shapes (it
    cannot see fake tensors) under the same guard, and wrapped in an opaque custom op (see
    :mod:`.opaque`). A kernel that fails either trial is never installed: the region is kept
    (:class:`KeepRegion`, with the error), so the compiled model never crashes where the original runs.
    """
    first = example_value(region.call_args[0]) if region.call_args else None
    kept = keep_inductor_reason(state.options.applied_swap_policy, choice.name, state.device, state.mode, first)
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
        if Mode.TRAINING in state.mode and not choice.has_backward:
            raise KeepRegion(ReasonKind.INFERENCE_ONLY, "inference-only kernel (has_backward=False) in training")
        trial = "random inputs of the region's shapes"
        try:
            with torch.no_grad():
                result = call(*[_random_like(v) for v in inputs])
        except Exception as e:  # the kernel's own error, shown in the report
            raise KeepRegion(ReasonKind.KERNEL_FAILED, f"the kernel fails on {trial}: {e!r}", e) from None
    got = pytree.tree_leaves(result)
    if [_describe(v) for v in got] != [_describe(v) for v in expected]:
        raise KeepRegion(ReasonKind.SHAPE_GUARD, (
            f"shape guard: on {trial} the kernel returns {', '.join(map(_describe, got))} where the region "
            f"produces {', '.join(map(_describe, expected))}"
        ))
    if choice.can_torch_compile:
        how = "custom op call"
    else:
        why_opaque = "can_torch_compile=False"
        reference = region_graph_module(state.gm, region.nodes, region.call_args, region.outputs, region.constant_inputs)
        wrapped = opaque_call(call, reference, training=Mode.TRAINING in state.mode)
        if isinstance(wrapped, str):
            raise KeepRegion(ReasonKind.NOT_WRAPPABLE, f"cannot compile ({why_opaque}) and cannot be wrapped: {wrapped}")
        how, call = f"opaque custom op, {why_opaque}", wrapped
    call_node, replaced = replace_region(state.gm, region, call)
    state.scratch.kernel_calls.add(call_node)
    return how, replaced
