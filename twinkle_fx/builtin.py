"""The built-in mapping: transformers model families' layers -> twinkle_triton kernels.

Opt-in with one call; it registers into the active registry (so it can be scoped), for both
``kernelize_model`` and ``backend="twinkle"``. :data:`BUILTIN_MODELS` says, per family, which
class or function is bound to which kernel; :func:`coverage_table` prints it (the README's
coverage table is that output, and ``tests/families`` checks every entry against the unswapped
model, eagerly and compiled).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Sequence
from typing import NamedTuple

from .core.devices import parse_devices
from .core.registration import register_external_layer, register_function_kernel, register_layer_kernel, resolve_class

logger = logging.getLogger(__name__)

__all__ = ["use_builtin_kernels", "BUILTIN_MODELS", "Family", "coverage_table"]


class Family(NamedTuple):
    """What the built-in mapping binds in one transformers family.

    ``norms`` / ``mlps``: ``(class names, kernel name)`` (a ``twinkle_triton.layers`` class) or None;
    ``rotary``: the ``twinkle_triton`` function replacing the modeling module's
    ``apply_rotary_pos_emb``, or None; ``head``: the ``*ForCausalLM`` class bound to the fused-loss
    head, or None; ``model_type``: transformers' config type; ``not_covered``: what is left out, and why;
    ``experts``: the MoE ``*Experts`` classes and their kernel, or None; ``functions``: other functions
    of the modeling module, ``(function name, twinkle_triton function)`` (DeepSeek-V3's second rotary);
    ``within``: for norm classes shared with other models (``torch.nn.LayerNorm``, named by dotted
    path), the family's classes they are bound under (their parent modules), so no other model is reached;
    ``head_kernel``: the fused-loss head ``head`` is bound to (the MoE heads add the router's loss).
    """

    module: str
    norms: tuple[tuple[str, ...], str] | None
    mlps: tuple[tuple[str, ...], str] | None
    rotary: str | None
    head: str | None
    model_type: str
    not_covered: str = ""
    experts: tuple[tuple[str, ...], str] | None = None
    functions: tuple[tuple[str, str], ...] = ()
    within: tuple[str, ...] = ()
    head_kernel: str = "CausalLMFusedLoss"


def _m(name: str) -> str:
    return f"transformers.models.{name}.modeling_{name}"


_ROPE = "apply_rotary_pos_emb"
_NO_HEAD_SOFTCAP = "head: final logit soft-capping (fused loss has none)"
_MOE_HEAD = "MoECausalLMFusedLoss"
_EXPERTS = "SwiGLUExperts"
# where the fused grouped GEMMs measured faster than transformers' grouped_mm experts, eager and compiled
# (use_builtin_kernels' fused_experts says where and by how much)
_FUSED_EXPERTS = "FusedSwiGLUExperts"
_SILU_EXPERTS = (_EXPERTS, _FUSED_EXPERTS)

# family -> what is bound (first four: the original Llama-style families)
BUILTIN_MODELS: dict[str, Family] = {
    "qwen2": Family(_m("qwen2"), (("Qwen2RMSNorm",), "RMSNorm"), (("Qwen2MLP",), "SwiGLUMLP"), _ROPE,
                    "Qwen2ForCausalLM", "qwen2"),
    "llama": Family(_m("llama"), (("LlamaRMSNorm",), "RMSNorm"), (("LlamaMLP",), "SwiGLUMLP"), _ROPE,
                    "LlamaForCausalLM", "llama"),
    "mistral": Family(_m("mistral"), (("MistralRMSNorm",), "RMSNorm"), (("MistralMLP",), "SwiGLUMLP"), _ROPE,
                      "MistralForCausalLM", "mistral"),
    "qwen3": Family(_m("qwen3"), (("Qwen3RMSNorm",), "RMSNorm"), (("Qwen3MLP",), "SwiGLUMLP"), _ROPE,
                    "Qwen3ForCausalLM", "qwen3"),
    "gemma": Family(_m("gemma"), (("GemmaRMSNorm",), "GemmaRMSNorm"), (("GemmaMLP",), "GeGLUMLP"), _ROPE,
                    "GemmaForCausalLM", "gemma"),
    "gemma2": Family(_m("gemma2"), (("Gemma2RMSNorm",), "GemmaRMSNorm"), (("Gemma2MLP",), "GeGLUMLP"), _ROPE,
                     None, "gemma2", _NO_HEAD_SOFTCAP),
    "gemma3": Family(_m("gemma3"), (("Gemma3RMSNorm",), "GemmaRMSNorm"), (("Gemma3MLP",), "GeGLUMLP"), _ROPE,
                     None, "gemma3_text", _NO_HEAD_SOFTCAP + " when configured"),
    "phi3": Family(_m("phi3"), (("Phi3RMSNorm",), "RMSNorm"), (("Phi3MLP",), "FusedSwiGLUMLP"),
                   "apply_rotary_pos_emb_partial", "Phi3ForCausalLM", "phi3"),
    "olmo2": Family(_m("olmo2"), (("Olmo2RMSNorm",), "FP32RMSNorm"), (("Olmo2MLP",), "SwiGLUMLP"), _ROPE,
                    "Olmo2ForCausalLM", "olmo2"),
    "granite": Family(_m("granite"), (("GraniteRMSNorm",), "RMSNorm"), (("GraniteMLP",), "SwiGLUMLP"), _ROPE,
                      None, "granite", "head: logits divided by logits_scaling"),
    "smollm3": Family(_m("smollm3"), (("SmolLM3RMSNorm",), "RMSNorm"), (("SmolLM3MLP",), "SwiGLUMLP"), _ROPE,
                      "SmolLM3ForCausalLM", "smollm3"),
    "glm4": Family(_m("glm4"), (("Glm4RMSNorm",), "RMSNorm"), (("Glm4MLP",), "FusedSwiGLUMLP"),
                   "apply_rotary_pos_emb_interleaved_partial", "Glm4ForCausalLM", "glm4"),
    "deepseek_v3": Family(_m("deepseek_v3"), (("DeepseekV3RMSNorm",), "RMSNorm"), (("DeepseekV3MLP",), "SwiGLUMLP"),
                          _ROPE, None, "deepseek_v3",
                          "head: a MoE output without the output_router_logits argument (neither fused head's signature)",
                          experts=(("DeepseekV3Experts",), _FUSED_EXPERTS),
                          functions=(("apply_rotary_pos_emb_interleave", "apply_rotary_pos_emb_deinterleave"),)),
    "mixtral": Family(_m("mixtral"), (("MixtralRMSNorm",), "RMSNorm"), None, _ROPE, "MixtralForCausalLM", "mixtral",
                      experts=(("MixtralExperts",), _EXPERTS), head_kernel=_MOE_HEAD),
    "qwen3_moe": Family(_m("qwen3_moe"), (("Qwen3MoeRMSNorm",), "RMSNorm"), (("Qwen3MoeMLP",), "SwiGLUMLP"), _ROPE,
                        "Qwen3MoeForCausalLM", "qwen3_moe", experts=(("Qwen3MoeExperts",), _FUSED_EXPERTS),
                        head_kernel=_MOE_HEAD),
    "gpt_oss": Family(_m("gpt_oss"), (("GptOssRMSNorm",), "FP32RMSNorm"), None, "apply_rotary_pos_emb_half_angle",
                      "GptOssForCausalLM", "gpt_oss", experts=(("GptOssExperts",), "ClampedSwiGLUExperts"),
                      head_kernel=_MOE_HEAD),
    "ernie4_5": Family(_m("ernie4_5"), (("Ernie4_5RMSNorm",), "RMSNorm"), (("Ernie4_5MLP",), "SwiGLUMLP"),
                       "apply_rotary_pos_emb_interleaved_partial", "Ernie4_5ForCausalLM", "ernie4_5"),
    "ernie4_5_moe": Family(_m("ernie4_5_moe"), (("Ernie4_5_MoeRMSNorm",), "RMSNorm"), (("Ernie4_5_MoeMLP",), "SwiGLUMLP"),
                           "apply_rotary_pos_emb_interleaved_partial", "Ernie4_5_MoeForCausalLM", "ernie4_5_moe",
                           experts=(("Ernie4_5_MoeExperts",), _FUSED_EXPERTS), head_kernel=_MOE_HEAD),
    "cohere": Family(_m("cohere"), (("CohereLayerNorm",), "LayerNorm"), (("CohereMLP",), "SwiGLUMLP"),
                     "apply_rotary_pos_emb_interleaved", None, "cohere", "head: logits multiplied by logit_scale"),
    "starcoder2": Family(_m("starcoder2"), (("torch.nn.LayerNorm",), "TorchLayerNorm"), (("Starcoder2MLP",), "BiasGeluMLP"),
                         _ROPE, "Starcoder2ForCausalLM", "starcoder2",
                         within=("Starcoder2DecoderLayer", "Starcoder2Model")),
}

# kernel name -> twinkle_triton.layers class name
_LAYER_KERNELS = ("RMSNorm", "SwiGLUMLP", "GeGLUMLP", "FusedSwiGLUMLP", "GemmaRMSNorm", "FP32RMSNorm", "LayerNorm",
                  "BiasGeluMLP", "SwiGLUExperts", "FusedSwiGLUExperts", "TorchLayerNorm", "ClampedSwiGLUExperts")


# Families whose decoder layer is the plain pre-norm residual block DecoderLayer reproduces (others
# scale the residual, e.g. Granite's residual_multiplier, or norm differently).
_DECODER_LAYER_FAMILIES = ("qwen2", "llama", "mistral", "qwen3")


def use_builtin_kernels(
    *,
    devices: Sequence[str] = ("cuda",),
    models: Sequence[str] = tuple(BUILTIN_MODELS),
    fused_loss: bool = True,
    decoder_layers: bool = False,
    fused_experts: bool | None = None,
) -> list[str]:
    """Bind the norms, MLPs, rotary embedding and LM-head loss of ``models`` to twinkle_triton kernels.

    Registers the kernels of ``twinkle_triton.layers`` under their class names (``"RMSNorm"``,
    ``"SwiGLUMLP"``, ``"GeGLUMLP"``, ...) for every device in ``devices`` and binds exactly the classes
    :data:`BUILTIN_MODELS` lists for ``models`` (MoE ``*Experts`` included); each family's
    ``apply_rotary_pos_emb`` gets the ``twinkle_triton`` rotary of its variant (partial, interleaved,
    half-width angles), and DeepSeek-V3's ``apply_rotary_pos_emb_interleave`` its own. A class shared
    with other models (StarCoder2's ``torch.nn.LayerNorm``) is bound only under the family's classes
    (``register_external_layer(..., within=...)``, eagerly and under compile). Nothing else is
    reached: the kernels are registered with ``binds_by_tag=False``, so classes of other families
    carrying transformers' ``kernel_layer_name`` tag (``"RMSNorm"``) are left alone. Each kernel states what it
    applies to (activation, norm attributes, weight shape); a module it does not apply to (say a
    Qwen2 config with ``hidden_act="gelu_pytorch_tanh"``) keeps its forward, with the reason in the
    log and in the compile report. With ``fused_loss``, the ``*ForCausalLM`` of families whose head
    is a plain linear + cross-entropy is bound to ``"CausalLMFusedLoss"`` (``"MoECausalLMFusedLoss"`` for
    the mixture-of-experts heads, which add the router's load-balancing loss when asked): in training with
    labels the loss comes from the fused linear cross-entropy and ``outputs.logits`` is None. All kernels serve
    every mode (they have backward and compile).

    Args:
        devices (defaults to `("cuda",)`): where the kernels apply; add "cpu" to run them through the
            Triton interpreter (slow: for tests).
        models (defaults to every family of `BUILTIN_MODELS`): model families to bind.
        fused_loss (`bool`, defaults to `True`): also bind the causal-LM head + loss.
        decoder_layers (`bool`, defaults to `False`): also bind the ``*DecoderLayer`` of qwen2, llama,
            mistral and qwen3 to ``"DecoderLayer"`` (residual add fused into the post-attention norm),
            for eager ``kernelize_model`` only: under ``backend="twinkle"`` a bound decoder layer would
            hide the norm and MLP regions inside it.
        fused_experts (`bool`, optional): how the SiLU-gated MoE ``*Experts`` (Mixtral, Qwen3-MoE, DeepSeek-V3,
            ERNIE 4.5-MoE) are computed. ``"FusedSwiGLUExperts"``: the whole experts computation as the fused
            grouped GEMMs of ``twinkle_triton.moe_swiglu_experts``; ``"SwiGLUExperts"``: transformers' own
            implementation with the gate as one kernel. By default (None) Qwen3-MoE, DeepSeek-V3 and ERNIE
            4.5-MoE get the fused kernels, the families where they measured faster both eagerly and compiled: on one
            H200 (bf16, 4096 tokens, forward + backward, against transformers' ``grouped_mm`` experts, eager and
            compiled by Inductor) 1.55x and 1.16x at Qwen3-30B-A3B's layer (128 experts, top-8, intermediate 768),
            1.32x and 1.05x at ERNIE-4.5-21B-A3B's (64, top-6, 1536), 1.36x and 1.07x at Moonlight-16B-A3B's
            (DeepSeek-V3; 64, top-6, 1408); their training slices 1.19x, 1.08x and 1.09x torch.compile with CUDA
            graphs. Mixtral keeps ``"SwiGLUExperts"``: at Mixtral-8x7B's layer (8 experts, top-2, 14336) the fused
            kernels ran 1.01x eager and 0.93x compiled (CUTLASS's grouped GEMM in ``torch._grouped_mm`` runs its
            large GEMMs faster; ``docs/performance.md``, "MoE layers"). True binds every SiLU-gated family to
            the fused kernels, False none. GPT-OSS's clamped experts keep ``"ClampedSwiGLUExperts"`` either way.

    Returns:
        What was bound, one string per class or function (``"GemmaMLP -> GeGLUMLP"``).

    Raises:
        ValueError: an unknown model family.

    Examples:
        >>> from twinkle_fx import kernelize_model
        >>> from twinkle_fx.builtin import use_builtin_kernels
        >>> # not run by the doctest test: it imports and traces transformers' Gemma (seconds)
        >>> use_builtin_kernels(models=("gemma",))  # doctest: +SKIP
        ['GemmaRMSNorm -> GemmaRMSNorm', 'GemmaMLP -> GeGLUMLP', ...]
        >>> model = kernelize_model(model, mode="train")        # doctest: +SKIP
    """
    import twinkle_triton
    from twinkle_triton import layers

    devices = parse_devices(devices)  # "cpu" is one device, not "c", "p", "u"
    if isinstance(models, str):
        raise TypeError(f"use_builtin_kernels: models={models!r} is a string; pass a sequence, e.g. ({models!r},).")
    unknown = [m for m in models if m not in BUILTIN_MODELS]
    if unknown:
        raise ValueError(f"Unknown model family {unknown[0]!r}; built-in families: {', '.join(BUILTIN_MODELS)}.")
    families = [BUILTIN_MODELS[m] for m in models]

    def kernel_of(spec: tuple[tuple[str, ...], str]) -> str:
        if fused_experts is None or spec[1] not in _SILU_EXPERTS:
            return spec[1]
        return _FUSED_EXPERTS if fused_experts else _EXPERTS

    used = {kernel_of(spec) for f in families for spec in (f.norms, f.mlps, f.experts) if spec is not None}
    for device in devices:
        for kernel_name in _LAYER_KERNELS:
            if kernel_name in used:
                register_layer_kernel(kernel_name=kernel_name, layer=getattr(layers, kernel_name), device=device,
                                      binds_by_tag=False)
        for head_kernel in dict.fromkeys(f.head_kernel for f in families if fused_loss and f.head):
            register_layer_kernel(kernel_name=head_kernel, layer=getattr(layers, head_kernel), device=device,
                                  binds_by_tag=False)
        if decoder_layers:  # mode "train" serves eager training and inference, never compile
            register_layer_kernel(kernel_name="DecoderLayer", layer=layers.DecoderLayer, device=device, mode="train",
                                  binds_by_tag=False)
    bound = []
    for family in families:
        modeling = importlib.import_module(family.module)
        for spec in (family.norms, family.mlps, family.experts):
            if spec is not None:
                for class_name in spec[0]:
                    kernel = kernel_of(spec)
                    if "." in class_name:  # a class shared with other models: bound under the family's own
                        within = tuple(getattr(modeling, c) for c in family.within)
                        register_external_layer(resolve_class(class_name), kernel, within=within)
                        bound.append(f"{class_name} -> {kernel} (within {', '.join(family.within)})")
                    else:
                        register_external_layer(getattr(modeling, class_name), kernel)
                        bound.append(f"{class_name} -> {kernel}")
        if decoder_layers and family.model_type in _DECODER_LAYER_FAMILIES:
            decoder = family.head.removesuffix("ForCausalLM") + "DecoderLayer"
            register_external_layer(getattr(modeling, decoder), "DecoderLayer")
            bound.append(f"{decoder} -> DecoderLayer")
        if fused_loss and family.head:
            register_external_layer(getattr(modeling, family.head), family.head_kernel)
            bound.append(f"{family.head} -> {family.head_kernel}")
        if family.rotary:
            for device in devices:
                register_function_kernel(func_name="apply_rotary_pos_emb", target_module=family.module,
                                         func_impl=getattr(twinkle_triton, family.rotary), device=device)
            bound.append(f"{family.module}.apply_rotary_pos_emb -> twinkle_triton.{family.rotary}")
        for func_name, kernel in family.functions:
            for device in devices:
                register_function_kernel(func_name=func_name, target_module=family.module,
                                         func_impl=getattr(twinkle_triton, kernel), device=device)
            bound.append(f"{family.module}.{func_name} -> twinkle_triton.{kernel}")
    logger.info("built-in kernels for %s on %s", ", ".join(models), ", ".join(devices))
    return bound


def coverage_table() -> str:
    """The README's coverage table: family x norm / MLP / rotary / head, from :data:`BUILTIN_MODELS`.

    Attention is never swapped (transformers' SDPA / flash kernels are used as they are).

    Examples:
        >>> coverage_table().splitlines()[2].startswith("| qwen2 | Qwen2RMSNorm → RMSNorm | Qwen2MLP → SwiGLUMLP |")
        True
    """
    lines = ["| family | norm | MLP / MoE experts | rotary (`twinkle_triton.*`) | head (fused loss) | not covered |",
             "|---|---|---|---|---|---|"]
    for name, f in BUILTIN_MODELS.items():
        within = f" (within {', '.join(f.within)})" if f.within else ""
        cells = [", ".join(f"{c} → {spec[1]}" + (within if "." in c else "") for spec in specs if spec
                           for c in spec[0]) or "—" for specs in ((f.norms,), (f.mlps, f.experts))]
        cells.append("; ".join([f.rotary] * bool(f.rotary) + [f"{n} → {k}" for n, k in f.functions]) or "—")
        cells.append(f"{f.head} → {f.head_kernel}" if f.head else "—")
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {f.not_covered} |")
    return "\n".join(lines)
