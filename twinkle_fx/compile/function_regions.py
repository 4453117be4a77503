"""Function regions: nodes that came from an inlined call of a registered function.

Inlined calls leave only ``stack_trace`` (file, line and name of every frame), so a node belongs
to a call of ``module.func`` when one of its frames is ``func`` in that module's file. The
pattern pass swaps these calls (and copies of the function elsewhere); this pass reports each call
it did not swap, with the reason, so a registration that never fires is visible.
"""

from __future__ import annotations

import re
import sys

import torch.fx as fx

from .function_patterns import registered_patterns
from .regions import GraphContext
from .report import RegionReport

__all__ = ["report_function_regions", "function_call_regions"]

_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<name>\S+)')


def function_call_regions(ctx: GraphContext, target: str) -> dict[tuple, list[fx.Node]]:
    """Nodes of each inlined call of ``target``, keyed by the call site (caller frames + module)."""
    module_name, _, func_name = target.rpartition(".")
    module = sys.modules.get(module_name)
    filename = getattr(module, "__file__", None)
    calls: dict[tuple, list[fx.Node]] = {}
    if filename is None:
        return calls
    for node in ctx.gm.graph.nodes:
        if node.op not in ("call_function", "call_method") or "twinkle_region" in node.meta:
            continue
        frames = _FRAME.findall(node.meta.get("stack_trace") or "")
        for depth, (file, line, name) in enumerate(frames):
            if name == func_name and file == filename:
                site = (tuple(frames[:depth]), tuple((node.meta.get("nn_module_stack") or {}).keys()))
                calls.setdefault(site, []).append(node)
                break
    return calls


def report_function_regions(ctx: GraphContext, reports: list[RegionReport]) -> int:
    _, missing = registered_patterns(ctx)
    found = 0
    for target in ctx.registry.function_targets():
        for (callers, _), nodes in function_call_regions(ctx, target).items():
            if any(n in ctx.matched for n in nodes):
                continue  # the pattern pass matched this call and reported it
            found += 1
            where = f"{callers[-1][0]}:{callers[-1][1]} in {callers[-1][2]}" if callers else nodes[0].name
            reason = missing.get(target) or (
                "its pattern did not match this call (traced differently here: other arguments, a "
                "different code path, or part of it outside this graph)"
            )
            reports.append(RegionReport("function", target, where, reason=reason))
    return found
