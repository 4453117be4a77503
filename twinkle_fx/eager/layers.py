"""Per-instance forward replacement for layer kernels, as the eager path makes it.

What is installed where, and its exact undo, is :mod:`twinkle_fx.core.swaps` (the compile backend
asks it too); this module adds what only the eager path puts around a kernel's forward: the checks
of verify mode and the CUDA graphs. Everything that could be a per-call check is decided when the
swap is made: verify mode installs a different function, not a branch.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable
from typing import Any

import torch

from ..core.swaps import MISSING, KernelForward, LayerChange, set_forward, swapped_forward, uninstall_forward
from .cuda_graphs.layer_graphs import GraphSet
from .cuda_graphs.model_graphs import ModelGraphs
from .verify import Verifier

logger = logging.getLogger(__name__)

__all__ = ["CheckedForward", "checked", "GraphedForward", "install_graphs", "restore_layers"]


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


def checked(fn: Callable[..., Any], verifier: Verifier | None) -> Callable[..., Any]:
    """What a call of a swapped forward runs: ``fn``, through verify mode's checks when there is a verifier."""
    return fn if verifier is None else CheckedForward(fn, verifier)


class GraphedForward:
    """The function of a :class:`KernelForward` with CUDA graphs: ``fn`` (the kernel's or the
    original forward) run through ``graphs``, a block's :class:`GraphSet` or the model's
    whole-forward :class:`ModelGraphs` (both take ``call(fn, module, args, kwargs)``).

    While ``torch.compile`` traces the module it runs ``fn`` as it is: a graph replay is no op Dynamo can trace.
    """

    def __init__(self, fn: Callable[..., Any], graphs: GraphSet | ModelGraphs) -> None:
        self.fn = fn
        self.graphs = graphs

    def __call__(self, module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():
            return self.fn(module, *args, **kwargs)
        return self.graphs.call(self.fn, module, args, kwargs)


def install_graphs(path: str, module: torch.nn.Module, graphs: GraphSet,
                   model_graphs: ModelGraphs | None = None) -> LayerChange:
    """Run ``module``'s forward (its kernel's, or the original when no kernel is installed) through
    ``graphs`` (a block) or ``model_graphs`` (the model itself: whole-forward decode graphs);
    returns the change."""
    before = module.__dict__.get("forward", MISSING)
    current = swapped_forward(module)
    if current is not None:
        fn, name, previous, verifier = current.fn, current.kernel_name, current.previous, current.verifier
    else:
        previous = None if before is MISSING else before
        fn = type(module).forward if previous is None else (lambda self, *a, **k: previous(*a, **k))
        name, verifier = "original forward", None
    run = checked(fn, verifier)
    run = GraphedForward(run, graphs if model_graphs is None else model_graphs)
    forward = KernelForward.make(module, fn, name, previous, verifier, graphs, run=run)
    set_forward(module, forward)
    logger.debug("CUDA graphs for %s (%s)", path or "<model>", type(module).__qualname__)
    return LayerChange(module, before, forward)


def restore_layers(modules: Iterable[torch.nn.Module]) -> int:
    """Put back the original forward of every swapped module among ``modules``; returns how many."""
    return sum(uninstall_forward(m) is not None for m in modules)
