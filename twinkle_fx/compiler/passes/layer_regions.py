"""Layer regions: nodes that came from an instance of a registered nn.Module class.

Dynamo tags each node with the modules it came from (:func:`~..graph.dynamo.module_stack`, outer to
inner). The outermost module whose class is bound to a kernel name (``register_external_layer`` or a
``kernel_layer_name`` attribute) names the region, so a registered MLP swallows its Linear and
activation nodes. Each region then goes one way, and is kept at the first step that refuses it:

1. its module instance is found (:class:`~..graph.dynamo.ModuleLookup`) and admitted
   (:mod:`twinkle_fx.core.admission`, the eager path's rule);
2. its inputs are read as the module sees them: parameters and buffers, float attributes Dynamo lifted
   to graph inputs, and ``forward``'s arguments (:func:`_module_inputs`);
3. the arguments are bound to ``forward``'s (checked by tracing the original ``forward`` on the same
   fake inputs, see :func:`..regions.region.bind`);
4. the kernel is placed, once it passes the shape guard (:func:`..regions.splice.place_kernel`).
"""

from __future__ import annotations

import functools
import inspect
import itertools
import logging
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from ...core.admission import Admission, LayerTarget
from ...core.reasons import Reason, ReasonKind
from ..graph.dynamo import ModuleFrame, example_value, is_ddp_piece, lifted_attribute, module_stack, parent_class
from ..pipeline import Kept, Outcome, PassState, Swapped
from ..regions.region import (KeepRegion, LayerKernelCall, Region, bind, external_inputs, module_attributes,
                              outputs_read_outside, region_outcome, reparametrized)
from ..regions.splice import place_kernel

logger = logging.getLogger(__name__)

__all__ = ["LayerCandidate", "admission", "find_layer_regions", "run"]


@dataclass
class LayerCandidate:
    """One call of a target layer class: its nodes, the module it came from, the class as a target."""

    region: Region
    frame: ModuleFrame
    target: LayerTarget

    @property
    def cls(self) -> type:
        return self.frame.cls


def admission(state: PassState) -> Admission:
    """The admission rule for ``state``'s graph: a forward already installed on a module stays (the
    graph runs it), and kernels that cannot be compiled are let through (they are wrapped opaquely)."""
    return Admission(state.registry, state.device, state.mode, allow_uncompilable=True, keep_installed=True)


def find_layer_regions(state: PassState, rule: Admission) -> list[LayerCandidate]:
    """Every call of a target layer class in the graph.

    A class is a target when ``rule`` says so (:meth:`~twinkle_fx.core.admission.Admission.target`,
    the eager path's rule); a binding limited to parent classes (``register_external_layer(...,
    within=...)``) is asked with the module's parent read from the module stack
    (:func:`~..graph.dynamo.parent_class`) as ``kernelize_model`` reads it from the module tree,
    so both paths swap the same instances.
    """
    parents: dict[str, type | None] = {}

    def parent_of(stack: list[ModuleFrame], index: int) -> type | None:
        key = stack[index].key
        if key not in parents:
            parents[key] = parent_class(stack, index, state.modules)
        return parents[key]

    groups: dict[str, tuple[ModuleFrame, LayerTarget, list[fx.Node]]] = {}
    for node in state.gm.graph.nodes:
        if node.op not in ("call_function", "call_method", "get_attr"):
            continue
        stack = module_stack(node)
        for i, frame in enumerate(stack):
            if not isinstance(frame.cls, type):
                continue
            target = rule.target(frame.cls, functools.partial(parent_of, stack, i))
            if target is not None:
                groups.setdefault(frame.key, (frame, target, []))[2].append(node)
                break
    return [
        LayerCandidate(Region("layer", target.selection.target, frame.location, nodes, source=frame.source), frame,
                       target)
        for frame, target, nodes in groups.values()
    ]


def run(state: PassState) -> list[Outcome]:
    """Swap every layer region that can be; one outcome per candidate."""
    rule = admission(state)
    outcomes = []
    for candidate in find_layer_regions(state, rule):
        region, choice = candidate.region, candidate.target.selection.choice
        outcomes.append(region_outcome(
            lambda: _swap(state, rule, candidate),
            lambda reason: Kept("layer", region.target, region.location, reason,
                                kernel=None if choice is None else str(choice)),
        ))
    return outcomes


def _swap(state: PassState, rule: Admission, candidate: LayerCandidate) -> Swapped:
    region, cls, target = candidate.region, candidate.cls, candidate.target
    if target.refusal is not None:
        raise KeepRegion(target.refusal.kind, target.refusal.detail)
    module = state.modules.find(candidate.frame)
    if module is None:
        raise KeepRegion(ReasonKind.INSTANCE_NOT_FOUND, f"the {cls.__qualname__} instance behind this region could not be found")
    admitted = rule.admit(region.location, module, target)
    if isinstance(admitted, Reason):
        raise KeepRegion(admitted.kind, admitted.detail)
    choice = admitted.choice
    n_args, param_names, picks = bind_layer(state, region, external_inputs(region.nodes), module)
    call = LayerKernelCall(
        f"layer_{choice.name}", module, choice.call, n_args, param_names, picks, single=len(region.outputs) == 1,
        constants=region.constants,
    )
    how, call_node, _ = place_kernel(state.gm, region, call, choice, device=state.device, mode=state.mode,
                                     swap_policy=state.options.applied_swap_policy)
    state.scratch.kernel_calls.add(call_node)
    # the kernel is specialised to these values: the compiled graph checks them on every call
    for node, value in region.constant_inputs.items():
        state.scratch.baked_scalars[state.graph_inputs[node].position] = value
    return Swapped("layer", region.target, region.location, str(choice), how)


def bind_layer(state: PassState, region: Region, inputs: list[fx.Node],
               module: torch.nn.Module) -> tuple[int, list[str], tuple[int, ...]]:
    """Find which region inputs (``inputs``, in order of first use) are ``forward``'s arguments (in
    order) and which are parameters.

    Fills ``region.call_args`` / ``region.outputs`` / ``region.constants`` and returns ``(number of
    arguments, parameter names, which leaf of forward's result each output is)``; raises
    :class:`KeepRegion` when the region does not bind.
    """
    args, params, scalars = _module_inputs(state, region, inputs, module)
    outputs = outputs_read_outside(region)
    param_names = [name for name, _ in params]
    constants = {name: value for name, (_, value) in scalars.items()}
    constant_inputs = {node: value for node, value in scalars.values()}
    forward = type(module).forward
    positional = [
        p for p in list(inspect.signature(forward).parameters.values())[1:]
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    required = [p for p in positional if p.default is p.empty]
    if not (len(required) <= len(args) <= len(positional)):
        names = ", ".join(p.name for p in positional)
        raise KeepRegion(ReasonKind.OUTSIDE_STATE, (
            f"the region reads {len(args)} value(s) besides its parameters but forward({names}) takes "
            f"{len(required)} to {len(positional)}: it reads state from outside the module"
        ))
    if len(args) > 4:  # 24 orderings; beyond that a region is reported, not searched
        raise KeepRegion(ReasonKind.TOO_MANY_ARGUMENTS, f"{len(args)} tensor arguments: too many orderings to bind")

    def reference(order: tuple[int, ...]) -> Any:
        def call(*values: Any) -> Any:
            with reparametrized(module, dict(zip(param_names, values[len(args):]))):
                return forward(module, *[values[i] for i in order])

        return call

    with module_attributes(module, constants):
        binding = bind(
            state.gm, state.scratch.bindings, region,
            key=(type(module), tuple(param_names), tuple(sorted(constants.items()))),
            inputs=args + [n for _, n in params],
            values=[example_value(n) for n in args] + [state.placeholder_values[n] for _, n in params],
            outputs=outputs, orders=itertools.permutations(range(len(args))), reference=reference,
            mismatch=f"the region does not compute what {type(module).__qualname__}.forward computes on these inputs",
            constants=constant_inputs,
        )
    region.call_args = [args[i] for i in binding.order] + [n for _, n in params]
    region.outputs = outputs
    region.constants = constants
    region.constant_inputs = constant_inputs
    return len(args), param_names, binding.picks


def _module_inputs(
    state: PassState, region: Region, inputs: list[fx.Node], module: torch.nn.Module,
) -> tuple[list[fx.Node], list[tuple[str, fx.Node]], dict[str, tuple[fx.Node, float]]]:
    """What the region's ``inputs`` are to ``module``, read from the graph: ``(forward's arguments,
    (name, input) of its parameters and buffers, attribute path -> (input, value) of the float
    attributes Dynamo lifted to graph inputs)``; raises :class:`KeepRegion` when a DDP bucket
    boundary cuts the module (see below)."""
    named = dict(module.named_parameters(remove_duplicate=False))
    named.update(module.named_buffers(remove_duplicate=False))
    owned = {id(t): name for name, t in named.items()}
    split = _cut_by_bucket_boundary(state, inputs, module)
    if split is not None:
        raise KeepRegion(ReasonKind.BUCKET_SPLIT, split)
    args: list[fx.Node] = []
    params: list[tuple[str, fx.Node]] = []
    scalars: dict[str, tuple[fx.Node, float]] = {}
    for node in inputs:
        value = state.placeholder_values.get(node)
        graph_input = state.graph_inputs.get(node)
        if node.op == "placeholder" and isinstance(value, torch.Tensor) and id(value) in owned:
            params.append((owned[id(value)], node))
        elif (scalar := lifted_attribute(graph_input and graph_input.source, region.source, module, value)) is not None:
            scalars[scalar[0]] = (node, scalar[1])
        else:
            args.append(node)
    return args, params, scalars


def _cut_by_bucket_boundary(state: PassState, inputs: list[fx.Node], module: torch.nn.Module) -> str | None:
    """Why the region is only part of ``module``'s computation, when Dynamo's DDPOptimizer split the
    graph inside it; else None.

    DDPOptimizer compiles each gradient bucket's piece of the graph on its own. A bucket boundary
    inside a layer leaves each piece part of the layer's computation, and part of its parameters:
    without this check the piece reads as "state from outside the module" or fails the reference on
    fake inputs.
    """
    if not is_ddp_piece(state.root.example_inputs):
        return None
    parameters = {id(p) for p in module.parameters()}
    present = {id(state.placeholder_values.get(node)) for node in inputs if node.op == "placeholder"} & parameters
    if not present or present == parameters:
        return None
    return (f"a DDP gradient-bucket boundary cuts this {type(module).__qualname__}: Dynamo's DDPOptimizer compiled the "
            f"graph in pieces, and this piece holds {len(present)} of its {len(parameters)} parameters (the rest are in "
            f"another piece), so it stays as traced. Larger buckets (DDP(bucket_cap_mb=...)) move the boundaries; "
            f"a graph of one decoder layer is better not split at all: compile the layers with "
            f"twinkle_fx.compiler.compile_layers, or set torch._dynamo.config.optimize_ddp = False")
