"""Per-instance forward replacement for layer kernels, and its exact undo.

A swapped module gets an instance attribute ``forward`` holding a :class:`KernelForward`, which
calls the kernel's ``forward(self, ...)`` with the module as ``self`` (so the kernel reads the
module's own weights and attributes). The class, the parameters and the state_dict keys are
untouched; the object remembers what it replaced, so undo needs no side table and survives
``copy.deepcopy`` and pickling of the model.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from ..selection import KernelChoice
from .verify import Verifier

logger = logging.getLogger(__name__)

__all__ = ["KernelForward", "LayerSwap", "install_forward", "restore_layers", "swapped_forward"]

_MISSING = object()


class KernelForward:
    """The ``forward`` installed on a kernelized module instance."""

    def __init__(
        self,
        module: torch.nn.Module,
        fn: Callable[..., Any],
        kernel_name: str,
        previous: Any,
        verifier: Verifier | None = None,
    ) -> None:
        self.module = module
        self.fn = fn
        self.kernel_name = kernel_name
        self.previous = previous  # the instance-level forward it replaced, or _MISSING
        self.verifier = verifier

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        verifier = self.verifier
        if verifier is not None:
            if verifier.failed:
                return self.reference(*args, **kwargs)
            signature = verifier.needs_check(args, kwargs)
            if signature is not None:
                parameters = [p for p in self.module.parameters() if p.requires_grad]
                result, _ = verifier.check(
                    signature,
                    lambda: self.fn(self.module, *args, **kwargs),
                    lambda: self.reference(*args, **kwargs),
                    parameters,
                    (args, kwargs),
                )
                return result
        return self.fn(self.module, *args, **kwargs)

    @property
    def __signature__(self) -> inspect.Signature:
        # inspect.signature(module.forward) shows the replaced forward's parameters, not (*args,
        # **kwargs): Hugging Face Trainer keeps only the dataset columns that forward names.
        if self.previous is not _MISSING:
            return inspect.signature(self.previous)
        return inspect.signature(type(self.module).forward.__get__(self.module))

    def reference(self, *args: Any, **kwargs: Any) -> Any:
        """The forward this kernel replaced."""
        if self.previous is not _MISSING:
            return self.previous(*args, **kwargs)
        return type(self.module).forward(self.module, *args, **kwargs)

    def __reduce__(self):
        # verification state (locks, seen signatures) is per process: a copy verifies afresh if asked to
        previous = None if self.previous is _MISSING else self.previous
        return (_rebuild_kernel_forward, (self.module, self.fn, self.kernel_name, previous, self.previous is _MISSING))

    def __repr__(self) -> str:
        return f"<twinkle_fx kernel forward {self.kernel_name} of {type(self.module).__qualname__}>"


def _rebuild_kernel_forward(module, fn, kernel_name, previous, missing):
    return KernelForward(module, fn, kernel_name, _MISSING if missing else previous)


def swapped_forward(module: torch.nn.Module) -> KernelForward | None:
    """The :class:`KernelForward` installed on ``module``, if any."""
    forward = module.__dict__.get("forward")
    return forward if isinstance(forward, KernelForward) else None


@dataclass(frozen=True)
class LayerSwap:
    """A planned swap: ``path`` is the module's qualified name in the model."""

    path: str
    module: torch.nn.Module
    choice: KernelChoice


def install_forward(swap: LayerSwap, verifier: Verifier | None = None) -> bool:
    """Install ``swap``; returns False when the same kernel is already installed (kernelize twice)."""
    module, choice = swap.module, swap.choice
    current = swapped_forward(module)
    if current is not None and current.fn is choice.call:
        if verifier is not None and current.verifier is None:
            current.verifier = verifier
        return False
    previous = current.previous if current is not None else module.__dict__.get("forward", _MISSING)
    module.forward = KernelForward(module, choice.call, choice.name, previous, verifier)
    logger.info("twinkle_fx: swapped %s (%s) -> %s", swap.path or "<model>", type(module).__qualname__, choice)
    return True


def _restore_one(module: torch.nn.Module) -> bool:
    current = swapped_forward(module)
    if current is None:
        return False
    if current.previous is _MISSING:
        del module.forward
    else:
        module.forward = current.previous
    return True


def restore_layers(modules: Iterable[torch.nn.Module]) -> int:
    """Put back the original forward of every swapped module among ``modules``; returns how many."""
    return sum(_restore_one(m) for m in modules)
