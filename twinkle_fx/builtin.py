"""The built-in mapping: transformers' Qwen2, Llama, Mistral and Qwen3 layers -> twinkle_triton kernels.

Opt-in with one call; it registers into the active registry (so it can be scoped), for both
``kernelize_model`` and ``backend="twinkle"``.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Sequence

from .devices import parse_devices
from .registration import register_external_layer, register_function_kernel, register_layer_kernel

logger = logging.getLogger(__name__)

__all__ = ["use_builtin_kernels", "BUILTIN_MODELS"]

# model family -> transformers modeling module and class-name prefix
BUILTIN_MODELS = {
    "qwen2": ("transformers.models.qwen2.modeling_qwen2", "Qwen2"),
    "llama": ("transformers.models.llama.modeling_llama", "Llama"),
    "mistral": ("transformers.models.mistral.modeling_mistral", "Mistral"),
    "qwen3": ("transformers.models.qwen3.modeling_qwen3", "Qwen3"),
}


def use_builtin_kernels(
    *,
    devices: Sequence[str] = ("cuda",),
    models: Sequence[str] = tuple(BUILTIN_MODELS),
    fused_loss: bool = True,
) -> list[str]:
    """Bind the RMSNorm, MLP, rotary embedding and LM-head loss of ``models`` to twinkle_triton kernels.

    Registers kernel names ``"RMSNorm"`` (twinkle_triton.layers.RMSNorm) and ``"SwiGLUMLP"``
    (twinkle_triton.layers.SwiGLUMLP) for every device in ``devices``, binds the models' classes to
    them, and registers ``twinkle_triton.apply_rotary_pos_emb`` for each modeling module's
    ``apply_rotary_pos_emb``. With ``fused_loss``, ``*ForCausalLM`` is bound to
    ``"CausalLMFusedLoss"``: in training with labels the loss comes from the fused linear
    cross-entropy and ``outputs.logits`` is None (the logits are never materialised); otherwise
    outputs are unchanged. All serve every mode (they have backward and compile).

    Args:
        fused_loss (`bool`, defaults to `True`): also bind the causal-LM head + loss.
        devices (defaults to `("cuda",)`): where the kernels apply; add "cpu" to run them through the
            Triton interpreter (slow: for tests).
        models (defaults to all of qwen2, llama, mistral, qwen3): model families to bind.

    Returns:
        What was bound, as readable strings.

    Raises:
        ValueError: an unknown model family.

    Example:
        >>> from twinkle_fx import kernelize_model
        >>> from twinkle_fx.builtin import use_builtin_kernels
        >>> use_builtin_kernels()                              # doctest: +SKIP
        >>> model = kernelize_model(model, mode="train")        # doctest: +SKIP
    """
    import twinkle_triton
    from twinkle_triton import layers

    devices = parse_devices(devices)  # "cpu" is one device, not "c", "p", "u"
    unknown = [m for m in models if m not in BUILTIN_MODELS]
    if unknown:
        raise ValueError(f"Unknown model family {unknown[0]!r}; built-in families: {', '.join(BUILTIN_MODELS)}.")
    for device in devices:
        register_layer_kernel(kernel_name="RMSNorm", layer=layers.RMSNorm, device=device)
        register_layer_kernel(kernel_name="SwiGLUMLP", layer=layers.SwiGLUMLP, device=device)
        if fused_loss:
            register_layer_kernel(kernel_name="CausalLMFusedLoss", layer=layers.CausalLMFusedLoss, device=device)
    bound = []
    for family in models:
        module_name, prefix = BUILTIN_MODELS[family]
        modeling = importlib.import_module(module_name)
        register_external_layer(getattr(modeling, f"{prefix}RMSNorm"), "RMSNorm")
        register_external_layer(getattr(modeling, f"{prefix}MLP"), "SwiGLUMLP")
        bound += [f"{prefix}RMSNorm -> RMSNorm", f"{prefix}MLP -> SwiGLUMLP"]
        if fused_loss:
            register_external_layer(getattr(modeling, f"{prefix}ForCausalLM"), "CausalLMFusedLoss")
            bound.append(f"{prefix}ForCausalLM -> CausalLMFusedLoss")
        for device in devices:
            register_function_kernel(func_name="apply_rotary_pos_emb", target_module=module_name,
                                     func_impl=twinkle_triton.apply_rotary_pos_emb, device=device)
        bound.append(f"{module_name}.apply_rotary_pos_emb -> twinkle_triton.apply_rotary_pos_emb")
    logger.info("twinkle_fx: built-in kernels for %s on %s", ", ".join(models), ", ".join(devices))
    return bound
