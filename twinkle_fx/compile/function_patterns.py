"""Function patterns: calls of a registered function, and copies of it in other modules.

Each registered function target has a pattern traced by Dynamo the first time the backend needs
it (:mod:`.pattern_tracing`). ``SubgraphMatcher`` finds it with literals as wildcards (Dynamo bakes
shapes into them); every match is then bound (placeholders are the function's tensor arguments,
float constants are read from the matched nodes) and checked against the reference function on
the matched shapes (:mod:`.equivalence`) before the kernel replaces it.

Which matches count (``RegionReport.match`` says which each was):

- ``call``: the matched nodes come from an inlined call of the function itself;
- ``copy``: they come from a function of the same name in another module that computes the same
  thing (``apply_rotary_pos_emb`` registered for Qwen2 also catches Llama's copy; a rotary with
  another ``unsqueeze_dim`` fails the check);
- ``computation``: the bare computation anywhere else, only for registrations made with
  ``match_anywhere=True`` (a registered ``add(x, y)`` must not rewrite every residual add).
"""

from __future__ import annotations

import logging
import re
import sys
from typing import Any

import torch

import torch.fx as fx
import torch.utils._pytree as pytree
from torch.fx.passes.utils.matcher_utils import InternalMatch, SubgraphMatcher

from ..selection import Selection, select_function_kernel
from .equivalence import StructuralKeys, aten_outputs, static_inputs
from .kernel_call import FunctionKernelCall
from .pattern_tracing import TracedPattern, pattern_for
from .place import place_kernel
from .regions import GraphContext, Region, external_outputs, fake_value, region_graph_module, region_signature
from .report import RegionReport

logger = logging.getLogger(__name__)

__all__ = ["swap_function_patterns", "registered_patterns"]


def registered_patterns(ctx: GraphContext) -> tuple[list[tuple[list[str], TracedPattern]], dict[str, str]]:
    if ctx.patterns is None:
        ctx.patterns = _registered_patterns(ctx)
    return ctx.patterns


def _registered_patterns(ctx: GraphContext) -> tuple[list[tuple[list[str], TracedPattern]], dict[str, str]]:
    """Patterns of the registered targets, largest first, and why the others have none.

    Targets whose patterns are the same graph (each transformers modeling file has its own copy of
    ``apply_rotary_pos_emb``) share one entry: the graph is searched once for all of them.
    """
    groups: dict[str, tuple[list[str], TracedPattern]] = {}
    missing = {}
    for target in ctx.registry.function_targets():
        pattern = pattern_for(ctx.registry, target)
        if isinstance(pattern, str):
            missing[target] = pattern
        else:
            groups.setdefault(pattern.code, ([], pattern))[0].append(target)
    patterns = sorted(groups.values(), key=lambda tp: -sum(n.op.startswith("call") for n in tp[1].graph.nodes))
    return patterns, missing


_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<name>\S+)')


def match_kind(target: str, nodes: list[fx.Node]) -> str:
    """"call", "copy" or "computation": where the matched nodes came from (see the module docstring)."""
    module_name, _, func_name = target.rpartition(".")
    filename = getattr(sys.modules.get(module_name), "__file__", None)
    traces = [_FRAME.findall(n.meta.get("stack_trace") or "") for n in nodes]
    traces = [frames for frames in traces if frames]  # nodes Dynamo made itself carry none
    if not traces:
        return "computation"
    if all(any(name == func_name and file == filename for file, _, name in frames) for frames in traces):
        return "call"
    if all(any(name == func_name for _, _, name in frames) for frames in traces):
        return "copy"
    return "computation"


def _matches_anywhere(ctx: GraphContext, target: str, selection: Selection) -> bool:
    if selection.choice is not None:
        return bool(getattr(selection.choice.registration, "match_anywhere", False))
    return any(r.match_anywhere for modes in ctx.registry.function_registrations(target).values() for r in modes.values())


def _target_of(targets: list[str], selections: dict[str, Selection], nodes: list[fx.Node]) -> str:
    """The target whose own file the matched code came from, else the first one with a kernel."""
    trace = nodes[-1].meta.get("stack_trace") or ""
    for target in targets:
        module = sys.modules.get(target.rpartition(".")[0])
        if getattr(module, "__file__", None) and f'"{module.__file__}"' in trace and selections[target].ok:
            return target
    return next((t for t in targets if selections[t].ok), targets[0])


def swap_function_patterns(ctx: GraphContext, reports: list[RegionReport]) -> int:
    patterns, _ = registered_patterns(ctx)
    swapped = 0
    for targets, pattern in patterns:
        selections = {
            t: select_function_kernel(ctx.registry, t, ctx.device, ctx.mode, allow_uncompilable=True) for t in targets
        }
        matcher = SubgraphMatcher(pattern.graph, match_output=False, match_placeholder=False,
                                  remove_overlapping_matches=True, ignore_literals=True)
        renamed: dict[fx.Node, fx.Node] = {}  # outputs of earlier matches -> the call results replacing them
        for match in matcher.match(ctx.gm.graph):
            nodes = [n for p, n in match.nodes_map.items() if p.op not in ("placeholder", "output")]
            if any(getattr(n, "_erased", False) for n in nodes):
                continue  # overlapped a region another pattern already replaced
            order = {n: i for i, n in enumerate(ctx.gm.graph.nodes)}
            nodes.sort(key=order.__getitem__)
            target = _target_of(targets, selections, nodes)
            kind = match_kind(target, nodes)
            if kind == "computation" and not _matches_anywhere(ctx, target, selections[target]):
                continue  # not a call of the function: not a candidate (match_anywhere=False)
            region = Region("function", target, _location(nodes), nodes)
            ctx.matched.update(nodes)
            report = RegionReport("function", target, region.location, match=kind)
            reports.append(report)
            report.reason = _swap(ctx, region, pattern, match, selections[target], renamed, report)
            swapped += report.reason is None
    return swapped


def _location(nodes: list[fx.Node]) -> str:
    # the innermost module of the compiled model (a path under L[...]); module-valued globals such
    # as transformers' kernels-wrapped apply_rotary_pos_emb (G[...]) say nothing about where
    for path, _ in reversed(list((nodes[-1].meta.get("nn_module_stack") or {}).values())):
        if path.startswith("L["):
            path = path.split("]", 1)[1].lstrip(".")
            if not path.startswith("_"):
                return f"{path or '<root>'} ({nodes[-1].name})"
    return nodes[-1].name


def _swap(
    ctx: GraphContext,
    region: Region,
    pattern: TracedPattern,
    match: InternalMatch,
    selection: Selection,
    renamed: dict[fx.Node, fx.Node],
    report: RegionReport,
) -> str | None:
    if selection.choice is None:
        return selection.reason
    choice = selection.choice
    report.kernel = str(choice)
    # arguments in the function's own order, so the call reads like the source
    position = {name: i for i, name in enumerate(pattern.signature.parameters)}
    named = sorted(zip(pattern.placeholder_params, match.placeholder_nodes), key=lambda pair: position[pair[0]])
    names = [name for name, _ in named]
    args = [renamed.get(n, n) for _, n in named]
    constants = _constants(pattern, match)
    bound = _bind(ctx, region, pattern, names, args, constants)
    if isinstance(bound, str):
        return bound
    call = FunctionKernelCall(
        f"func_{pattern.name.rpartition('.')[2]}", choice.call, pattern.signature,
        names, constants, bound, single=len(region.outputs) == 1,
    )
    reason = place_kernel(ctx, region, call, choice, report)
    renamed.update(region.replaced)
    return reason


def _constants(pattern: TracedPattern, match: InternalMatch) -> dict[str, Any]:
    by_name = {p.name: n for p, n in match.nodes_map.items()}
    constants: dict[str, Any] = {}
    for param, node_name, index in pattern.scalar_slots:
        node = by_name.get(node_name)
        if node is not None:
            leaves = pytree.tree_leaves((node.args, dict(node.kwargs)))
            if index < len(leaves) and isinstance(leaves[index], (int, float)):
                constants.setdefault(param, leaves[index])
    return constants


def _bind(
    ctx: GraphContext, region: Region, pattern: TracedPattern, names: list[str], args: list[fx.Node], constants: dict[str, Any]
) -> list[int] | str:
    """Check the match computes the reference on these shapes; returns which result leaf each output is."""
    outputs = external_outputs(region.nodes)
    if not outputs:
        return "nothing outside the match reads its result"
    key = (pattern.name, tuple(names), tuple(sorted(constants.items())), region_signature(region.nodes, args, outputs))
    if key not in ctx.bindings:
        ctx.bindings[key] = _check(ctx, region, pattern, names, args, constants, outputs)
    found = ctx.bindings[key]
    if isinstance(found, list):
        region.call_args = args
        region.outputs = outputs
    return found


def _check(
    ctx: GraphContext, region: Region, pattern: TracedPattern, names: list[str], args: list[fx.Node],
    constants: dict[str, Any], outputs: list[fx.Node],
) -> list[int] | str:
    try:
        statics = static_inputs([fake_value(n) for n in args])
    except ValueError as e:
        return f"cannot build example inputs: {e}"
    keys = StructuralKeys()

    def reference(*values: Any) -> Any:
        return pattern.reference(**dict(zip(names, values)), **constants)

    try:
        region_keys = keys.outputs(aten_outputs(region_graph_module(ctx.gm, region.nodes, args, outputs), statics))
        ref_keys = keys.outputs(aten_outputs(reference, statics))
    except Exception as e:
        return f"the match could not be checked on fake tensors: {e!r}"
    if not all(k in ref_keys for k in region_keys):
        shown = ", ".join(f"{k}={v!r}" for k, v in constants.items())
        return (
            f"matches the pattern of {pattern.name} structurally but computes something else on these "
            f"shapes/constants{' (' + shown + ')' if shown else ''}"
        )
    return [ref_keys.index(k) for k in region_keys]
