"""Per-instance forward replacement for layer kernels, and its exact undo.

A swapped module gets an instance attribute ``forward`` holding a :class:`KernelForward`: a
``functools.partial(kernel_forward, module)``, so the kernel's ``forward(self, ...)`` runs with the
module as ``self`` (it reads the module's own weights and attributes) and a call adds no Python
frame of ours (a partial is called from C). Everything that could be a per-call check is decided
when the swap is made: verify mode installs a different function, not a branch. The class, the
parameters and the state_dict keys are untouched; the object remembers what it replaced, so undo
needs no side table and survives ``copy.deepcopy`` and pickling of the model.

A weak ledger remembers which forward was installed on which module, so :func:`restore_layers`
notices a forward that another tool (``kernels.kernelize``, say) put there afterwards.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from ..core.selection import KernelChoice
from .graphs import GraphedForward, GraphSet
from .verify import Verifier

logger = logging.getLogger(__name__)

__all__ = ["KernelForward", "LayerSwap", "LayerChange", "install_forward", "install_graphs", "restore_layers",
           "revert_changes", "swapped_forward", "foreign_forwards"]

_MISSING = object()  # "no instance-level forward": the class's forward is the one to go back to


class KernelForward(functools.partial):
    """The ``forward`` installed on a kernelized module instance: ``partial(kernel_forward, module)``.

    Attributes:
        fn: the kernel's ``forward(self, ...)``.
        kernel_name: the registered kernel name.
        previous: the instance-level forward it replaced (None: the class's ``forward``).
        verifier: the :class:`~twinkle_fx.eager.verify.Verifier` in verify mode, else None.
        graphs: the model's :class:`~twinkle_fx.eager.graphs.GraphSet` when this module's forward runs
            through CUDA graphs (``kernelize_model(..., cuda_graphs=True)``), else None.
    """

    fn: Callable[..., Any]
    kernel_name: str
    previous: Any
    verifier: Verifier | None
    graphs: GraphSet | None

    @classmethod
    def make(cls, module: torch.nn.Module, fn: Callable[..., Any], kernel_name: str, previous: Any = None,
             verifier: Verifier | None = None, graphs: GraphSet | None = None) -> "KernelForward":
        call = fn if verifier is None else CheckedForward(fn, verifier)
        if graphs is not None:
            call = GraphedForward(call, graphs)
        forward = cls(call, module)
        forward.fn = fn
        forward.kernel_name = kernel_name
        forward.previous = previous
        forward.verifier = verifier
        forward.graphs = graphs
        return forward

    @property
    def module(self) -> torch.nn.Module:
        return self.args[0]

    @property
    def __signature__(self) -> inspect.Signature:
        # inspect.signature(module.forward) shows the replaced forward's parameters, not the kernel's
        # (*args, **kwargs) if it has them: Hugging Face Trainer keeps only the dataset columns that
        # forward names. Read at inspection time only, never on the call path.
        if self.previous is not None:
            return inspect.signature(self.previous)
        return inspect.signature(type(self.module).forward.__get__(self.module))

    def reference(self, *args: Any, **kwargs: Any) -> Any:
        """The forward this kernel replaced."""
        if self.previous is not None:
            return self.previous(*args, **kwargs)
        return type(self.module).forward(self.module, *args, **kwargs)

    def __repr__(self) -> str:
        graphs = " (CUDA graphs)" if self.graphs is not None else ""
        return f"<twinkle_fx kernel forward {self.kernel_name} of {type(self.module).__qualname__}{graphs}>"


class CheckedForward:
    """The function of a :class:`KernelForward` in verify mode: the kernel, checked against the
    reference on the first call of each input signature, and the reference after a mismatch.

    It runs outside any ``torch.compile`` graph (a graph break), so the checks also run when a
    kernelized model is compiled; verify mode is for finding wrong kernels, not for speed.
    The :class:`Verifier` travels with copies and pickles of the model, a rejection included.
    """

    def __init__(self, fn: Callable[..., Any], verifier: Verifier) -> None:
        self.fn = fn
        self.verifier = verifier

    @torch.compiler.disable
    def __call__(self, module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        forward = module.__dict__["forward"]
        verifier = self.verifier
        if verifier.failed:
            return forward.reference(*args, **kwargs)
        signature = verifier.needs_check(args, kwargs)
        if signature is None:
            return self.fn(module, *args, **kwargs)
        parameters = [p for p in module.parameters() if p.requires_grad]
        result, _ = verifier.check(signature, functools.partial(self.fn, module), forward.reference,
                                   parameters, args, kwargs)
        return result


def swapped_forward(module: torch.nn.Module) -> KernelForward | None:
    """The :class:`KernelForward` installed on ``module``, if any."""
    forward = module.__dict__.get("forward")
    return forward if isinstance(forward, KernelForward) else None


# module -> the KernelForward twinkle_fx installed on it (weak: a deleted model leaves nothing behind)
_INSTALLED: "weakref.WeakKeyDictionary[torch.nn.Module, KernelForward]" = weakref.WeakKeyDictionary()
_INSTALLED_LOCK = threading.Lock()


@dataclass(frozen=True)
class LayerSwap:
    """A planned swap: ``path`` is the module's qualified name in the model."""

    path: str
    module: torch.nn.Module
    choice: KernelChoice


@dataclass(frozen=True)
class LayerChange:
    """One change of a module's instance-level forward, so a scoped undo can put ``before`` back."""

    module: torch.nn.Module
    before: Any  # the instance-level forward before, or _MISSING
    after: Any   # what was installed, or _MISSING (a revert to the class's forward)


def _set_forward(module: torch.nn.Module, forward: Any) -> None:
    if forward is _MISSING:
        module.__dict__.pop("forward", None)
    else:
        module.forward = forward
    with _INSTALLED_LOCK:
        if isinstance(forward, KernelForward):
            _INSTALLED[module] = forward
        else:
            _INSTALLED.pop(module, None)


def install_forward(swap: LayerSwap, verifier: Verifier | None = None) -> LayerChange | None:
    """Install ``swap``; returns the change, or None when the same kernel (with the same verify
    setting) is installed already (kernelize twice)."""
    module, choice = swap.module, swap.choice
    before = module.__dict__.get("forward", _MISSING)
    current = swapped_forward(module)
    if current is not None and current.fn is choice.call and (current.verifier is None) == (verifier is None) \
            and current.graphs is None:
        return None
    previous = current.previous if current is not None else (None if before is _MISSING else before)
    forward = KernelForward.make(module, choice.call, choice.name, previous, verifier)
    _set_forward(module, forward)
    logger.debug("swapped %s (%s) -> %s", swap.path or "<model>", type(module).__qualname__, choice)
    return LayerChange(module, before, forward)


def install_graphs(path: str, module: torch.nn.Module, graphs: GraphSet) -> LayerChange:
    """Run ``module``'s forward (its kernel's, or the original when no kernel is installed) through
    ``graphs``; returns the change."""
    before = module.__dict__.get("forward", _MISSING)
    current = swapped_forward(module)
    if current is not None:
        forward = KernelForward.make(module, current.fn, current.kernel_name, current.previous, current.verifier,
                                     graphs)
    else:
        previous = None if before is _MISSING else before
        fn = type(module).forward if previous is None else (lambda self, *a, **k: previous(*a, **k))
        forward = KernelForward.make(module, fn, "original forward", previous, None, graphs)
    _set_forward(module, forward)
    logger.debug("CUDA graphs for %s (%s)", path or "<model>", type(module).__qualname__)
    return LayerChange(module, before, forward)


def uninstall_forward(module: torch.nn.Module) -> LayerChange | None:
    """Put back the forward the installed kernel replaced; None when no kernel is installed."""
    current = swapped_forward(module)
    if current is None:
        return None
    after = _MISSING if current.previous is None else current.previous
    _set_forward(module, after)
    return LayerChange(module, current, after)


def revert_changes(changes: Iterable[LayerChange]) -> int:
    """Undo ``changes`` (newest first) where the module still holds what the change installed."""
    reverted = 0
    for change in reversed(list(changes)):
        if change.module.__dict__.get("forward", _MISSING) is change.after:
            _set_forward(change.module, change.before)
            reverted += 1
    return reverted


def foreign_forwards(modules: Iterable[torch.nn.Module]) -> list[tuple[torch.nn.Module, Any]]:
    """Modules where twinkle_fx installed a kernel that something else has replaced since."""
    found = []
    with _INSTALLED_LOCK:
        for module in modules:
            ours = _INSTALLED.get(module)
            if ours is not None and module.__dict__.get("forward") is not ours:
                found.append((module, module.__dict__.get("forward")))
    return found


def forget(module: torch.nn.Module) -> None:
    """Drop the ledger entry of ``module`` (after reporting its foreign forward)."""
    with _INSTALLED_LOCK:
        _INSTALLED.pop(module, None)


def restore_layers(modules: Iterable[torch.nn.Module]) -> int:
    """Put back the original forward of every swapped module among ``modules``; returns how many."""
    return sum(uninstall_forward(m) is not None for m in modules)
