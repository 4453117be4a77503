"""Calls of registered functions that no rewrite swapped, reported with the reason.

Inlined calls leave only their stack trace (file, line and name of every frame,
:func:`~..dynamo_internals.stack_frames`), so a node belongs to a call of ``module.func`` when one
of its frames is ``func`` in that module's file. The pattern pass swaps these calls (and copies of
the function elsewhere); this pass reports each call it did not take, so a registration that
never fires is visible.
"""

from __future__ import annotations

import sys

import torch.fx as fx

from ..dynamo_internals import module_stack, stack_frames
from ..pipeline import Kept, Outcome, PassState
from ..reasons import Reason, ReasonKind
from ..rewrites.function_patterns import registered_patterns

__all__ = ["run", "function_call_regions"]


def function_call_regions(state: PassState, target: str) -> dict[tuple, list[fx.Node]]:
    """Nodes of each inlined call of ``target``, keyed by the call site (caller frames + module)."""
    module_name, _, func_name = target.rpartition(".")
    filename = getattr(sys.modules.get(module_name), "__file__", None)
    calls: dict[tuple, list[fx.Node]] = {}
    if filename is None:
        return calls
    for node in state.gm.graph.nodes:
        if node.op not in ("call_function", "call_method") or node in state.kernel_calls:
            continue
        frames = stack_frames(node)
        for depth, frame in enumerate(frames):
            if frame.name == func_name and frame.filename == filename:
                site = (tuple(frames[:depth]), tuple(f.key for f in module_stack(node)))
                calls.setdefault(site, []).append(node)
                break
    return calls


def run(state: PassState) -> list[Outcome]:
    """One Kept outcome per call of a registered function that the pattern pass did not take."""
    missing = registered_patterns(state).missing
    outcomes: list[Outcome] = []
    for target in state.registry.function_targets():
        for (callers, _), nodes in function_call_regions(state, target).items():
            if any(n in state.pattern_nodes for n in nodes):
                continue  # the pattern pass matched this call and reported it
            where = str(callers[-1]) if callers else nodes[0].name
            if target in missing:
                reason = Reason(ReasonKind.NO_PATTERN, missing[target])
            else:
                reason = Reason(ReasonKind.NOT_MATCHED, (
                    "its pattern did not match this call (traced differently here: other arguments, a "
                    "different code path, or part of it outside this graph)"))
            outcomes.append(Kept("function", target, where, reason))
    return outcomes
