"""Function patching: replace ``target_module.func_name`` by its registered kernel, and undo it.

What is patched now is the ledger of :mod:`twinkle_fx.core.swaps` (process-wide, as module
attributes are), which remembers each original so :func:`restore_functions` puts it back exactly.
Callers that bound the function under another name (``from m import f``) keep the original; that
is the nature of monkey-patching, and why the compile backend matches the computation instead.
"""

from __future__ import annotations

import importlib
import logging
import warnings
from typing import Any

import torch

from ..core.devices import check_device_available, parse_device
from ..core.errors import KernelSelectionError, check_flag
from ..core.modes import format_mode, parse_mode
from ..core.registry import get_registry
from ..core.selection import select_function_kernel
from ..core.settings import DISABLE_ENV, kernels_disabled
from ..core.swaps import (PATCHES_LOCK, FunctionChange, FunctionPatch, current_patch, current_patches,
                          restore_function_targets, revert_patches, set_patch)
from .verify import Verification, Verifier

logger = logging.getLogger(__name__)

__all__ = ["PatchedFunctions", "apply_function_kernel", "restore_functions", "function_verifications"]


class VerifiedFunction:
    """A function kernel checked against the original on the first call of each input signature.

    Its call runs outside any ``torch.compile`` graph (a graph break), so the checks also run in a
    compiled model; verify mode is for finding wrong kernels, not for speed.
    """

    def __init__(self, kernel: Any, original: Any, verifier: Verifier) -> None:
        self.kernel = kernel
        self.original = original
        self.verifier = verifier
        self.__name__ = getattr(kernel, "__name__", type(kernel).__name__)
        self.__doc__ = getattr(kernel, "__doc__", None)

    @torch.compiler.disable
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        verifier = self.verifier
        if verifier.failed:
            return self.original(*args, **kwargs)
        signature = verifier.needs_check(args, kwargs)
        if signature is None:
            return self.kernel(*args, **kwargs)
        result, _ = verifier.check(signature, self.kernel, self.original, [], args, kwargs)
        return result


class PatchedFunctions(list):
    """The ``"module.func"`` names patched by one call; also a handle to undo what that call changed.

    Examples:
        >>> import my_pkg.math_ops
        >>> from twinkle_fx import register_function_kernel
        >>> from my_pkg.fast_ops import fast_add   # examples/my_pkg: a Triton add
        >>> _ = register_function_kernel(func_name="add", target_module="my_pkg.math_ops", func_impl=fast_add)
        >>> with apply_function_kernel(target_module="my_pkg.math_ops", device="cpu") as patched:
        ...     print(patched, my_pkg.math_ops.add is fast_add)
        ['my_pkg.math_ops.add'] True
        >>> my_pkg.math_ops.add is fast_add   # what the call patched is back (a patch an earlier call made stays)
        False
    """

    def __init__(self, targets: list[str] = (), changes: list[FunctionChange] = ()) -> None:
        super().__init__(targets)
        self._changes = list(changes)
        self._kept: list[tuple[str, str]] = []  # (target, why its original was kept)

    def restore(self) -> int:
        """Undo what this call changed (where nothing changed it since); returns how many targets."""
        return revert_patches(self._changes)

    def __enter__(self) -> "PatchedFunctions":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.restore()


def restore_functions(targets: list[str] | None = None) -> int:
    """Restore the original of each patched target (all when ``targets`` is None); returns how many.

    A function that something else replaced after twinkle_fx patched it is left as it is (a
    WARNING names it); twinkle_fx forgets its patch.
    """
    return len(restore_function_targets(targets))


def _fail(message: str, strict: bool) -> None:
    if strict:
        raise ValueError(message)
    warnings.warn(message, stacklevel=3)
    logger.warning("%s", message)


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

    A target that is patched already but has no usable kernel now (another mode, or registrations
    that changed) gets its original back.

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

    Examples:
        >>> from twinkle_fx import register_function_kernel
        >>> from my_pkg.fast_ops import fast_add   # examples/my_pkg: a Triton add
        >>> _ = register_function_kernel(func_name="add", target_module="my_pkg.math_ops", func_impl=fast_add,
        ...                              device="cpu", mode="inference")
        >>> apply_function_kernel(target_module="my_pkg.math_ops", device="cpu", mode="inference")
        ['my_pkg.math_ops.add']
        >>> restore_functions()
        1
    """
    if target_module is not None and not isinstance(target_module, str):
        raise TypeError(f"target_module must be a dotted module path or None, got {target_module!r}.")
    for name, value in (("use_fallback", use_fallback), ("strict", strict), ("verify", verify)):
        check_flag(name, value)
    device_type = parse_device(device if device is not None else _default_device())
    check_device_available(device_type)
    wanted = parse_mode(mode)
    if kernels_disabled():
        logger.info("%s is set: no function kernels applied", DISABLE_ENV)
        return PatchedFunctions()
    patched = _apply(target_module, device_type, wanted, use_fallback, strict, verify)
    if patched._kept:
        logger.warning("apply_function_kernel: %s", "; ".join(f"kept {target}: {reason}" for target, reason in patched._kept))
    return patched


def _apply(target_module: str | None, device_type: str, wanted: Any, use_fallback: bool, strict: bool,
           verify: bool) -> PatchedFunctions:
    registry = get_registry()
    targets = registry.function_targets(target_module)
    if not targets:
        where = ""
        if target_module:
            where = f" for {target_module}"
            if target_module in registry.function_targets():
                where += " (pass the module, not 'module.function', as target_module)"
        _fail(f"no function kernels are registered{where}", strict)
        return PatchedFunctions()

    plan: list[tuple[str, Any, str, Any]] = []
    unusable: list[tuple[str, str]] = []
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
            unusable.append((target, selection.reason or ""))
            continue
        plan.append((target, module, func_name, selection.choice))

    changes: list[FunctionChange] = []
    patched = PatchedFunctions()
    with PATCHES_LOCK:
        for target, reason in unusable:
            stale = current_patch(target)
            if stale is not None and getattr(stale.module, stale.func_name) is stale.replacement:
                # a kernel an earlier call installed does not serve this call: the original again
                set_patch(target, None, stale)
                changes.append(FunctionChange(target, stale, None))
                logger.info("restored %s: the kernel installed earlier does not apply now (%s)", target, reason)
        if unusable and not use_fallback:
            target, reason = unusable[0]
            raise KernelSelectionError(
                f"{target} on {device_type} ({format_mode(wanted)}): no kernel: {reason} (use_fallback=False; "
                "nothing was patched" + (f", {len(changes)} earlier patch(es) that do not apply were restored)"
                                         if changes else ")"))
        for target, module, func_name, choice in plan:
            current = current_patch(target)
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
            after = FunctionPatch(module, func_name, original, replacement)
            set_patch(target, after, after)
            changes.append(FunctionChange(target, current, after))
            logger.info("patched %s -> %s [%s, %s]", target, choice.registration.source.describe(),
                        device_type, format_mode(wanted))
            patched.append(target)
    patched._changes = changes
    patched._kept = unusable
    if strict and not patched:
        raise ValueError(f"strict=True: no function was patched{' in ' + target_module if target_module else ''}.")
    return patched


def function_verifications() -> list[Verification]:
    """The verifications of every patched function applied with ``verify=True``."""
    return [v for p in current_patches() if isinstance(p.replacement, VerifiedFunction) for v in p.replacement.verifier.results]

