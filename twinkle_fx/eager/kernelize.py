"""``kernelize_model``: swap layer forwards of a model and patch registered functions."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch

from ..devices import infer_device, parse_device
from ..errors import KernelSelectionError
from ..modes import Mode, format_mode, parse_mode
from ..registry import get_registry
from ..selection import does_not_apply, select_layer_kernel, signature_mismatch
from ..settings import DISABLE_ENV, kernels_disabled
from .functions import apply_function_kernel, function_verifications, restore_functions
from .layers import LayerSwap, install_forward, restore_layers, swapped_forward
from .verify import Verification, Verifier

logger = logging.getLogger(__name__)

__all__ = ["kernelize_model", "undo_kernelize", "kernelized", "verification_report"]


def _resolve_mode(model: torch.nn.Module | None, mode: Any) -> Mode:
    if mode is not None:
        return parse_mode(mode)
    training = model is not None and model.training and torch.is_grad_enabled() and any(
        p.requires_grad for p in model.parameters()
    )
    inferred = Mode.TRAINING if training else Mode.INFERENCE
    logger.info("twinkle_fx: mode not given; using %r (model.training=%s)", format_mode(inferred),
                None if model is None else model.training)
    return inferred


def _resolve_device(model: torch.nn.Module | None, device: Any) -> str:
    if device is not None:
        return parse_device(device)
    if model is not None:
        return infer_device(model)
    return "cuda" if torch.cuda.is_available() else "cpu"


def _plan_layers(model: torch.nn.Module, device: str, mode: Mode, use_fallback: bool) -> list[LayerSwap]:
    registry = get_registry()
    plan: list[LayerSwap] = []
    fallbacks: dict[tuple[type, str], list[str]] = {}
    for path, module in model.named_modules():
        selection = select_layer_kernel(registry, type(module), device, mode)
        if selection is None:
            continue
        reason = selection.reason
        if selection.choice is not None:
            reason = signature_mismatch(type(module).forward, selection.choice.call)
            if reason is not None:
                reason = f"{selection.choice}: {reason}"
            else:
                reason = does_not_apply(selection.choice, module)
        if reason is None:
            plan.append(LayerSwap(path, module, selection.choice))
            continue
        if not use_fallback:
            raise KernelSelectionError(
                f"{path or '<model>'} ({type(module).__qualname__}) on {device} ({format_mode(mode)}): {reason} "
                "(use_fallback=False; nothing was swapped)"
            )
        fallbacks.setdefault((type(module), reason), []).append(path or "<model>")
    for (cls, reason), paths in fallbacks.items():
        logger.info("twinkle_fx: fallback: kept the original forward of %d %s module(s) (%s%s): %s",
                    len(paths), cls.__qualname__, ", ".join(paths[:3]), ", ..." if len(paths) > 3 else "", reason)
    return plan


def kernelize_model(
    model: torch.nn.Module | None = None,
    mode: Any = None,
    device: str | torch.device | None = None,
    use_fallback: bool = True,
    *,
    verify: bool = False,
) -> torch.nn.Module | None:
    """Swap registered kernels into ``model`` and patch registered functions.

    Each module whose class is bound to a kernel name gets that kernel's forward (on this instance
    only; the class and the state_dict keys are unchanged); then every registered function target
    is patched (see :func:`apply_function_kernel`). Everything is planned before anything changes,
    so an error leaves the model untouched. Kernelizing twice is a no-op; :func:`undo_kernelize`
    restores everything.

    Args:
        model (`nn.Module`, *optional*): `None` patches functions only.
        mode (*optional*): "train", "inference", "compile", "train+compile" (or a `Mode`). Defaults to
            "train" when the model is in training mode with grad enabled, else "inference".
        device (*optional*): defaults to the device of the model's parameters ("cuda" if available
            when there is no model).
        use_fallback (`bool`, defaults to `True`): keep the original forward/function (logged once,
            with the reason) when no kernel fits or it cannot be loaded; `False` raises.
        verify (`bool`, defaults to `False`): on the first call of each swapped layer and function per
            input signature, also run the original and compare outputs (and gradients when training)
            with dtype-aware tolerances; a mismatch is logged with its max error and the original is
            used from then on (``use_fallback=False``: raises KernelVerificationError). See
            :func:`verification_report`.

    Returns:
        The same ``model`` (or None).

    Raises:
        ValueError: unknown mode or device; KernelSelectionError: no usable kernel and use_fallback=False.

    Example:
        >>> register_external_layer(Qwen2MLP, "MyAwesomeMLP")                     # doctest: +SKIP
        >>> model = kernelize_model(model, mode="train", device="cuda", use_fallback=True)  # doctest: +SKIP
        >>> undo_kernelize(model)                                                  # doctest: +SKIP
    """
    wanted = _resolve_mode(model, mode)
    device_type = _resolve_device(model, device)
    if kernels_disabled():
        logger.info("twinkle_fx: %s is set: kernelize_model leaves the model unchanged", DISABLE_ENV)
        return model

    _kernelize(model, wanted, device_type, use_fallback, verify)
    return model


def _kernelize(
    model: torch.nn.Module | None, mode: Mode, device: str, use_fallback: bool, verify: bool = False
) -> tuple[list, list]:
    """Plan and apply; returns (swapped modules, patched function names) for a scoped undo."""
    plan = _plan_layers(model, device, mode, use_fallback) if model is not None else []
    patched: list[str] = []
    if get_registry().function_targets():
        # functions next, still before any layer is touched: a function error leaves nothing half-applied
        patched = apply_function_kernel(device=device, mode=mode, use_fallback=use_fallback, strict=False,
                                        verify=verify)
    swapped = []
    for swap in plan:
        verifier = None
        if verify:
            target = f"{swap.path or '<model>'} ({type(swap.module).__qualname__})"
            verifier = Verifier(target, swap.choice.name, use_fallback=use_fallback)
        if install_forward(swap, verifier):
            swapped.append(swap.module)
    return swapped, patched


def verification_report(model: torch.nn.Module | None = None) -> list[Verification]:
    """Every check made by verify mode: the layers of ``model`` and all patched functions.

    Example:
        >>> kernelize_model(model, mode="train", verify=True)          # doctest: +SKIP
        >>> model(input_ids, labels=input_ids).loss.backward()         # doctest: +SKIP
        >>> for v in verification_report(model): print(v)              # doctest: +SKIP
        model.layers.0.mlp (Qwen2MLP) -> SwiGLUMLP [float32[2, 9, 64]; grad] output: max error 2.4e-07 ok
    """
    results: list[Verification] = []
    if model is not None:
        for module in model.modules():
            forward = swapped_forward(module)
            if forward is not None and forward.verifier is not None:
                results.extend(forward.verifier.results)
    return results + function_verifications()


def undo_kernelize(model: torch.nn.Module | None = None) -> None:
    """Restore the original forward of every swapped module in ``model`` and every patched function.

    Function patches are process-wide (they change module attributes), so their undo is too.
    """
    if model is not None:
        count = restore_layers(model.modules())
        logger.info("twinkle_fx: restored %d layer forward(s) of %s", count, type(model).__qualname__)
    restore_functions()


@contextlib.contextmanager
def kernelized(
    model: torch.nn.Module | None = None,
    mode: Any = None,
    device: str | torch.device | None = None,
    use_fallback: bool = True,
    *,
    verify: bool = False,
) -> Iterator[torch.nn.Module | None]:
    """``kernelize_model`` for the duration of a block; what it swapped is restored on exit (also on error).

    Example:
        >>> with kernelized(model, mode="inference") as fast:   # doctest: +SKIP
        ...     logits = fast(input_ids).logits
    """
    if kernels_disabled():
        yield kernelize_model(model, mode=mode, device=device, use_fallback=use_fallback, verify=verify)
        return
    wanted = _resolve_mode(model, mode)
    device_type = _resolve_device(model, device)
    swapped, patched = _kernelize(model, wanted, device_type, use_fallback, verify)
    try:
        yield model
    finally:
        restore_layers(swapped)
        restore_functions(list(patched))
