"""A region: the nodes of one graph that came from one call of a registered layer or function, and its
binding to the reference.

Passes find regions, bind them (:func:`bind`: which region inputs are the reference's arguments, in which
order, and which leaf of the reference's result each region output is) and hand them to :mod:`.splice`. The
graph-level facts every pass needs (device, mode, which placeholder holds which parameter) live in
:class:`~twinkle_fx.compile.pipeline.PassState`.

The reference is a layer's original ``forward`` (its arguments' order unknown: every order is tried) or a
registered function (its order known from the pattern). Region and reference are traced to ATen on the same
static fake inputs (:mod:`.equivalence`); a binding exists when every region output is a reference output.
Regions with the same structure and input metadata (the 24 identical layers of a model) share one answer,
kept in the graph's cache (``PassScratch.bindings``), so only the first is traced.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx

from ..dynamo_internals import example_value
from ..reasons import KeepRegion, Reason, ReasonKind
from .equivalence import StructuralKeys, aten_outputs, static_inputs

__all__ = ["Region", "external_inputs", "external_outputs", "region_graph_module", "region_signature",
           "known_modules", "module_roots", "Binding", "bind", "outputs_read_outside"]


@dataclass
class Region:
    """Nodes from one call of a registered target, and how a kernel call replaces them."""

    kind: str  # "layer" or "function"
    target: str  # "Qwen2RMSNorm -> RMSNorm", "my_pkg.math_ops.add"
    location: str  # the module path, or the graph position, for the report
    nodes: list[fx.Node]
    call_args: list[fx.Node] = field(default_factory=list)  # arguments of the replacement call, in order
    outputs: list[fx.Node] = field(default_factory=list)  # nodes the call replaces, in the order it returns them
    source: str = ""  # layers: the module's source path in Dynamo's nn_module_stack ("L['self'].norm")
    constants: dict[str, float] = field(default_factory=dict)  # lifted float attributes, read from the graph
    constant_inputs: dict[fx.Node, float] = field(default_factory=dict)  # the graph inputs holding them


def external_inputs(nodes: list[fx.Node]) -> list[fx.Node]:
    """Nodes outside ``nodes`` that they read, in order of first use."""
    inside = set(nodes)
    seen: dict[fx.Node, None] = {}
    for node in nodes:
        for arg in node.all_input_nodes:
            if arg not in inside:
                seen.setdefault(arg, None)
    return list(seen)


def external_outputs(nodes: list[fx.Node]) -> list[fx.Node]:
    """Nodes of ``nodes`` read by a node outside them, in graph order."""
    inside = set(nodes)
    return [n for n in nodes if any(user not in inside for user in n.users)]


def region_graph_module(
    gm: fx.GraphModule, nodes: list[fx.Node], inputs: list[fx.Node], outputs: list[fx.Node],
    constants: dict[fx.Node, float] | None = None,
) -> fx.GraphModule:
    """The region as a standalone GraphModule: ``(*inputs) -> tuple(outputs)``.

    ``constants`` are graph inputs holding lifted float attributes (0-d tensors Dynamo reads with
    ``.item()``): the copy reads their values as literals instead.
    """
    graph = fx.Graph()
    env: dict[fx.Node, Any] = {}
    for i, node in enumerate(inputs):
        env[node] = graph.placeholder(f"input_{i}")
        env[node].meta = dict(node.meta)
    constants = constants or {}
    for node in nodes:
        if node.op == "call_method" and node.target == "item" and node.args and node.args[0] in constants:
            env[node] = constants[node.args[0]]
            continue
        env[node] = graph.node_copy(node, lambda n: env[n])
    graph.output(tuple(env[n] for n in outputs))
    return fx.GraphModule(gm, graph)


_ROOTS: contextvars.ContextVar[tuple[torch.nn.Module, ...]] = contextvars.ContextVar("twinkle_fx_module_roots", default=())


def module_roots() -> tuple[torch.nn.Module, ...]:
    """Models known to be compiled in this context (set by :func:`twinkle_fx.explain`)."""
    return _ROOTS.get()


@contextlib.contextmanager
def known_modules(*roots: torch.nn.Module) -> Iterator[None]:
    """Tell the backend which models it compiles (the module lookup indexes them first)."""
    token = _ROOTS.set(_ROOTS.get() + roots)
    try:
        yield
    finally:
        _ROOTS.reset(token)


def _meta(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        hint = lambda s: s.node.hint if isinstance(s, torch.SymInt) else s  # noqa: E731
        return ("tensor", tuple(map(hint, value.shape)), tuple(map(hint, value.stride())), value.dtype, value.device.type)
    return (type(value).__name__, repr(value) if isinstance(value, (int, float, bool, str)) else None)


def region_signature(nodes: list[fx.Node], inputs: list[fx.Node], outputs: list[fx.Node]) -> tuple:
    """A hashable summary of a region: its ops and literals, how they connect, and the metadata of
    its inputs. Equal signatures bind the same way (a cache key, not a proof of equivalence)."""
    ids: dict[fx.Node, Any] = {n: ("input", i, _meta(example_value(n))) for i, n in enumerate(inputs)}

    def arg(a: Any) -> Any:
        if isinstance(a, fx.Node):
            return ids.get(a, ("outside", a.name))
        if isinstance(a, (list, tuple)):
            return (type(a).__name__, tuple(arg(x) for x in a))
        if isinstance(a, dict):
            return ("dict", tuple((k, arg(v)) for k, v in sorted(a.items())))
        return repr(a)

    body = []
    for i, node in enumerate(nodes):
        body.append((node.op, str(node.target), arg(node.args), arg(dict(node.kwargs))))
        ids[node] = ("node", i)
    return tuple(body), tuple(ids[n] for n in outputs)


@dataclass(frozen=True)
class Binding:
    """``order[i]``: the region input passed as the reference's i-th argument; ``picks[j]``: the
    leaf of the reference's result that region output j is."""

    order: tuple[int, ...]
    picks: tuple[int, ...]


def outputs_read_outside(region: Region) -> list[fx.Node]:
    """The region's nodes read outside it (what a kernel call must produce); keeps the region if none."""
    outputs = external_outputs(region.nodes)
    if not outputs:
        raise KeepRegion(ReasonKind.UNUSED_RESULT, "nothing outside the region reads its result")
    return outputs


def bind(
    gm: fx.GraphModule,
    cache: dict[tuple, Binding | Reason],
    region: Region,
    *,
    key: tuple,
    inputs: Sequence[fx.Node],
    values: Sequence[Any],
    outputs: Sequence[fx.Node],
    orders: Iterable[tuple[int, ...]],
    reference: Callable[[tuple[int, ...]], Callable[..., Any]],
    mismatch: str,
    constants: dict[fx.Node, float] | None = None,
) -> Binding:
    """The first order of ``orders`` whose reference computes the region's outputs.

    Args:
        gm: the graph the region is in.
        cache: the answers found so far for this graph (a binding, or the reason there is none).
        key: what besides the region's signature decides the answer (the class or pattern, names, constants).
        inputs: the region's input nodes, as the region graph takes them; ``values`` their example values.
        orders: orders to try; ``reference(order)`` is the reference taking the inputs' values in the
            region's order and passing them on in ``order``.
        mismatch: the detail shown when no order computes the region's outputs.
        constants: graph inputs holding lifted float attributes, read as these literals in the region.

    Raises:
        KeepRegion: no binding (the reason is cached with the key, as a binding would be).
    """
    full_key = (key, region_signature(region.nodes, list(inputs), list(outputs)))
    if full_key not in cache:
        try:
            cache[full_key] = _search(gm, region, inputs, values, outputs, orders, reference, mismatch,
                                               constants)
        except KeepRegion as keep:
            cache[full_key] = keep.reason
    found = cache[full_key]
    if isinstance(found, Reason):
        raise KeepRegion(found.kind, found.detail, found.exception)
    return found


def _search(
    gm: fx.GraphModule, region: Region, inputs: Sequence[fx.Node], values: Sequence[Any], outputs: Sequence[fx.Node],
    orders: Iterable[tuple[int, ...]], reference: Callable[[tuple[int, ...]], Callable[..., Any]], mismatch: str,
    constants: dict[fx.Node, float] | None,
) -> Binding:
    try:
        statics = static_inputs(values)
    except ValueError as e:
        raise KeepRegion(ReasonKind.DATA_DEPENDENT, f"cannot build example inputs: {e}", e) from None
    keys = StructuralKeys()
    region_gm = region_graph_module(gm, region.nodes, list(inputs), list(outputs), constants)
    try:
        region_keys = keys.outputs(aten_outputs(region_gm, statics))
    except Exception as e:  # the region itself should always replay; say so if it does not
        raise KeepRegion(ReasonKind.CHECK_FAILED, f"the region does not replay on fake tensors: {e!r}", e) from None
    failures: list[Exception] = []
    ran = False
    for order in orders:
        try:
            ref_keys = keys.outputs(aten_outputs(reference(order), statics))
        except Exception as e:  # this order does not fit the reference; the next may
            failures.append(e)
            continue
        ran = True
        if all(k in ref_keys for k in region_keys):
            return Binding(tuple(order), tuple(ref_keys.index(k) for k in region_keys))
    detail = f" (the reference failed on fake inputs: {failures[0]!r})" if failures else ""
    if not ran:
        raise KeepRegion(ReasonKind.CHECK_FAILED, mismatch + detail, failures[0] if failures else None)
    raise KeepRegion(ReasonKind.NOT_EQUIVALENT, mismatch + detail)
