"""What twinkle_fx has swapped right now, and the one place that changes it.

Both paths ask: the eager path before it swaps again or undoes, the compile backend before it
rewrites a region whose module already runs a kernel or traces a function that is patched. So the
bookkeeping lives here, below both, and neither path imports the other to ask.

Layers: a swapped module gets an instance attribute ``forward`` holding a :class:`KernelForward`, a
``functools.partial(kernel_forward, module)``: the kernel's ``forward(self, ...)`` runs with the module
as ``self`` (it reads the module's own weights and attributes) and a call adds no Python frame of ours
(a partial is called from C). The class, the parameters and the state_dict keys are untouched; the
object remembers what it replaced, so undo needs no side table and survives ``copy.deepcopy`` and
pickling of the model. A weak ledger remembers which forward was installed on which module, so an
undo notices a forward that another tool (``kernels.kernelize``, say) put there afterwards.

Functions: module attributes are process-wide, so the record of what was patched is too: one ledger,
guarded by a lock, that remembers each original so an undo puts it back exactly.

Examples:
    >>> from twinkle_fx import kernelize_model, register_external_layer, register_layer_kernel
    >>> class FastGelu(nn.Module):
    ...     def forward(self, input):
    ...         return nn.functional.gelu(input, approximate="tanh")
    >>> _ = register_layer_kernel(kernel_name="FastGelu", layer=FastGelu, device="cpu")
    >>> register_external_layer(nn.GELU, "FastGelu")
    >>> model = kernelize_model(nn.Sequential(nn.Linear(4, 4), nn.GELU()), mode="inference", device="cpu")
    >>> swapped_forward(model[0]) is None, swapped_forward(model[1]).kernel_name
    (True, 'FastGelu')
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
import types
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from .selection import KernelChoice

logger = logging.getLogger(__name__)

__all__ = ["KernelForward", "LayerSwap", "LayerChange", "MISSING", "swapped_forward", "foreign_forward",
           "set_forward", "install_forward", "uninstall_forward", "revert_changes", "overwritten_forwards", "forget",
           "FunctionPatch", "FunctionChange", "PATCHES_LOCK", "current_patch", "current_patches",
           "original_function", "patched_functions", "set_patch", "revert_patches", "unpatch_all",
           "restore_function_targets"]

# -- layers ------------------------------------------------------------------------------------

MISSING = object()  # "no instance-level forward": the class's forward is the one to go back to


class KernelForward(functools.partial):
    """The ``forward`` installed on a kernelized module instance: ``partial(run, module)``.

    Attributes:
        fn: the kernel's ``forward(self, ...)``.
        kernel_name: the registered kernel name.
        previous: the instance-level forward it replaced (None: the class's ``forward``).
        verifier: the :class:`~twinkle_fx.eager.verify.Verifier` in verify mode, else None.
        graphs: the model's :class:`~twinkle_fx.eager.cuda_graphs.layer_graphs.GraphSet` when this module's forward runs
            through CUDA graphs (``kernelize_model(..., cuda_graphs=True)``), else None.
    """

    fn: Callable[..., Any]
    kernel_name: str
    previous: Any
    verifier: Any
    graphs: Any

    @classmethod
    def make(cls, module: torch.nn.Module, fn: Callable[..., Any], kernel_name: str, previous: Any = None,
             verifier: Any = None, graphs: Any = None, *, run: Callable[..., Any] | None = None) -> "KernelForward":
        """``run`` is what a call runs, ``run(module, *args, **kwargs)``: ``fn`` itself unless the eager
        path wraps it (verify mode checks it through ``verifier``, CUDA graphs replay it through ``graphs``)."""
        if run is None and (verifier is not None or graphs is not None):
            raise ValueError(f"KernelForward.make({kernel_name!r}): a verifier or CUDA graphs need the run= that "
                             "checks or replays the kernel (twinkle_fx.eager.layers makes it)")
        forward = cls(fn if run is None else run, module)
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


def swapped_forward(module: torch.nn.Module) -> KernelForward | None:
    """The :class:`KernelForward` installed on ``module``, if any."""
    forward = module.__dict__.get("forward")
    return forward if isinstance(forward, KernelForward) else None


def foreign_forward(module: torch.nn.Module) -> str | None:
    """Who replaced ``module.forward``, when something other than twinkle_fx did (``kernels.kernelize``
    binds a kernel layer's ``forward`` to the instance); None for the class's own forward.

    Examples:
        >>> kernels.kernelize(model, mode=kernels.Mode.INFERENCE, device="cpu")   # doctest: +SKIP
        >>> foreign_forward(model.model.norm)                                     # doctest: +SKIP
        'kernels.kernelize (twinkle_triton.layers.RMSNorm.forward)'
    """
    forward = module.__dict__.get("forward")
    if not isinstance(forward, types.MethodType) or forward.__self__ is not module:
        return None  # the class's forward, or twinkle_fx's own KernelForward (not a method)
    function = forward.__func__
    if function is getattr(type(module), "forward", None):
        return None  # kernels' fallback re-binds the class's own forward
    owner = f"{getattr(function, '__module__', '?')}.{getattr(function, '__qualname__', repr(function))}"
    tool = "kernels.kernelize" if isinstance(getattr(type(module), "kernel_layer_name", None), str) else "another tool"
    return f"{tool} ({owner})"


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
    before: Any  # the instance-level forward before, or MISSING
    after: Any   # what was installed, or MISSING (a revert to the class's forward)


def set_forward(module: torch.nn.Module, forward: Any) -> None:
    """Make ``forward`` the instance-level forward of ``module`` (MISSING: the class's), in the ledger too."""
    if forward is MISSING:
        module.__dict__.pop("forward", None)
    else:
        module.forward = forward
    with _INSTALLED_LOCK:
        if isinstance(forward, KernelForward):
            _INSTALLED[module] = forward
        else:
            _INSTALLED.pop(module, None)


def install_forward(swap: LayerSwap, verifier: Any = None, *,
                    run: Callable[..., Any] | None = None) -> LayerChange | None:
    """Install ``swap``; returns the change, or None when the same kernel (with the same verify
    setting) is installed already (kernelize twice). ``verifier`` and ``run`` as for
    :meth:`KernelForward.make`."""
    module, choice = swap.module, swap.choice
    before = module.__dict__.get("forward", MISSING)
    current = swapped_forward(module)
    if current is not None and current.fn is choice.call and (current.verifier is None) == (verifier is None) \
            and current.graphs is None:
        return None
    previous = current.previous if current is not None else (None if before is MISSING else before)
    forward = KernelForward.make(module, choice.call, choice.name, previous, verifier, run=run)
    set_forward(module, forward)
    logger.debug("swapped %s (%s) -> %s", swap.path or "<model>", type(module).__qualname__, choice)
    return LayerChange(module, before, forward)


def uninstall_forward(module: torch.nn.Module) -> LayerChange | None:
    """Put back the forward the installed kernel replaced; None when no kernel is installed."""
    current = swapped_forward(module)
    if current is None:
        return None
    after = MISSING if current.previous is None else current.previous
    set_forward(module, after)
    return LayerChange(module, current, after)


def revert_changes(changes: Iterable[LayerChange]) -> int:
    """Undo ``changes`` (newest first) where the module still holds what the change installed."""
    reverted = 0
    for change in reversed(list(changes)):
        if change.module.__dict__.get("forward", MISSING) is change.after:
            set_forward(change.module, change.before)
            reverted += 1
    return reverted


def overwritten_forwards(modules: Iterable[torch.nn.Module]) -> list[tuple[torch.nn.Module, Any]]:
    """Modules where twinkle_fx installed a kernel that something else has replaced since."""
    found = []
    with _INSTALLED_LOCK:
        for module in modules:
            ours = _INSTALLED.get(module)
            if ours is not None and module.__dict__.get("forward") is not ours:
                found.append((module, module.__dict__.get("forward")))
    return found


def forget(module: torch.nn.Module) -> None:
    """Drop the ledger entry of ``module`` (after reporting its overwritten forward)."""
    with _INSTALLED_LOCK:
        _INSTALLED.pop(module, None)


# -- functions ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class FunctionPatch:
    """``module.func_name`` holds ``replacement`` instead of ``original``."""

    module: Any
    func_name: str
    original: Any
    replacement: Any


@dataclass(frozen=True)
class FunctionChange:
    """One change of the ledger, so a scoped undo puts ``before`` back (None: not patched)."""

    target: str
    before: FunctionPatch | None
    after: FunctionPatch | None


# held by whoever reads the ledger and then changes it, so the two are one step
PATCHES_LOCK = threading.RLock()
_LEDGER: dict[str, FunctionPatch] = {}


def current_patch(target: str) -> FunctionPatch | None:
    """The patch of ``target`` ("module.func") in the ledger, if any."""
    with PATCHES_LOCK:
        return _LEDGER.get(target)


def current_patches() -> list[FunctionPatch]:
    """Every patch in the ledger."""
    with PATCHES_LOCK:
        return list(_LEDGER.values())


def original_function(target: str) -> Any | None:
    """The function ``target`` ("module.func") held before it was patched here; None if it is not patched."""
    patch = current_patch(target)
    return None if patch is None else patch.original


def patched_functions() -> list[str]:
    """Every ``"module.func"`` currently patched by twinkle_fx."""
    with PATCHES_LOCK:
        return list(_LEDGER)


def set_patch(target: str, patch: FunctionPatch | None, fallback: FunctionPatch) -> None:
    """Make ``patch`` the state of ``target`` (None: the original, from ``fallback``)."""
    with PATCHES_LOCK:
        if patch is None:
            setattr(fallback.module, fallback.func_name, fallback.original)
            _LEDGER.pop(target, None)
        else:
            setattr(patch.module, patch.func_name, patch.replacement)
            _LEDGER[target] = patch


def revert_patches(changes: list[FunctionChange]) -> int:
    """Undo ``changes`` (newest first) where nothing changed the target since; returns how many."""
    reverted = 0
    with PATCHES_LOCK:
        for change in reversed(changes):
            current = _LEDGER.get(change.target)
            if current is not change.after:
                continue  # changed again since: that later change owns the state now
            if change.after is not None and getattr(change.after.module, change.after.func_name) is not change.after.replacement:
                continue  # replaced by something else: not ours to touch
            set_patch(change.target, change.before, change.after or change.before)
            logger.info("restored %s", change.target)
            reverted += 1
    return reverted


def unpatch_all() -> list[FunctionChange]:
    """Put back the original of every function twinkle_fx patched (and still holds); returns the
    changes, so a scoped caller can patch them again."""
    changes = []
    with PATCHES_LOCK:
        for target, patch in list(_LEDGER.items()):
            if getattr(patch.module, patch.func_name, None) is patch.replacement:
                set_patch(target, None, patch)
                changes.append(FunctionChange(target, patch, None))
    return changes


def restore_function_targets(targets: list[str] | None = None) -> list[str]:
    """Restore the original of each patched target (all when ``targets`` is None); returns the
    ``"module.func"`` targets put back.

    A function that something else replaced after twinkle_fx patched it is left as it is (a
    WARNING names it); twinkle_fx forgets its patch.
    """
    restored = []
    with PATCHES_LOCK:
        for target in list(_LEDGER) if targets is None else targets:
            patch = _LEDGER.pop(target, None)
            if patch is None:
                continue
            current = getattr(patch.module, patch.func_name, None)
            if current is not patch.replacement:
                logger.warning("%s was replaced by %r after twinkle_fx patched it; left as it is (restore it with "
                               "the tool that replaced it)", target, current)
                continue
            setattr(patch.module, patch.func_name, patch.original)
            logger.info("restored %s", target)
            restored.append(target)
    return restored
