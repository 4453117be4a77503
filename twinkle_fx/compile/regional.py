"""Regional compilation: each repeated block (decoder layer) compiled on its own with ``backend="twinkle"``.

``torch.compile`` of the whole model makes one large graph (split further by DDP's bucket
boundaries or FSDP2's hooks); compiling each decoder layer instead gives one small graph that every
layer of the same class shares (one compilation instead of one per layer or per piece), and the
layers stay ordinary modules, so ``DistributedDataParallel`` and ``fully_shard`` wrap them as
usual. The root module is not compiled, so its own kernel (the built-in fused-loss head of
``*ForCausalLM``) is installed eagerly, as :func:`twinkle_fx.compile` does.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import torch

from .one_call import prepare_compile

logger = logging.getLogger(__name__)

__all__ = ["compile_layers", "repeated_layers"]


def repeated_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder layers of a transformers model: the modules of the classes its ``_no_split_modules`` names
    (outermost only, in ``model.modules()`` order).

    Raises:
        ValueError: the model names no such classes or none of them is in it; pass ``layers=`` then.
    """
    names = set(getattr(model, "_no_split_modules", None) or ())
    found: list[torch.nn.Module] = []
    inside: set[int] = set()
    for module in model.modules():
        if id(module) in inside:
            continue
        if type(module).__name__ in names:
            found.append(module)
            inside.update(id(m) for m in module.modules())
    if not found:
        raise ValueError(
            f"compile_layers: {type(model).__name__} has no module of a class its _no_split_modules names "
            f"({sorted(names) or 'none'}); pass layers=[...] (for example model.model.layers)."
        )
    return found


def compile_layers(
    model: torch.nn.Module,
    *,
    layers: Iterable[torch.nn.Module] | None = None,
    mode: str | None = None,
    options: dict[str, Any] | None = None,
    fullgraph: bool = False,
    dynamic: bool | None = None,
    device: str | torch.device | None = None,
    fused_loss: bool = True,
) -> torch.nn.Module:
    """Compile each decoder layer of ``model`` in place with ``backend="twinkle"`` and install the root's kernel.

    Each layer gets ``layer.compile(backend="twinkle", ...)`` (``nn.Module.compile``: the module
    object stays, so call this before or after wrapping it in ``fully_shard`` or before
    ``DistributedDataParallel``). Registrations come from the registry as for
    :func:`twinkle_fx.compile`.

    Args:
        model (`nn.Module`): the model; with the built-in kernels, a transformers ``*ForCausalLM``.
        layers (iterable of `nn.Module`, *optional*): the modules to compile; defaults to
            :func:`repeated_layers` (the classes ``model._no_split_modules`` names).
        mode (`str`, *optional*), options (`dict`, *optional*), fullgraph (`bool`), dynamic (`bool`, *optional*):
            as for :func:`twinkle_fx.compile`, given to every layer's ``torch.compile``.
        device (`str`, *optional*): the device the root's kernel is selected for; defaults to the model's.
        fused_loss (`bool`, defaults to `True`): install the kernel bound to the model's own class (the
            fused-loss head), eagerly (the root is not compiled); kept when the model already carries it
            (``kernelize_model`` swapped it).

    Returns:
        ``model`` itself (undo the head with :func:`twinkle_fx.undo_kernelize`).

    Raises:
        ValueError: ``mode`` together with ``options``, no layers found, or an unknown device.

    Example:
        ```python
        from twinkle_fx.builtin import use_builtin_kernels
        from twinkle_fx.compile.regional import compile_layers

        use_builtin_kernels()
        model = compile_layers(model)                  # every Qwen2DecoderLayer + the fused-loss head
        loss = model(input_ids=ids, labels=ids).loss
        ```
    """
    options = prepare_compile("compile_layers", model, model, mode=mode, options=options, fused_loss=fused_loss,
                              device=device)
    chosen = repeated_layers(model) if layers is None else list(layers)
    for layer in chosen:
        layer.compile(backend="twinkle", mode=mode, options=options, fullgraph=fullgraph, dynamic=dynamic)
    logger.info("compile_layers: %d layer(s) of %s compiled with backend='twinkle'", len(chosen),
                sorted({type(layer).__name__ for layer in chosen}))
    return model
