"""A region: the nodes of one graph that came from one call of a registered layer or function, and its
binding to the reference.

Passes find regions, bind them (:func:`bind`: which region inputs are the reference's arguments, in which
order, and which leaf of the reference's result each region output is) and hand them to :mod:`.splice`. The
graph-level facts every pass needs (device, mode, which placeholder holds which parameter) live in
:class:`~twinkle_fx.compiler.pipeline.PassState`.

The reference is a layer's original ``forward`` (its arguments' order unknown: every order is tried) or a
registered function (its order known from the pattern). Region and reference are traced to ATen on the same
static fake inputs (equivalence, below); a binding exists when every region output is a reference output.
Regions with the same structure and input metadata (the 24 identical layers of a model) share one answer,
kept in the graph's cache (``PassScratch.bindings``), so only the first is traced.

A pass that cannot swap a region raises :class:`KeepRegion` anywhere below its loop over regions, with
the :class:`~twinkle_fx.core.reasons.Reason` the report shows; the loop catches it in :func:`region_outcome`.

Equivalence: do two computations agree? Dynamo graphs bake shapes and constants into literals and name ops in Dynamo's own spelling, so a
region is compared with its reference (the layer's original ``forward``, the registered function)
one level down: both are traced with ``make_fx`` on the same fresh fake tensors, and each output is
reduced to a structural key (op, literal arguments, which inputs it reads). Equal keys mean the
same computation on those shapes, dtypes and constants; the key positions also tell which
reference output each region output is, which is how arguments and results are bound.

Kernel calls are the callables a rewritten graph calls in place of a region. Each is a named object so the printed graph reads ``twinkle.layer_RMSNorm(x, weight)``. When
AOTAutograd (``aot_eager``, Inductor) traces the graph it runs the call on fake tensors, so the
kernel's own ``torch.ops.twinkle.*`` custom ops land in the ATen graph: opaque to decompositions
and fusion, differentiated by their registered autograd formulas. Under the ``eager`` inner
compiler the call simply runs.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx

from ...core.reasons import Reason, ReasonKind
from ...core.torch_internals import fake_tensor_mode, quiet_fake_tensor_errors, reparametrize_module, tree_leaves
from ..graph.dynamo import example_value

logger = logging.getLogger(__name__)

__all__ = ["KeepRegion", "region_outcome", "Region", "external_inputs", "external_outputs", "region_graph_module", "region_signature",
           "Binding", "bind", "outputs_read_outside", "StaticInputs", "static_inputs", "aten_outputs",
           "StructuralKeys", "reparametrized", "module_attributes", "KernelCall", "LayerKernelCall",
           "FunctionKernelCall", "builtin_layer_call", "layer_call_params"]


Outcome = TypeVar("Outcome")  # the pass's Swapped or Kept


class KeepRegion(Exception):
    """Raised anywhere below a pass to keep the region being swapped; the pass reports ``reason``."""

    def __init__(self, kind: ReasonKind, detail: str, exception: BaseException | None = None) -> None:
        super().__init__(detail)
        self.reason = Reason(kind, detail, exception)


def region_outcome(swap: Callable[[], Outcome], kept: Callable[[Reason], Outcome]) -> Outcome:
    """``swap()``, or ``kept(reason)`` when it raises: a :class:`KeepRegion` gives its reason, any
    other error keeps the region as PASS_FAILED (logged with its traceback at DEBUG) so one
    region's failure never stops the pass. The swap runs the region, its reference and the kernel on fake
    tensors, where a failure is expected and becomes the reason: fake tensors' own ERROR record of it goes
    to DEBUG (:func:`~twinkle_fx.core.torch_internals.quiet_fake_tensor_errors`)."""
    try:
        with quiet_fake_tensor_errors():
            return swap()
    except KeepRegion as keep:
        return kept(keep.reason)
    except Exception as e:  # one region failed: keep it, say why, go on with the next region
        logger.debug("a pass failed on one region", exc_info=True)
        return kept(Reason(ReasonKind.PASS_FAILED, f"the pass failed on this region: {e!r}", e))


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


# --- equivalence: region and reference traced to ATen on the same static fake inputs --------------


class StaticInputs:
    """Fresh static-shape fake tensors standing in for a region's inputs (one fake mode for all)."""

    def __init__(self, values: Sequence[Any]) -> None:
        self.mode = fake_tensor_mode()
        self.values = [self._static(v) for v in values]

    def _static(self, value: Any) -> Any:
        if isinstance(value, torch.SymInt) or isinstance(value, torch.SymFloat):
            hint = value.node.hint
            if hint is None:
                raise ValueError(f"symbolic value {value} has no hint (data-dependent)")
            return hint
        if isinstance(value, torch.Tensor):
            sizes = [self._static(s) for s in value.shape]
            strides = [self._static(s) for s in value.stride()]
            with self.mode:
                return torch.empty_strided(sizes, strides, dtype=value.dtype, device=value.device)
        return value

    def fake(self, tensor: torch.Tensor) -> torch.Tensor:
        """A fake of a real tensor (a parameter) in the same mode."""
        return self.mode.from_tensor(tensor)


def static_inputs(values: Sequence[Any]) -> StaticInputs:
    return StaticInputs(values)


def aten_outputs(fn: Callable[..., Any], inputs: StaticInputs) -> fx.GraphModule:
    """``make_fx`` of ``fn(*inputs.values)`` on the fake inputs."""
    with inputs.mode:
        return make_fx(fn, tracing_mode="real")(*inputs.values)


@contextlib.contextmanager
def reparametrized(module: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> Iterator[None]:
    """``module`` with its parameters/buffers named in ``tensors`` replaced for the block."""
    current = dict(module.named_parameters(remove_duplicate=False))
    current.update(module.named_buffers(remove_duplicate=False))
    if all(current.get(name) is t for name, t in tensors.items()):
        yield  # the graph runs with the real parameters (eager inner compiler): nothing to swap
        return
    with reparametrize_module(module, tensors):
        yield


@contextlib.contextmanager
def module_attributes(module: torch.nn.Module, values: dict[str, float]) -> Iterator[None]:
    """``module`` with the (dotted) attributes in ``values`` set for the block (lifted float
    attributes, read from the graph: the reference and the kernel see the graph's value)."""
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


def _target_name(target: Any) -> str:
    if isinstance(target, str):
        return target
    return getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or repr(target)


class StructuralKeys:
    """Interns ATen nodes into small integers: equal ids mean equal computations.

    One instance is shared by the graphs being compared; a node's id depends on its op, its
    literal arguments and the ids of the nodes it reads, a placeholder's id on its position.
    """

    def __init__(self) -> None:
        self._ids: dict[tuple, int] = {}

    def _intern(self, key: tuple) -> int:
        return self._ids.setdefault(key, len(self._ids))

    def outputs(self, gm: fx.GraphModule) -> list[int | tuple]:
        ids: dict[fx.Node, int] = {}
        position = 0

        def arg_key(a: Any) -> Any:
            if isinstance(a, fx.Node):
                return ("node", ids[a])
            if isinstance(a, (list, tuple)):
                return (type(a).__name__, tuple(arg_key(x) for x in a))
            if isinstance(a, dict):
                return ("dict", tuple((k, arg_key(v)) for k, v in sorted(a.items())))
            return ("literal", type(a).__name__, repr(a))

        output: Any = None
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                ids[node] = self._intern(("input", position))
                position += 1
            elif node.op == "get_attr":
                value = getattr(gm, node.target)
                meta = (tuple(value.shape), str(value.dtype)) if isinstance(value, torch.Tensor) else repr(value)
                ids[node] = self._intern(("constant", meta))
            elif node.op == "output":
                output = node.args[0]
            else:
                ids[node] = self._intern(
                    (node.op, _target_name(node.target), arg_key(node.args), arg_key(dict(node.kwargs)))
                )
        return [("node", ids[leaf]) if isinstance(leaf, fx.Node) else arg_key(leaf) for leaf in tree_leaves(output)]


# --- the kernel calls a rewritten graph makes in place of a region ---------------------------------


class KernelCall:
    """Base class: FX prints the call as ``twinkle.<name>`` (``__module__`` and ``__name__``)."""

    def __init__(self, name: str, picks: Sequence[int], single: bool) -> None:
        self.__name__ = self.__qualname__ = name
        self.__module__ = "twinkle"
        self.picks = tuple(picks)  # which leaves of the kernel's result the graph reads
        self.single = single

    def _pick(self, result: Any) -> Any:
        leaves = tree_leaves(result)
        picked = tuple(leaves[i] for i in self.picks)
        return picked[0] if self.single else picked

    def __repr__(self) -> str:
        return f"<twinkle kernel call {self.__name__}>"

    def cache_key(self) -> tuple[tuple, Any]:
        """``(key, owner)``: equal keys make equal calls while ``owner`` (held weakly by caches;
        None for none) is alive; the opaque wrapper of a recompiled region is reused by it."""
        raise NotImplementedError(f"{type(self).__name__} has no cache key")


class LayerKernelCall(KernelCall):
    """``forward(module, *args)`` with the module's parameters taken from the graph's inputs.

    The parameters arrive as graph values (lifted placeholders) and are swapped into the module
    for the call, so gradients flow to the graph inputs, i.e. to the real parameters. The module
    is held weakly: the compiled graph must not keep a model alive.
    """

    def __init__(
        self,
        name: str,
        module: torch.nn.Module,
        forward: Callable[..., Any],
        n_args: int,
        param_names: Sequence[str],
        picks: Sequence[int],
        single: bool,
        constants: dict[str, float] | None = None,
    ) -> None:
        super().__init__(name, picks, single)
        self._module = weakref.ref(module)
        self.forward = forward
        self.n_args = n_args
        self.param_names = tuple(param_names)
        # float attributes Dynamo lifted to graph inputs, as read from the graph at compile time
        self.constants = dict(constants or {})

    @property
    def module(self) -> torch.nn.Module | None:
        """The module this call runs the kernel's forward for; None once the module is gone."""
        return self._module()

    def cache_key(self) -> tuple[tuple, Any]:
        module = self._module()
        return (type(self), self.__name__, id(module), self.forward, self.n_args, self.param_names, self.picks,
                self.single, tuple(sorted(self.constants.items()))), module

    def __call__(self, *values: Any) -> Any:
        module = self._module()
        if module is None:
            raise RuntimeError(f"{self.__name__}: the module this graph was compiled for no longer exists.")
        args, params = values[: self.n_args], values[self.n_args :]
        with reparametrized(module, dict(zip(self.param_names, params))), module_attributes(module, self.constants):
            return self._pick(self.forward(module, *args))


def builtin_layer_call(node: fx.Node, name: str) -> LayerKernelCall | None:
    """The call when ``node`` runs the built-in layer kernel ``twinkle_triton.layers.<name>`` for a live module
    (one tensor out, the module's input first); passes that rewrite a swapped layer further find it so."""
    call = node.target
    if node.op != "call_function" or not isinstance(call, LayerKernelCall) or not call.single or node.kwargs:
        return None
    from twinkle_triton import layers  # imported when a graph is rewritten, not with the backend

    kernel = getattr(layers, name)
    return call if call.forward is kernel.forward and call.module is not None and call.n_args == 1 else None


def layer_call_params(node: fx.Node, call: LayerKernelCall) -> dict[str, object]:
    """The graph values ``node`` passes as ``call``'s module parameters, by name ("weight", "down_proj.bias")."""
    return dict(zip(call.param_names, node.args[call.n_args:]))


class FunctionKernelCall(KernelCall):
    """``kernel(...)`` with the matched tensors and the constants read from the graph."""

    def __init__(
        self,
        name: str,
        kernel: Callable[..., Any],
        signature: inspect.Signature,
        arg_names: Sequence[str],
        constants: dict[str, Any],
        picks: Sequence[int],
        single: bool,
    ) -> None:
        super().__init__(name, picks, single)
        self.kernel = kernel
        self.signature = signature
        self.arg_names = tuple(arg_names)
        self.constants = dict(constants)

    def cache_key(self) -> tuple[tuple, Any]:
        return (type(self), self.__name__, self.kernel, tuple(self.signature.parameters), self.arg_names,
                tuple(sorted(self.constants.items())), self.picks, self.single), None

    def __call__(self, *values: Any) -> Any:
        bound = self.signature.bind_partial(**dict(zip(self.arg_names, values)), **self.constants)
        bound.apply_defaults()
        return self._pick(self.kernel(*bound.args, **bound.kwargs))
