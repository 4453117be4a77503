"""Function patching: replace ``target_module.func_name`` by its registered kernel, and undo it.

Module attributes are process-wide, so the record of what was patched is too: one ledger, guarded
by a lock, that remembers each original so :func:`restore_functions` puts it back exactly.
Callers that bound the function under another name (``from m import f``) keep the original; that
is the nature of monkey-patching, and why the compile backend matches the computation instead.
"""

from __future__ import annotations

import importlib
import logging
import threading
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from ..devices import parse_device
from ..errors import KernelSelectionError
from ..modes import format_mode, parse_mode
from ..registry import get_registry
from ..selection import select_function_kernel
from ..settings import DISABLE_ENV, kernels_disabled
from .verify import Verification, Verifier

logger = logging.getLogger(__name__)

__all__ = ["PatchedFunctions", "apply_function_kernel", "restore_functions", "patched_functions",
           "function_verifications"]


class VerifiedFunction:
    """A function kernel checked against the original on the first call of each input signature."""

    def __init__(self, kernel: Any, original: Any, verifier: Verifier) -> None:
        self.kernel = kernel
        self.original = original
        self.verifier = verifier
        self.__name__ = getattr(kernel, "__name__", type(kernel).__name__)
        self.__doc__ = getattr(kernel, "__doc__", None)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        verifier = self.verifier
        if verifier.failed:
            return self.original(*args, **kwargs)
        signature = verifier.needs_check(args, kwargs)
        if signature is None:
            return self.kernel(*args, **kwargs)
        result, _ = verifier.check(signature, lambda: self.kernel(*args, **kwargs),
                                   lambda: self.original(*args, **kwargs), [], (args, kwargs))
        return result


@dataclass
class _Patch:
    module: Any
    func_name: str
    original: Any
    replacement: Any


_LEDGER_LOCK = threading.RLock()
_LEDGER: dict[str, _Patch] = {}


class PatchedFunctions(list):
    """The ``"module.func"`` names patched by one call; also a handle to undo exactly those.

    Example:
        >>> with apply_function_kernel(target_module="my_pkg.math_ops", device="cpu") as patched:
        ...     print(patched)          # ['my_pkg.math_ops.add']   # doctest: +SKIP
        >>> # originals are back here
    """

    def restore(self) -> int:
        """Put back the originals of these functions; returns how many were restored."""
        return restore_functions(list(self))

    def __enter__(self) -> "PatchedFunctions":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.restore()


def original_function(target: str) -> Any | None:
    """The function ``target`` ("module.func") held before it was patched here; None if it is not patched."""
    with _LEDGER_LOCK:
        patch = _LEDGER.get(target)
    return None if patch is None else patch.original


def patched_functions() -> list[str]:
    """Every ``"module.func"`` currently patched by twinkle_fx."""
    with _LEDGER_LOCK:
        return list(_LEDGER)


def restore_functions(targets: list[str] | None = None) -> int:
    """Restore the original of each patched target (all when ``targets`` is None)."""
    restored = 0
    with _LEDGER_LOCK:
        for target in list(_LEDGER) if targets is None else targets:
            patch = _LEDGER.pop(target, None)
            if patch is None:
                continue
            setattr(patch.module, patch.func_name, patch.original)
            logger.info("twinkle_fx: restored %s", target)
            restored += 1
    return restored


def _fail(message: str, strict: bool) -> None:
    if strict:
        raise ValueError(message)
    warnings.warn(message, stacklevel=3)
    logger.warning("twinkle_fx: %s", message)


def _default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def apply_function_kernel(
    target_module: str | None = None,
    *,
    device: str | None = None,
    mode: Any = "inference",
    use_fallback: bool = True,
    strict: bool = False,
    verify: bool = False,
) -> PatchedFunctions:
    """Patch every registered function of ``target_module`` (all modules when None) with its kernel.

    Args:
        target_module (`str`, *optional*): only targets in this module.
        device (`str`, *optional*): defaults to "cuda" when available, else "cpu".
        mode (defaults to `"inference"`): "train", "inference", "compile", "train+compile".
        use_fallback (`bool`, defaults to `True`): keep the original (logged) when no kernel fits or it
            cannot be loaded; `False` raises :class:`KernelSelectionError` and patches nothing.
        strict (`bool`, defaults to `False`): raise when a target module cannot be imported, a
            registered function does not exist there, or nothing at all was patched; otherwise warn.
            A missing function is never created.
        verify (`bool`, defaults to `False`): check each kernel against the original on its first
            call per input signature (see :mod:`twinkle_fx.eager.verify`); a mismatch is logged and
            the original is used (``use_fallback=False``: raises).

    Returns:
        :class:`PatchedFunctions`, the list of patched ``"module.func"`` names (also an undo handle).

    Example:
        >>> register_function_kernel(func_name="add", target_module="my_pkg.math_ops", func_impl=fast_add,
        ...                          device="cpu", mode="inference")  # doctest: +SKIP
        >>> apply_function_kernel(target_module="my_pkg.math_ops", device="cpu", mode="inference")  # doctest: +SKIP
        ['my_pkg.math_ops.add']
    """
    device_type = parse_device(device if device is not None else _default_device())
    wanted = parse_mode(mode)
    if kernels_disabled():
        logger.info("twinkle_fx: %s is set: no function kernels applied", DISABLE_ENV)
        return PatchedFunctions()
    registry = get_registry()
    targets = registry.function_targets(target_module)
    if not targets:
        _fail(f"no function kernels are registered{' for ' + target_module if target_module else ''}", strict)
        return PatchedFunctions()

    plan: list[tuple[str, Any, str, Any]] = []
    for target in targets:
        module_name, func_name = target.rsplit(".", 1)
        try:
            module = importlib.import_module(module_name)
        except Exception as e:
            _fail(f"target_module {module_name!r} of {target} cannot be imported: {type(e).__name__}: {e}", strict)
            continue
        if not hasattr(module, func_name):
            _fail(f"{module_name!r} has no attribute {func_name!r}: nothing to patch for {target} (check func_name)", strict)
            continue
        selection = select_function_kernel(registry, target, device_type, wanted)
        if selection.choice is None:
            if not use_fallback:
                raise KernelSelectionError(f"{selection} (use_fallback=False)")
            logger.info("twinkle_fx: fallback: kept %s: %s", target, selection.reason)
            continue
        plan.append((target, module, func_name, selection.choice))

    patched = PatchedFunctions()
    with _LEDGER_LOCK:
        for target, module, func_name, choice in plan:
            current = _LEDGER.get(target)
            if (current is not None and getattr(current.replacement, "kernel", current.replacement) is choice.call
                    and getattr(module, func_name) is current.replacement
                    and isinstance(current.replacement, VerifiedFunction) == verify):
                patched.append(target)  # already patched with this kernel: idempotent
                continue
            original = current.original if current is not None else getattr(module, func_name)
            replacement = choice.call
            if verify:
                replacement = VerifiedFunction(choice.call, original, Verifier(target, str(choice.registration.source.describe()),
                                                                              use_fallback=use_fallback))
            setattr(module, func_name, replacement)
            _LEDGER[target] = _Patch(module, func_name, original, replacement)
            logger.info("twinkle_fx: patched %s -> %s [%s, %s]", target, choice.registration.source.describe(),
                        device_type, format_mode(wanted))
            patched.append(target)
    if strict and not patched:
        raise ValueError(f"strict=True: no function was patched{' in ' + target_module if target_module else ''}.")
    return patched


def function_verifications() -> list[Verification]:
    """The verifications of every patched function applied with ``verify=True``."""
    with _LEDGER_LOCK:
        patches = list(_LEDGER.values())
    return [v for p in patches if isinstance(p.replacement, VerifiedFunction) for v in p.replacement.verifier.results]
