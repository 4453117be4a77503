"""Function patterns: calls of a registered function, and copies of it in other modules.

Each registered function target has a pattern traced by Dynamo the first time the backend needs
it (:mod:`..regions.pattern_tracing`). ``SubgraphMatcher`` finds it with literals as wildcards (Dynamo bakes
shapes into them); every match is then bound (placeholders are the function's tensor arguments,
float constants are read from the matched nodes) and checked against the reference function on
the matched shapes (:mod:`..regions.region`) before the kernel replaces it.

Which matches count (``RegionReport.match`` says which each was):

- ``call``: the matched nodes come from an inlined call of the function itself;
- ``copy``: they come from a function of the same name in another module that computes the same
  thing (``apply_rotary_pos_emb`` registered for Qwen2 also catches Llama's copy; a rotary with
  another ``unsqueeze_dim`` fails the check);
- ``computation``: the bare computation anywhere else, only for registrations made with
  ``match_anywhere=True`` (a registered ``add(x, y)`` must not rewrite every residual add).
"""

from __future__ import annotations

import inspect
import logging
import sys
from typing import Any

import torch.fx as fx
from torch.fx.passes.utils.matcher_utils import InternalMatch, SubgraphMatcher

from ...core.selection import Selection, select_function_kernel
from ...core.torch_internals import tree_leaves
from ..graph.dynamo import example_value, is_erased, module_stack, stack_frames, stack_frames_of
from ..graph.structure import checkpoint_bodies
from ..regions.region import FunctionKernelCall
from ..regions.pattern_tracing import RegisteredPatterns, TracedPattern, pattern_for, resolve_reference
from ..pipeline import Kept, Outcome, PassState, Swapped
from ..regions.splice import place_kernel
from ...core.reasons import ReasonKind
from ..regions.region import KeepRegion, Region, bind, outputs_read_outside, region_outcome

logger = logging.getLogger(__name__)

__all__ = ["registered_patterns", "match_kind", "region_location", "run"]


def registered_patterns(state: PassState) -> RegisteredPatterns:
    """The patterns of ``state``'s registry, traced once per graph (kept in ``state.scratch.patterns``)."""
    if state.scratch.patterns is None:
        state.scratch.patterns = _registered_patterns(state)
    return state.scratch.patterns


def _registered_patterns(state: PassState) -> RegisteredPatterns:
    # each transformers modeling file has its own copy of apply_rotary_pos_emb: one graph search for all
    groups: dict[str, tuple[list[str], TracedPattern]] = {}
    missing = {}
    traced = _traced_through(state.root.gm)
    for target in _targets_that_could_match(state, traced):
        pattern = pattern_for(state.registry, target)
        if isinstance(pattern, str):
            missing[target] = pattern
        else:
            groups.setdefault(pattern.code, ([], pattern))[0].append(target)
    patterns = sorted(groups.values(), key=lambda tp: -sum(n.op.startswith("call") for n in tp[1].graph.nodes))
    return RegisteredPatterns(patterns, missing, traced)


def _traced_through(gm: fx.GraphModule) -> dict[str, set[str]]:
    """Function name -> the files of the functions of that name that the calls of ``gm``'s graph (and
    of its checkpoint bodies) were inlined from, read from their stack traces."""
    found: dict[str, set[str]] = {}
    graphs = [gm]
    while graphs:
        graph = graphs.pop()
        traces = {n.meta.get("stack_trace") for n in graph.graph.nodes if n.op in ("call_function", "call_method")}
        for trace in traces - {None}:
            for frame in stack_frames_of(trace):
                found.setdefault(frame.name, set()).add(frame.filename)
        graphs.extend(body.body for body in checkpoint_bodies(graph))
    return found


def _names_and_file(target: str) -> tuple[set[str], str | None] | None:
    """The function names a call of ``target`` leaves in stack traces and the file it is defined in;
    None when they cannot be told (not a plain function: its pattern is traced whatever the graph)."""
    module_name, _, func_name = target.rpartition(".")
    module = sys.modules.get(module_name)
    if module is None:  # never imported, so never called here: only a copy elsewhere, named alike, can match
        return {func_name}, None
    try:
        code = getattr(inspect.unwrap(resolve_reference(target)), "__code__", None)
    except Exception:  # noqa: BLE001 - pattern_for reports why it cannot be imported
        return None
    if code is None:
        return None
    return {func_name, code.co_name}, getattr(module, "__file__", None)


def _targets_that_could_match(state: PassState, traced: dict[str, set[str]]) -> list[str]:
    """The registered targets whose pattern could match in this graph, the only ones traced.

    A pattern is matched only where a call of the function itself, or of a function of the same name
    (a copy), was inlined ("call" and "copy" in the module docstring), unless a registration matches
    the computation anywhere. A copy whose own module's function is registered too, with a kernel
    here, is that target's to match: so a Qwen2 graph traces Qwen2's ``apply_rotary_pos_emb`` and none
    of the other families' that ``use_builtin_kernels()`` registered (seconds of Dynamo tracing each
    compile otherwise).
    """
    registry = state.registry
    targets = registry.function_targets()
    known = {target: _names_and_file(target) for target in targets}
    # (name, file) of each function that is itself a registered target with a kernel here
    served: set[tuple[str, str]] = set()
    for target, names_file in known.items():
        if names_file is not None and names_file[1] is not None and \
                select_function_kernel(registry, target, state.device, state.mode, allow_uncompilable=True).ok:
            served.update((name, names_file[1]) for name in names_file[0])
    needed = []
    for target, names_file in known.items():
        anywhere = any(r.match_anywhere for modes in registry.function_registrations(target).values()
                       for r in modes.values())
        if anywhere or names_file is None:
            needed.append(target)
            continue
        names, own_file = names_file
        calls = {(name, filename) for name in names for filename in traced.get(name, ())}
        if any(filename == own_file for _, filename in calls) or not calls <= served:
            needed.append(target)
    return needed


def match_kind(target: str, nodes: list[fx.Node]) -> str:
    """"call", "copy" or "computation": where the matched nodes came from (see the module docstring)."""
    module_name, _, func_name = target.rpartition(".")
    filename = getattr(sys.modules.get(module_name), "__file__", None)
    traces = [stack_frames(n) for n in nodes]
    traces = [frames for frames in traces if frames]  # nodes Dynamo made itself carry none
    if not traces:
        return "computation"
    if all(any(f.name == func_name and f.filename == filename for f in frames) for frames in traces):
        return "call"
    if all(any(f.name == func_name for f in frames) for frames in traces):
        return "copy"
    return "computation"


def _matches_anywhere(state: PassState, target: str, selection: Selection) -> bool:
    if selection.choice is not None:
        return bool(getattr(selection.choice.registration, "match_anywhere", False))
    return any(r.match_anywhere for modes in state.registry.function_registrations(target).values() for r in modes.values())


def _target_of(targets: list[str], selections: dict[str, Selection], nodes: list[fx.Node]) -> str:
    """The target whose own file the matched code came from, else the first one with a kernel."""
    files = {f.filename for f in stack_frames(nodes[-1])}
    for target in targets:
        module = sys.modules.get(target.rpartition(".")[0])
        if getattr(module, "__file__", None) in files and selections[target].ok:
            return target
    return next((t for t in targets if selections[t].ok), targets[0])


def run(state: PassState) -> list[Outcome]:
    """Swap every match of a registered function's pattern that can be; one outcome per candidate."""
    outcomes: list[Outcome] = []
    for targets, pattern in registered_patterns(state).patterns:
        selections = {
            t: select_function_kernel(state.registry, t, state.device, state.mode, allow_uncompilable=True) for t in targets
        }
        matcher = SubgraphMatcher(pattern.graph, match_output=False, match_placeholder=False,
                                  remove_overlapping_matches=True, ignore_literals=True)
        renamed: dict[fx.Node, fx.Node] = {}  # outputs of earlier matches -> the call results replacing them
        for match in matcher.match(state.gm.graph):
            nodes = [n for p, n in match.nodes_map.items() if p.op not in ("placeholder", "output")]
            if any(is_erased(n) for n in nodes):
                continue  # overlapped a region another pattern already replaced
            order = {n: i for i, n in enumerate(state.gm.graph.nodes)}
            nodes.sort(key=order.__getitem__)
            target = _target_of(targets, selections, nodes)
            kind = match_kind(target, nodes)
            if kind == "computation" and not _matches_anywhere(state, target, selections[target]):
                continue  # not a call of the function: not a candidate (match_anywhere=False)
            region = Region("function", target, region_location(nodes), nodes)
            state.scratch.pattern_nodes.update(nodes)
            choice = selections[target].choice
            outcomes.append(region_outcome(
                lambda: _swap(state, region, pattern, match, selections[target], renamed, kind),
                lambda reason: Kept("function", target, region.location, reason,
                                    kernel=None if choice is None else str(choice), match=kind),
            ))
    return outcomes


def region_location(nodes: list[fx.Node]) -> str:
    """Where a function region is, for the report: the innermost module of the model and the node."""
    # the innermost module of the compiled model (a path under L[...]); module-valued globals such
    # as transformers' kernels-wrapped apply_rotary_pos_emb (G[...]) say nothing about where
    for frame in reversed(module_stack(nodes[-1])):
        if frame.local and not frame.location.startswith("_"):
            return f"{frame.location.split('@', 1)[0]} ({nodes[-1].name})"
    return nodes[-1].name


def _swap(
    state: PassState, region: Region, pattern: TracedPattern, match: InternalMatch, selection: Selection,
    renamed: dict[fx.Node, fx.Node], kind: str,
) -> Swapped:
    if selection.choice is None:
        raise KeepRegion(ReasonKind.NO_KERNEL, selection.reason or "no kernel")
    choice = selection.choice
    # arguments in the function's own order, so the call reads like the source
    position = {name: i for i, name in enumerate(pattern.signature.parameters)}
    named = sorted(zip(pattern.placeholder_params, match.placeholder_nodes), key=lambda pair: position[pair[0]])
    names = [name for name, _ in named]
    args = [renamed.get(n, n) for _, n in named]
    constants = _constants(pattern, match)
    outputs = outputs_read_outside(region)
    shown = ", ".join(f"{k}={v!r}" for k, v in constants.items())

    def reference(order: tuple[int, ...]) -> Any:
        return lambda *values: pattern.reference(**dict(zip(names, values)), **constants)

    binding = bind(
        state.gm, state.scratch.bindings, region, key=(pattern.name, tuple(names), tuple(sorted(constants.items()))),
        inputs=args, values=[example_value(n) for n in args], outputs=outputs,
        orders=[tuple(range(len(args)))], reference=reference,
        mismatch=(f"matches the pattern of {pattern.name} structurally but computes something else on these "
                  f"shapes/constants{' (' + shown + ')' if shown else ''}"),
    )
    region.call_args, region.outputs = args, outputs
    call = FunctionKernelCall(
        f"func_{pattern.name.rpartition('.')[2]}", choice.call, pattern.signature,
        names, constants, binding.picks, single=len(region.outputs) == 1,
    )
    how, call_node, replaced = place_kernel(state.gm, region, call, choice, device=state.device, mode=state.mode,
                                            swap_policy=state.options.applied_swap_policy)
    state.scratch.kernel_calls.add(call_node)
    renamed.update(replaced)
    return Swapped("function", region.target, region.location, str(choice), how, match=kind)


def _constants(pattern: TracedPattern, match: InternalMatch) -> dict[str, Any]:
    by_name = {p.name: n for p, n in match.nodes_map.items()}
    constants: dict[str, Any] = {}
    for param, node_name, index in pattern.scalar_slots:
        node = by_name.get(node_name)
        if node is not None:
            leaves = tree_leaves((node.args, dict(node.kwargs)))
            if index < len(leaves) and isinstance(leaves[index], (int, float)):
                constants.setdefault(param, leaves[index])
    return constants
