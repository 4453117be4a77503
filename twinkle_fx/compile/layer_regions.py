"""Layer regions: nodes that came from an instance of a registered nn.Module class.

Dynamo tags each node with ``nn_module_stack`` (outer to inner: ``str(id(module))`` -> (source
path, class)). The outermost entry whose class is bound to a kernel name (``register_external_layer``
or a ``kernel_layer_name`` attribute) names the region, so a registered MLP swallows its Linear
and activation nodes. A region is swapped when a kernel is selected (same rules as the eager
path), its inputs bind to ``forward``'s arguments (checked by tracing the original ``forward``
on the same fake inputs, see :mod:`.equivalence`) and the kernel passes the shape guard.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
import logging
import re
from collections.abc import Iterator
from typing import Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensor

from ..eager.layers import swapped_forward
from ..kernels_mapping import foreign_forward
from ..selection import Selection, does_not_apply, select_layer_kernel, signature_mismatch
from .equivalence import StructuralKeys, aten_outputs, reparametrized, static_inputs
from .kernel_call import LayerKernelCall
from .place import place_kernel
from .regions import GraphContext, Region, external_inputs, external_outputs, fake_value, region_graph_module, region_signature
from .report import RegionReport

logger = logging.getLogger(__name__)

__all__ = ["find_layer_regions", "swap_layer_regions"]

_MAX_BINDINGS = 24  # 4 tensor arguments; beyond that a region is reported, not searched


def find_layer_regions(ctx: GraphContext) -> list[tuple[Region, type, str, Selection]]:
    """``(region, class, nn_module_stack key, selection)`` for every call of a target layer class.

    A class is a target when :func:`select_layer_kernel` says so (bound explicitly, or carrying a
    ``kernel_layer_name`` that has registrations), the same rule as the eager path.
    """
    selections: dict[type, Selection | None] = {}
    groups: dict[str, tuple[type, str, Selection, list[fx.Node]]] = {}
    for node in ctx.gm.graph.nodes:
        if node.op not in ("call_function", "call_method", "get_attr"):
            continue
        for key, (path, cls) in (node.meta.get("nn_module_stack") or {}).items():
            if not isinstance(cls, type):
                continue
            if cls not in selections:
                selections[cls] = select_layer_kernel(ctx.registry, cls, ctx.device, ctx.mode, allow_uncompilable=True)
            selection = selections[cls]
            if selection is not None:
                groups.setdefault(key, (cls, path, selection, []))[3].append(node)
                break
    regions = []
    for key, (cls, path, selection, nodes) in groups.items():
        regions.append((Region("layer", selection.target, _location(path, key), nodes, source=path), cls, key, selection))
    return regions


def _location(source_path: str, key: str) -> str:
    # "L['self'].model.layers.0.mlp" -> "model.layers.0.mlp"; a repeated call keeps its "@N"
    path = source_path.split("]", 1)[1].lstrip(".") if source_path.startswith(("L[", "G[")) else source_path
    path = path or "<root>"
    return f"{path}@{key.split('@', 1)[1]}" if "@" in key else path


def swap_layer_regions(ctx: GraphContext, reports: list[RegionReport]) -> int:
    """Swap every layer region that can be; append one report per candidate; return the count."""
    swapped = 0
    for region, cls, key, selection in find_layer_regions(ctx):
        report = RegionReport("layer", region.target, region.location)
        reports.append(report)
        report.reason = _swap(ctx, region, cls, key, selection, report)
        swapped += report.reason is None
    return swapped


def _swap(ctx: GraphContext, region: Region, cls: type, key: str, selection: Selection, report: RegionReport) -> str | None:
    if selection.choice is None:
        return selection.reason
    choice = selection.choice
    report.kernel = str(choice)
    mismatch = signature_mismatch(cls.forward, choice.call)
    if mismatch is not None:
        return mismatch
    module = ctx.modules.find(key, cls)
    if module is None:
        return f"the {cls.__qualname__} instance behind this region could not be found"
    not_applicable = does_not_apply(choice, module)
    if not_applicable is not None:
        return not_applicable
    eager = swapped_forward(module)
    if eager is not None:
        return f"already kernelized eagerly (kernelize_model installed {eager.kernel_name}); the graph holds that kernel"
    foreign = foreign_forward(module)
    if foreign is not None:
        return f"forward replaced by {foreign}: the graph runs that kernel as it is (twinkle_fx leaves it)"
    bound = bind_layer(ctx, region, module)
    if isinstance(bound, str):
        return bound
    n_args, param_names, picks = bound
    call = LayerKernelCall(
        f"layer_{choice.name}", module, choice.call, n_args, param_names, picks, single=len(region.outputs) == 1,
        constants=region.constants,
    )
    reason = place_kernel(ctx, region, call, choice, report)
    if reason is None:
        # the kernel is specialised to these values: the compiled graph checks them on every call
        positions = {n: i for i, n in enumerate(n for n in ctx.gm.graph.nodes if n.op == "placeholder")}
        for node, value in region.constant_inputs.items():
            ctx.baked_scalars[positions[node]] = value
    return reason


def _parameter_names(module: torch.nn.Module) -> dict[int, str]:
    named = dict(module.named_parameters(remove_duplicate=False))
    named.update(module.named_buffers(remove_duplicate=False))
    return {id(t): name for name, t in named.items()}


def bind_layer(ctx: GraphContext, region: Region, module: torch.nn.Module) -> tuple[int, list[str], list[int]] | str:
    """Find which region inputs are ``forward``'s arguments (in order) and which are parameters.

    On success fills ``region.call_args`` / ``region.outputs`` and returns ``(number of arguments,
    parameter names, which leaf of forward's result each output is)``; else the reason. Regions
    with the same structure and input metadata (the 24 identical layers of a model) share one
    answer, so only the first is traced.
    """
    owned = _parameter_names(module)
    args: list[fx.Node] = []
    params: list[tuple[str, fx.Node]] = []
    scalars: dict[str, tuple[fx.Node, float]] = {}
    for node in external_inputs(region.nodes):
        value = ctx.placeholder_values.get(node)
        if node.op == "placeholder" and isinstance(value, torch.Tensor) and id(value) in owned:
            params.append((owned[id(value)], node))
        elif (scalar := _lifted_attribute(ctx, region, module, node)) is not None:
            scalars[scalar[0]] = (node, scalar[1])
        else:
            args.append(node)
    outputs = external_outputs(region.nodes)
    if not outputs:
        return "nothing outside the region reads its result"
    param_names = [name for name, _ in params]
    inputs = args + [n for _, n in params]
    constants = {name: value for name, (_, value) in scalars.items()}
    key = (type(module), tuple(param_names), tuple(sorted(constants.items())), region_signature(region.nodes, inputs, outputs))
    if key not in ctx.bindings:
        with module_attributes(module, constants):
            ctx.bindings[key] = _search_binding(ctx, region, module, args, params, outputs,
                                                {node: value for node, value in scalars.values()})
    found = ctx.bindings[key]
    if isinstance(found, str):
        return found
    order, picks = found
    region.call_args = [args[i] for i in order] + [n for _, n in params]
    region.outputs = outputs
    region.constants = constants
    region.constant_inputs = {node: value for node, value in scalars.values()}
    return len(args), param_names, picks


_MODULES = re.compile(r"\._modules\['([^']+)'\]")


def _lifted_attribute(ctx: GraphContext, region: Region, module: torch.nn.Module, node: fx.Node) -> tuple[str, float] | None:
    """``(attribute path, value)`` when ``node`` is a float attribute of ``module`` that Dynamo lifted
    to a graph input (it does so once two instances of a class differ in it: ``eps``), else None."""
    if node.op != "placeholder" or not region.source:
        return None
    source = getattr(getattr(node.meta.get("grapharg"), "source", None), "name", None)
    source = source() if callable(source) else source
    if not isinstance(source, str):
        return None
    prefix = region.source + "."
    name = _MODULES.sub(r".\1", source)
    if not name.startswith(prefix) or not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", name[len(prefix):]):
        return None
    attribute = name[len(prefix):]
    try:
        current = functools.reduce(getattr, attribute.split("."), module)
    except AttributeError:
        return None
    value = ctx.placeholder_values.get(node)
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not isinstance(value, FakeTensor):
        value = value.item()
    if not isinstance(current, float) or not isinstance(value, float):
        return None
    return attribute, value


@contextlib.contextmanager
def module_attributes(module: torch.nn.Module, values: dict[str, float]) -> Iterator[None]:
    """``module`` with the (dotted) attributes in ``values`` set for the block."""
    saved = []
    for path, value in values.items():
        *owners, name = path.split(".")
        owner = functools.reduce(getattr, owners, module)
        saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


def _search_binding(
    ctx: GraphContext, region: Region, module: torch.nn.Module, args: list[fx.Node],
    params: list[tuple[str, fx.Node]], outputs: list[fx.Node], constants: dict[fx.Node, float],
) -> tuple[tuple[int, ...], list[int]] | str:
    """Try each order of ``args`` as forward's positional arguments; the one whose ATen trace
    produces the region's outputs wins. Returns ``(order, picks)`` or the reason."""
    forward = type(module).forward
    positional = [
        p for p in list(inspect.signature(forward).parameters.values())[1:]
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    required = [p for p in positional if p.default is p.empty]
    if not (len(required) <= len(args) <= len(positional)):
        names = ", ".join(p.name for p in positional)
        return (
            f"the region reads {len(args)} value(s) besides its parameters but forward({names}) takes "
            f"{len(required)} to {len(positional)}: it reads state from outside the module"
        )
    if len(args) > 4:
        return f"{len(args)} tensor arguments: too many orderings to bind"
    values = [fake_value(n) for n in args] + [ctx.placeholder_values[n] for _, n in params]
    try:
        statics = static_inputs(values)
    except ValueError as e:
        return f"cannot build example inputs: {e}"
    keys = StructuralKeys()
    param_names = [name for name, _ in params]
    region_gm = region_graph_module(ctx.gm, region.nodes, args + [n for _, n in params], outputs, constants)
    try:
        region_keys = keys.outputs(aten_outputs(region_gm, statics))
    except Exception as e:  # the region itself should always replay; say so if it does not
        return f"the region does not replay on fake tensors: {e!r}"
    failures = []
    for order in itertools.permutations(range(len(args))):
        def reference(*vals: Any, order: tuple[int, ...] = order) -> Any:
            with reparametrized(module, dict(zip(param_names, vals[len(args):]))):
                return forward(module, *[vals[i] for i in order])

        try:
            ref_keys = keys.outputs(aten_outputs(reference, statics))
        except Exception as e:  # this order does not fit forward; the next may
            failures.append(repr(e))
            continue
        if all(k in ref_keys for k in region_keys):
            return order, [ref_keys.index(k) for k in region_keys]
    detail = f" (forward failed on fake inputs: {failures[0]})" if failures else ""
    return f"the region does not compute what {type(module).__qualname__}.forward computes on these inputs{detail}"
