"""Do two computations agree? Trace both to ATen with the same static fake inputs and compare.

Dynamo graphs bake shapes and constants into literals and name ops in Dynamo's own spelling, so a
region is compared with its reference (the layer's original ``forward``, the registered function)
one level down: both are traced with ``make_fx`` on the same fresh fake tensors, and each output is
reduced to a structural key (op, literal arguments, which inputs it reads). Equal keys mean the
same computation on those shapes, dtypes and constants; the key positions also tell which
reference output each region output is, which is how arguments and results are bound.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx

from ...core.torch_internals import fake_tensor_mode, reparametrize_module, tree_leaves

__all__ = ["StaticInputs", "static_inputs", "aten_outputs", "StructuralKeys", "reparametrized", "module_attributes"]


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
