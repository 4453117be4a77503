"""Regional compilation: each repeated block (decoder layer) compiled on its own with ``backend="twinkle"``.

``torch.compile`` of the whole model makes one large graph (split further by DDP's bucket
boundaries or FSDP2's hooks); compiling each decoder layer instead gives one small graph that every
layer of the same class shares (one compilation instead of one per layer or per piece), and the
layers stay ordinary modules, so ``DistributedDataParallel`` and ``fully_shard`` wrap them as
usual. The root module is not compiled, so its own kernel (the built-in fused-loss head of
``*ForCausalLM``) is installed eagerly, as :func:`twinkle_fx.compile` does.

Under ``DistributedDataParallel`` each layer's graph stays whole: Dynamo's DDPOptimizer
(``torch._dynamo.config.optimize_ddp``, on by default) would compile it in pieces at gradient-bucket
boundaries, the first one after 1 MB of parameters, so every decoder layer of a 0.5B model became two
graphs: two autograd functions, two CUDA graphs, and a kernel region cut in two. The split lets a
bucket's all-reduce start inside one large graph's backward; a layer's backward is short and hands
all of its gradients to DDP's reducer together, so there is no overlap worth the second graph.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import torch

from ..core.torch_internals import active_ddp_module, compiled_call, optimize_ddp, set_compiled_call, set_optimize_ddp
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


class _WholeUnderDDP:
    """A compiled layer's call with DDPOptimizer off while it runs inside a DDP forward (see the module).

    Dynamo reads ``optimize_ddp`` only when it compiles the frame (a cache miss); a replay pays two
    reads, and under DDP two assignments. The setting is process-wide while the layer runs
    (as with ``torch._dynamo.config.patch``): a compilation in another thread at that moment under DDP
    would not be split either.
    """

    __slots__ = ("compiled",)

    def __init__(self, compiled: Any) -> None:
        self.compiled = compiled

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        saved = optimize_ddp()
        # outside DDP, and with python_reducer or the split already off: as they are
        if saved not in (True, "ddp_optimizer") or active_ddp_module() is None:
            return self.compiled(*args, **kwargs)
        set_optimize_ddp(False)
        try:
            return self.compiled(*args, **kwargs)
        finally:
            set_optimize_ddp(saved)


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
    :func:`twinkle_fx.compile`. Under ``DistributedDataParallel`` each layer is compiled as one graph,
    not split at gradient-bucket boundaries by Dynamo's DDPOptimizer (see the module's description).

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

    Examples:
        ```python
        from twinkle_fx.builtin import use_builtin_kernels
        from twinkle_fx.compile.regional import compile_layers

        use_builtin_kernels()
        model = compile_layers(model)                  # every Qwen2DecoderLayer + the fused-loss head
        loss = model(input_ids=ids, labels=ids).loss
        ```
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"compile_layers: model is a {type(model).__name__}; pass an nn.Module.")
    chosen = repeated_layers(model) if layers is None else list(layers)  # before the model changes
    options = prepare_compile("compile_layers", model, model, mode=mode, options=options, fused_loss=fused_loss,
                              device=device, fullgraph=fullgraph, dynamic=dynamic)
    for layer in chosen:
        layer.compile(backend="twinkle", mode=mode, options=options, fullgraph=fullgraph, dynamic=dynamic)
        set_compiled_call(layer, _WholeUnderDDP(compiled_call(layer)))  # wraps what nn.Module.compile set
    logger.info("compile_layers: %d layer(s) of %s compiled with backend='twinkle'", len(chosen),
                sorted({type(layer).__name__ for layer in chosen}))
    return model
