"""The backend's rewrites of the graphs AOTAutograd hands the inner compiler (forward and backward, post-grad).

Each rewrite (:class:`PostGradRewrite`) edits an ATen-level graph in place and says how many places it changed.
Under Inductor they run as one post-grad pass, before any the user set (:func:`with_rewrites`): a
``CustomGraphPass`` whose uuid hashes every rewrite's source, so Inductor's and AOTAutograd's caches never serve
a graph compiled with a rewrite to a compile without it, or the reverse. Under ``aot_eager`` the backend runs
them on the graphs it is handed.

The helpers build the nodes a rewrite adds with the ``meta["val"]`` Inductor's passes read, computed on the
graph's own fake tensors.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx

from ...core.torch_internals import donated_backward_inputs, inductor_pass_uuid, inductor_post_grad_pass

logger = logging.getLogger(__name__)

__all__ = ["PostGradRewrite", "with_rewrites", "run_rewrites", "source_uuid", "kernel_module", "call", "fake_mode_of",
           "value", "erase_unused", "on_kernel_device", "donated_scaled_input"]


@dataclass(frozen=True)
class PostGradRewrite:
    """One rewrite: ``name`` (its name in the registry's graph rewrites), ``rewrite(graph)`` (edits ``graph`` in
    place, returns how many places it changed) and ``uuid()`` (its part of the compile caches' keys)."""

    name: str
    rewrite: Callable[[fx.Graph], int]
    uuid: Callable[[], str]


def run_rewrites(graph: fx.Graph, rewrites: Sequence[PostGradRewrite]) -> int:
    """Every rewrite on ``graph``, in order; how many places they changed together. A rewrite that raises is
    reported at WARNING, with the option that turns it off, and the graph goes on without the rest of it (each
    place a rewrite changes is replaced whole, after its checks)."""
    changed = 0
    for r in rewrites:
        try:
            changed += r.rewrite(graph)
        except Exception as e:  # noqa: BLE001 - the graph still compiles, without this rewrite's remaining places
            logger.warning("the %s rewrite failed on a graph (%s: %s); it is compiled without it there. "
                           "options={%r: False} turns the rewrite off.", r.name, type(e).__name__, e, r.name)
    return changed


def with_rewrites(existing: Any, rewrites: Sequence[PostGradRewrite]) -> Any:
    """The value of Inductor's post-grad pre-pass config that runs ``rewrites`` and then ``existing`` (the user's
    own pass, a list of them, or None) as one pass."""
    rewrites = tuple(rewrites)

    def run(graph: fx.Graph) -> None:
        run_rewrites(graph, rewrites)
        if existing is not None:
            for custom_pass in existing if isinstance(existing, (list, tuple)) else (existing,):
                custom_pass(graph)

    def uuid() -> Any:
        ours = tuple(r.uuid() for r in rewrites)
        if existing is None:
            return ours
        theirs = inductor_pass_uuid(existing)
        return None if theirs is None else (ours, theirs)

    return inductor_post_grad_pass(run, uuid)


def source_uuid(name: str, *modules: Any) -> str:
    """``name`` and the sha256 of the source files of ``modules`` (modules, or None for one that did not import):
    a change to any of them is a new cache key."""
    digest = hashlib.sha256()
    for module in modules:
        if module is not None:
            digest.update(Path(module.__file__).read_bytes())
    return f"{name}:{digest.hexdigest()}"


def kernel_module(rewrite: str, name: str) -> Any:
    """The kernel module ``name`` a rewrite's op is defined in (imported by its module name: the package's attribute
    of a kernel's name is its function, which has no source file for :func:`source_uuid`), or None where the kernels
    do not import: the backend works without them, only without rewrite ``rewrite``."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        logger.debug("%s rewrite off: %s does not import (%s)", rewrite, name, e)
        return None


def value(node: Any) -> Any:
    """A node's ``meta["val"]`` (its fake tensor), or ``node`` itself when it is not a node (a constant)."""
    return node.meta.get("val") if isinstance(node, fx.Node) else node


def on_kernel_device(node: fx.Node, kernels_run_on_cpu: bool) -> bool:
    """Whether ``node``'s value is a tensor where the rewrites' kernels run: CUDA, or the CPU when
    ``kernels_run_on_cpu`` (Triton's interpreter, where the tests take the GPU's graphs)."""
    device = getattr(value(node), "device", None)
    return device is not None and (device.type == "cuda" or (device.type == "cpu" and kernels_run_on_cpu))


def fake_mode_of(graph: fx.Graph) -> Any:
    """The fake mode of the graph's tensors, or None when its nodes carry none."""
    return next((v.fake_mode for v in map(value, graph.nodes) if hasattr(v, "fake_mode")), None)


def call(graph: fx.Graph, fake_mode: Any, target: Any, args: tuple) -> fx.Node:
    """A call node at the graph's insertion point, with its ``meta["val"]`` computed on the graph's fake
    tensors; none where the graph has no fake values (``fake_mode`` None)."""
    node = graph.call_function(target, args)
    if fake_mode is not None:
        with fake_mode:
            node.meta["val"] = target(*fx.node.map_arg(args, value))
    return node


def erase_unused(graph: fx.Graph, node: fx.Node, replaced: Callable[[fx.Node], bool]) -> None:
    """Erase ``node`` once nothing reads it and, recursively, each input ``replaced`` names that nothing else reads,
    leaving the rest to the compiler's own dead-code elimination."""
    if node.users or node.op != "call_function":
        return
    inputs = node.all_input_nodes
    graph.erase_node(node)
    for input_node in inputs:
        if input_node.op == "call_function" and replaced(input_node):
            erase_unused(graph, input_node, replaced)


def donated_scaled_input(mul: fx.Node) -> tuple[fx.Node, fx.Node] | None:
    """``(buffer, scale)`` when ``mul`` (read by one node) is ``buffer * scale`` with ``buffer`` a backward input
    AOTAutograd donated (a saved tensor read once, here by ``mul`` alone: the fused loss's weight gradient computed
    in the forward) of ``mul``'s dtype, shape and device, and ``scale`` one floating element (the loss's gradient) on
    that device: a product the backward may compute where ``buffer`` lies. Else None (never under
    ``retain_graph=True``, where nothing is donated)."""
    if mul.target is not torch.ops.aten.mul.Tensor or mul.kwargs or len(mul.users) != 1 or len(mul.args) != 2:
        return None
    donated = donated_backward_inputs()
    if not donated:
        return None
    placeholders = mul.graph.find_nodes(op="placeholder")
    for buffer, scale in (mul.args, mul.args[::-1]):
        if not (isinstance(buffer, fx.Node) and buffer.op == "placeholder" and len(buffer.users) == 1
                and isinstance(scale, fx.Node)):
            continue
        b, s, m = value(buffer), value(scale), value(mul)
        if isinstance(b, torch.Tensor) and isinstance(s, torch.Tensor) and isinstance(m, torch.Tensor) \
                and (b.dtype, b.shape, b.device) == (m.dtype, m.shape, m.device) and s.numel() == 1 \
                and s.is_floating_point() and s.device == b.device and placeholders.index(buffer) in donated:
            return buffer, scale
    return None
