"""Replace a bound region by one call node, keeping everything else the graph needs.

The call goes right after the region's last node (its inputs are all defined by then), or, where
the graph reads an output before that, right after its last input; each output the rest of the
graph reads is re-pointed at the call's result; region nodes nothing reads
any more are erased, except nodes with side effects, which stay with whatever they depend on.
"""

from __future__ import annotations

import operator
from typing import Any

import torch.fx as fx

from .dynamo_internals import example_value, provenance, set_example_value
from .reasons import KeepRegion, ReasonKind
from .regions import Region

__all__ = ["replace_region", "has_side_effects"]


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
