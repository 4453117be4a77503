"""``twinkle_fx.compile(model)``: the one call for compiled training and inference.

``torch.compile(model, backend="twinkle")`` rewrites the graph Dynamo captures inside ``model``,
but the module being compiled is no graph region (its ``forward`` is the frame itself), so a kernel
bound to the root's class, the built-in fused-loss head of ``*ForCausalLM``, cannot be swapped by
the rewrite. This call installs that one kernel on the root module first (the eager swap, undoable
with :func:`twinkle_fx.undo_kernelize`), leaves every submodule to the graph rewrite, and compiles
with ``backend="twinkle"``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch

from ..core.devices import check_device_available, check_model_device, infer_device, parse_device
from ..core.errors import check_flag
from ..core.modes import format_mode, parse_mode
from ..core.registry import get_registry
from ..core.selection import select_layer_kernel, signature_mismatch
from ..core.settings import kernels_disabled
from ..core.swaps import LayerSwap, install_forward, swapped_forward
from ..core.torch_internals import inductor_mode_options
from .options import COMPILERS, parse_options

logger = logging.getLogger(__name__)

__all__ = ["compile_model"]


def _install_root_kernel(model: torch.nn.Module, device: str, training: bool) -> tuple[str, bool] | None:
    """Swap the kernel bound to ``type(model)`` into ``model`` itself; returns (why not, whether a
    kernel was bound at all), or None when it was installed."""
    mode = parse_mode("train+compile" if training else "compile")
    selection = select_layer_kernel(get_registry(), type(model), device, mode)
    if selection is None:
        return f"no kernel is bound to {type(model).__qualname__}", False
    reason = selection.reason
    if selection.choice is not None:
        reason = signature_mismatch(type(model).forward, selection.choice.call)
    if reason is not None:
        return f"{type(model).__qualname__} on {device} ({format_mode(mode)}): {reason}", True
    install_forward(LayerSwap("", model, selection.choice))
    return None


def _check_arguments(caller: str, model: Any, root: torch.nn.Module, *, mode: str | None, options: Any,
                     fused_loss: Any, device: Any, fullgraph: Any, dynamic: Any) -> str | None:
    """Every argument of :func:`compile_model` checked before the model changes; returns the device
    type asked for (None: the model's)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"{caller}: model is a {type(model).__name__}; pass an nn.Module.")
    check_flag(f"{caller}: fused_loss", fused_loss)
    check_flag(f"{caller}: fullgraph", fullgraph)
    if dynamic is not None and not isinstance(dynamic, bool):
        raise TypeError(f"{caller}: dynamic must be True, False or None (as for torch.compile), got {dynamic!r}.")
    if mode is not None and options is not None:
        raise ValueError(f"{caller}: pass either mode= (torch.compile's, e.g. 'reduce-overhead') or "
                         "options= (the twinkle backend's), not both, as torch.compile requires.")
    if mode is not None:
        modes = list(inductor_mode_options())
        if mode not in modes:
            raise ValueError(f"{caller}: mode={mode!r} is not a torch.compile mode; valid modes: {', '.join(modes)} "
                             "(the twinkle backend's own mode, 'train' or 'inference', goes in options={'mode': ...}).")
    if options is not None and not isinstance(options, Mapping):
        hint = f"; for the inner compiler pass options={{'compiler': {options!r}}}" if options in COMPILERS else ""
        raise TypeError(f"{caller}: options must be a dict of the twinkle backend's options, got "
                        f"{type(options).__name__} {options!r:.60}{hint}.")
    parse_options(options)  # a misspelt option fails here, not at the first call after the head went in
    if device is None:
        return None
    target = parse_device(device)
    check_model_device(root, target)
    check_device_available(target)
    return target


def prepare_compile(caller: str, model: Any, root: torch.nn.Module, *, mode: str | None,
                    options: dict[str, Any] | None, fused_loss: bool, device: str | None,
                    fullgraph: bool = False, dynamic: bool | None = None) -> dict[str, Any] | None:
    """What :func:`compile_model` and :func:`~twinkle_fx.compile.regional.compile_layers` do before
    compiling: check every argument, then install the fused-loss head on ``root`` (unless kernelized
    already) and return the backend options, with ``swap_policy="measured"`` by default in training.

    A head that is bound to the model's class but cannot be installed is a WARNING with the reason:
    the model then builds the full logits, and the memory the fused loss saves is gone."""
    target = _check_arguments(caller, model, root, mode=mode, options=options, fused_loss=fused_loss, device=device,
                              fullgraph=fullgraph, dynamic=dynamic)
    training = root.training if options is None or "mode" not in options else "train" in str(options["mode"])
    if training and mode is None and (options is None or "swap_policy" not in options):
        options = {**(options or {}), "swap_policy": "measured"}  # see compile_model's docstring: fewer launches
    if fused_loss and not kernels_disabled() and swapped_forward(root) is None:
        why_not = _install_root_kernel(root, target or infer_device(root), training)
        if why_not is not None:
            reason, bound = why_not
            # nothing bound (a model with no fused-loss kernel registered) is no loss; a bound head
            # that does not fit is one, and a silent one unless said at WARNING
            logger.log(logging.WARNING if bound else logging.INFO,
                       "%s: the kernel bound to the model's own class (the fused-loss head) is not installed, so "
                       "the model computes its full logits: %s", caller, reason)
    return options


def compile_model(
    model: torch.nn.Module,
    *,
    mode: str | None = None,
    options: dict[str, Any] | None = None,
    fullgraph: bool = False,
    dynamic: bool | None = None,
    device: str | torch.device | None = None,
    fused_loss: bool = True,
) -> torch.nn.Module:
    """Compile ``model`` with the ``twinkle`` backend, its own registered kernel (the fused-loss head) included.

    Call it as ``twinkle_fx.compile(model, ...)``. Registrations come from the registry as for
    ``torch.compile(model, backend="twinkle")`` (for example ``use_builtin_kernels()``).

    Args:
        model (`nn.Module`): the model; with the built-in kernels, a transformers ``*ForCausalLM``, or
            one wrapped in ``DistributedDataParallel`` (the head goes into ``model.module``) or ``fully_shard``.
        mode (`str`, *optional*): torch.compile's ``mode`` (e.g. ``"reduce-overhead"`` for CUDA graphs),
            passed through; not together with ``options``. With ``"reduce-overhead"`` every region is
            swapped (no ``swap_policy="measured"``: replayed launches cost no host time), and a training
            loop must set each ``.grad`` to None before the step (``optimizer.zero_grad()``): a ``.grad``
            kept from the previous step is that step's backward-graph buffer, invalidated by the next
            call, and the backward adding into it raises (see the README, "Speed options").
        options (`dict`, *optional*): the backend's options (``compiler``, ``mode`` "train" / "inference",
            ``verify``, ``report``; see the README), passed through. In training without ``mode``,
            ``swap_policy`` defaults to ``"measured"`` here (the backend's own default is ``"always"``):
            Inductor's code is kept for the regions the per-op table measured slower in training
            (RMSNorm, SwiGLUMLP on CUDA); rotary and the fused-loss head are still swapped. Why: with
            every region swapped, the reference training step (Qwen2-0.5B shape, 4 x 1024, bf16, H100,
            torch 2.11) ran 1,339 kernels against Inductor's 1,171 for 2% less device time (34.1 vs
            34.9 ms), and on a host-bound machine took 72.3 ms against Inductor's 40.1 (host 59.1 vs
            38.9 ms): each extra region brings its own launches and unfused neighbours (residual adds,
            the norm weight-gradient sums). Pass ``options={"swap_policy": "always"}`` to swap them all.
        fullgraph (`bool`, defaults to `False`), dynamic (`bool`, *optional*): as for ``torch.compile``.
        device (`str`, *optional*): the device the kernels are selected for; defaults to the model's.
        fused_loss (`bool`, defaults to `True`): install the kernel bound to the model's own class (the
            fused-loss head). In training with labels the loss then comes without logits
            (``outputs.logits is None``); ``False`` compiles the model as ``torch.compile`` would.

    Returns:
        The compiled module (``torch.compile``'s ``OptimizedModule``); ``model`` itself carries the
        head's forward until :func:`twinkle_fx.undo_kernelize` ``(model)``.

    Every argument is checked before the model changes: a bad one leaves the model as it was. When a
    fused-loss head is bound to the model's class but cannot be installed (a signature that does not
    match, no kernel for the device or mode), a WARNING says why.

    Raises:
        TypeError: ``model`` is no nn.Module, ``options`` is no dict, or a flag is not a bool.
        ValueError: ``mode`` together with ``options`` (as torch.compile), an unknown ``mode``, an unknown
            or misspelt backend option, an unknown device, a device the weights are not on, or a GPU
            device without a GPU.

    Examples:
        ```python
        import twinkle_fx
        from twinkle_fx.builtin import use_builtin_kernels

        use_builtin_kernels()
        compiled = twinkle_fx.compile(model)          # fused-loss head + backend="twinkle"
        loss = compiled(input_ids=ids, labels=ids).loss
        ```
    """
    # DistributedDataParallel(model): the head is the wrapped model's (DDP's forward calls it)
    root = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
    options = prepare_compile("twinkle_fx.compile", model, root, mode=mode, options=options, fused_loss=fused_loss,
                              device=device, fullgraph=fullgraph, dynamic=dynamic)
    return torch.compile(model, backend="twinkle", mode=mode, options=options, fullgraph=fullgraph, dynamic=dynamic)
