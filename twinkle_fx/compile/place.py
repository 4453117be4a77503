"""Put a bound kernel into the graph: shape guard, traceable call or opaque wrapper, rewrite."""

from __future__ import annotations

import torch
import torch.utils._pytree as pytree

from ..modes import Mode
from ..selection import KernelChoice
from .equivalence import static_inputs
from .kernel_call import KernelCall
from .opaque import opaque_call
from .regions import GraphContext, Region, fake_value, region_graph_module
from .report import RegionReport
from .rewrite import replace_region
from .swap_policy import keep_inductor_reason

__all__ = ["place_kernel"]


def _describe(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}"
    return repr(value)


def place_kernel(ctx: GraphContext, region: Region, call: KernelCall, choice: KernelChoice, report: RegionReport) -> str | None:
    """Rewrite ``region`` to call ``call``; returns why not, or None when swapped.

    A kernel declared ``can_torch_compile`` is run once on fake inputs: its outputs must have the
    region's shapes and dtypes (the shape guard), and it is then called directly so its custom
    ops enter the graph. Otherwise it is wrapped in an opaque custom op (see :mod:`.opaque`).
    """
    first = fake_value(region.call_args[0]) if region.call_args else None
    kept = keep_inductor_reason(choice.name, ctx.device, ctx.mode, first)  # compilespeed: measured swap policy
    if kept is not None:
        return kept
    statics = static_inputs([fake_value(n) for n in region.call_args] + [fake_value(n) for n in region.outputs])
    inputs, expected = statics.values[: len(region.call_args)], statics.values[len(region.call_args):]
    traceable = choice.can_torch_compile
    why_opaque = "can_torch_compile=False"
    if traceable:
        try:
            with statics.mode:
                result = call(*inputs)
        except Exception as e:
            traceable, why_opaque = False, f"fails on fake tensors: {e!r}"
        else:
            got = pytree.tree_leaves(result)
            if [_describe(v) for v in got] != [_describe(v) for v in expected]:
                return (
                    f"shape guard: the kernel returns {', '.join(map(_describe, got))} where the region "
                    f"produces {', '.join(map(_describe, expected))}"
                )
    if traceable:
        report.how = "custom op call"
        return replace_region(ctx.gm, region, call)
    if Mode.TRAINING in ctx.mode and not choice.has_backward:
        return "inference-only kernel (has_backward=False) in training"
    reference = region_graph_module(ctx.gm, region.nodes, region.call_args, region.outputs)
    wrapped = opaque_call(call, reference, training=Mode.TRAINING in ctx.mode)
    if isinstance(wrapped, str):
        return f"cannot compile ({why_opaque}) and cannot be wrapped: {wrapped}"
    report.how = f"opaque custom op, {why_opaque}"
    return replace_region(ctx.gm, region, wrapped)
