"""A region: the nodes of one graph that came from one call of a registered layer or function.

Passes find regions, bind them (which nodes are the kernel's arguments, which nodes it must
produce) and hand them to :mod:`.rewrite`. The graph-level facts every pass needs (device, mode,
which placeholder holds which parameter) live in :class:`GraphContext`.
"""

from __future__ import annotations

import contextlib
import contextvars
import gc
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensor

from ..modes import Mode
from ..registry import KernelRegistry
from ..selection import KernelChoice

__all__ = ["Region", "GraphContext", "ModuleIndex", "external_inputs", "external_outputs", "region_graph_module"]


class ModuleIndex:
    """Finds the module instance behind an ``nn_module_stack`` key (``str(id(module))``, maybe ``@N``).

    Dynamo records only the id and the class. The instance is alive while its graph compiles (the
    frame being compiled reaches it), and an instance of a Python class references its class, so
    ``gc.get_referrers(cls)`` finds it without reaching into Dynamo's internals. Roots given up
    front (``explain(model)``) are indexed first and spare that scan.
    """

    def __init__(self, roots: tuple[torch.nn.Module, ...] = ()) -> None:
        self._by_id: dict[int, torch.nn.Module] = {id(m): m for root in roots for m in root.modules()}
        self._scanned: set[type] = set()

    def find(self, key: str, cls: type) -> torch.nn.Module | None:
        try:
            wanted = int(key.split("@", 1)[0])
        except ValueError:
            return None
        module = self._by_id.get(wanted)
        if module is None and cls not in self._scanned:
            self._scanned.add(cls)
            for obj in gc.get_referrers(cls):
                if type(obj) is cls:
                    self._by_id.setdefault(id(obj), obj)
            module = self._by_id.get(wanted)
        return module if module is not None and type(module) is cls else None


@dataclass
class GraphContext:
    """One graph under rewrite and the facts the passes share."""

    gm: fx.GraphModule
    example_inputs: list[Any]
    registry: KernelRegistry
    device: str
    mode: Mode
    modules: ModuleIndex
    graph_break: Any = None  # Dynamo's GraphCompileReason when this graph ended at a graph break
    matched: set[fx.Node] = field(default_factory=set)  # nodes of pattern matches already reported

    bindings: dict[tuple, Any] = field(default_factory=dict)  # region signature -> binding (or why none)
    # float module attributes Dynamo lifted to graph inputs that a swapped kernel was specialised to:
    # graph input position -> value (the compiled graph checks them on every call, see backend)
    baked_scalars: dict[int, float] = field(default_factory=dict)
    patterns: Any = None  # the registered functions' patterns, traced once per graph (see function_patterns)

    def __post_init__(self) -> None:
        placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        self.placeholder_values: dict[fx.Node, Any] = {
            n: _real_input(n, value) for n, value in zip(placeholders, self.example_inputs)
        }


def _real_input(placeholder: fx.Node, value: Any) -> Any:
    """The real tensor behind a graph input that the backend was handed as a FakeTensor.

    DDPOptimizer (``torch.compile`` of a DDP model with several buckets) compiles each bucket's
    subgraph on fake copies of its inputs; the layer binder recognises parameters by identity, so
    without this every layer region of a split graph reads as "state from outside the module".
    The placeholder keeps Dynamo's record of what it holds (``grapharg``), parameters included.
    """
    if isinstance(value, FakeTensor):
        real = getattr(placeholder.meta.get("grapharg"), "example", None)
        if isinstance(real, torch.Tensor) and not isinstance(real, FakeTensor):
            return real
    return value


@dataclass
class Region:
    """Nodes from one call of a registered target, and how a kernel call replaces them."""

    kind: str  # "layer" or "function"
    target: str  # "Qwen2RMSNorm -> RMSNorm", "my_pkg.math_ops.add"
    location: str  # the module path, or the graph position, for the report
    nodes: list[fx.Node]
    call_args: list[fx.Node] = field(default_factory=list)  # arguments of the replacement call, in order
    outputs: list[fx.Node] = field(default_factory=list)  # nodes the call replaces, in the order it returns them
    choice: KernelChoice | None = None
    replaced: dict[fx.Node, fx.Node] = field(default_factory=dict)  # output -> the node now standing for it
    source: str = ""  # layers: the module's source path in Dynamo's nn_module_stack ("L['self'].norm")
    constants: dict[str, float] = field(default_factory=dict)  # lifted float attributes, read from the graph
    constant_inputs: dict[fx.Node, float] = field(default_factory=dict)  # the graph inputs holding them

    def describe(self) -> str:
        return f"{self.target} at {self.location}"


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


def fake_value(node: fx.Node) -> Any:
    """Dynamo's example value of ``node`` (a FakeTensor, SymInt, or Python value)."""
    return node.meta.get("example_value", node.meta.get("val"))


_ROOTS: contextvars.ContextVar[tuple[torch.nn.Module, ...]] = contextvars.ContextVar("twinkle_fx_module_roots", default=())


def module_roots() -> tuple[torch.nn.Module, ...]:
    """Models known to be compiled in this context (set by :func:`twinkle_fx.explain`)."""
    return _ROOTS.get()


@contextlib.contextmanager
def known_modules(*roots: torch.nn.Module) -> Iterator[None]:
    """Tell the backend which models it compiles, sparing the instance lookup a gc scan."""
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
    ids: dict[fx.Node, Any] = {n: ("input", i, _meta(fake_value(n))) for i, n in enumerate(inputs)}

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
