"""The callables a rewritten graph calls in place of a region.

Each is a named object so the printed graph reads ``twinkle.layer_RMSNorm(x, weight)``. When
AOTAutograd (``aot_eager``, Inductor) traces the graph it runs the call on fake tensors, so the
kernel's own ``torch.ops.twinkle.*`` custom ops land in the ATen graph: opaque to decompositions
and fusion, differentiated by their registered autograd formulas. Under the ``eager`` inner
compiler the call simply runs.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ...core.torch_internals import tree_leaves
from .equivalence import module_attributes, reparametrized

__all__ = ["KernelCall", "LayerKernelCall", "FunctionKernelCall"]


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
