"""Hugging Face ``kernels``-compatible layers.

``kernels`` (and twinkle_fx) swap a layer's ``forward`` onto an existing module instance, so these
classes have no ``__init__`` and no members beyond ``has_backward`` / ``can_torch_compile``:
``forward`` reads the attributes of the module it replaces (transformers' names).

Each layer also states what it applies to, for loaders that ask (twinkle_fx does, eagerly and under
``torch.compile``), as attributes of its ``forward`` (class members other than ``has_backward`` /
``can_torch_compile`` would make ``kernels.kernelize`` refuse the layer):
``forward.applies_to(module)`` returns why the kernel does not compute what ``module`` computes
(another activation, norm variant or layout), or None. (Which classes a kernel serves is the
loader's business: twinkle_fx's built-in mapping registers these layers with ``binds_by_tag=False``,
since transformers' ``kernel_layer_name`` tag ``"RMSNorm"`` sits on about 130 classes whose norms
round differently.)
"""

import torch
from torch import nn

from .transformers_api import CACHE_ARGUMENT
from .add_gelu import add_gelu
from .causal_lm import CausalLMFusedLoss, MoECausalLMFusedLoss  # noqa: F401  (layers too: the causal-LM heads with fused loss)
from .fp32_norm import layer_norm, rms_norm_fp32
from .gelu_mul import gelu_mul
from .gemv import DECODE_ROWS, gemv, gemv_swiglu
from ._launch import interpreting
from ._torch_internals import plain_linear
# transformers' MoE *Experts: the SiLU·mul kernel; GPT-OSS's clamped SwiGLU; the fused grouped GEMMs
from .moe_experts import ClampedSwiGLUExperts, FusedSwiGLUExperts, SwiGLUExperts  # noqa: F401
from .rms_norm import add_rms_norm, rms_norm
from .silu_and_mul import silu_and_mul, silu_and_mul_linear, silu_mul, silu_mul_linear


def _declares(applies_to):
    """Mark ``forward`` with what the layer applies to (see the module docstring)."""

    def mark(forward):
        forward.applies_to = applies_to
        return forward

    return mark


def _missing(module: nn.Module, *names: str) -> str | None:
    absent = [n for n in names if not hasattr(module, n)]
    return f"it has no {', '.join(absent)}" if absent else None


def _vector_weight(module: nn.Module) -> str | None:
    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1:
        shape = tuple(weight.shape) if isinstance(weight, torch.Tensor) else None
        return f"its weight is {shape}, not a vector over the last dimension (a per-head norm?)"
    return None


def _is_silu(act: object) -> bool:
    # nn.SiLU (ACT2FN["swish"]) and transformers' SiLUActivation (ACT2FN["silu"]) both run F.silu
    return isinstance(act, nn.SiLU) or type(act).__name__ == "SiLUActivation"


def gelu_approximation(act: object) -> str | None:
    """``"tanh"`` / ``"none"`` for the GELUs whose result ``gelu_mul`` reproduces, else None."""
    name = type(act).__name__
    if isinstance(act, nn.GELU):
        return act.approximate
    if name == "GELUTanh" and getattr(act, "act", None).__class__.__name__ == "partial":
        return "tanh"  # transformers' gelu_pytorch_tanh: F.gelu(approximate="tanh")
    if name == "GELUActivation" and getattr(act, "act", None) is nn.functional.gelu:
        return "none"  # transformers' gelu: F.gelu (erf)
    return None


def _activation(module: nn.Module, attr: str) -> str:
    act = getattr(module, attr, None)
    config = getattr(module, "config", None)
    hidden_act = getattr(config, "hidden_act", None) or getattr(config, "hidden_activation", None)
    shown = f" (config hidden_act={hidden_act!r})" if hidden_act is not None else ""
    return f"its {attr} is {type(act).__name__}{shown}"


class SiluAndMul(nn.Module):
    """``silu(x[..., :d]) * x[..., d:]`` (vLLM / kernels-community ``SiluAndMul``): :func:`silu_and_mul`."""

    has_backward = True
    can_torch_compile = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return silu_and_mul(x)


def _rms_norm_applies_to(module: nn.Module) -> str | None:
    return _missing(module, "weight", "variance_epsilon") or _vector_weight(module)


class RMSNorm(nn.Module):
    """transformers' Qwen2/Llama/Mistral/Qwen3 ``RMSNorm`` (:func:`rms_norm`): uses ``self.weight`` and
    ``self.variance_epsilon``; rounds the normalised row to the input dtype before the weight
    multiply (``weight * h.to(input_dtype)``)."""

    has_backward = True
    can_torch_compile = True

    @_declares(_rms_norm_applies_to)
    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return rms_norm(hidden_states, self.weight, self.variance_epsilon)


def _swiglu_mlp_applies_to(module: nn.Module) -> str | None:
    missing = _missing(module, "gate_proj", "up_proj", "down_proj", "act_fn")
    if missing:
        return missing
    if not _is_silu(module.act_fn):
        return f"{_activation(module, 'act_fn')}; SwiGLUMLP computes silu(gate) * up"
    return None


def uses_decode_gemvs(module: nn.Module, x: torch.Tensor) -> bool:
    """Whether SwiGLUMLP takes the GEMV kernels for ``x``: a decode step's few rows on a device the kernels
    run on, through projections that are plain linears of x's dtype (gate and up without a bias)."""
    if not (x.is_cuda or interpreting()) or x.dim() == 0 or x.numel() > DECODE_ROWS * x.shape[-1]:
        return False
    gate, up, down = module.gate_proj, module.up_proj, module.down_proj
    return (plain_linear(gate) and plain_linear(up) and plain_linear(down) and gate.bias is None and up.bias is None
            and gate.weight.dtype == up.weight.dtype == down.weight.dtype == x.dtype)


class SwiGLUMLP(nn.Module):
    """Qwen2MLP/LlamaMLP-shaped MLP: ``down_proj(silu(gate_proj(x)) * up_proj(x))``.

    The projections are called as submodules (so LoRA adapters and hooks on them keep working);
    only the activation is fused (:func:`silu_mul`). Applies only where the module's ``act_fn`` is SiLU.
    With gradients on, a down projection that is a plain ``nn.Linear`` without bias, of the activation's dtype,
    runs with the activation as one op (:func:`silu_mul_linear`), which keeps one tensor less for the backward.
    A decode step (at most ``gemv.DECODE_ROWS`` rows) through plain ``nn.Linear`` projections runs two GEMV
    kernels instead: :func:`gemv_swiglu` (gate, up and the product) and :func:`gemv` (down).
    """

    has_backward = True
    can_torch_compile = True

    @_declares(_swiglu_mlp_applies_to)
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if uses_decode_gemvs(self, x):
            down = self.down_proj
            return gemv(gemv_swiglu(x, self.gate_proj.weight, self.up_proj.weight), [down.weight],
                        None if down.bias is None else [down.bias])
        gate, up, down = self.gate_proj(x), self.up_proj(x), self.down_proj
        if torch.is_grad_enabled() and plain_linear(down) and down.bias is None and down.weight.dtype == gate.dtype:
            return silu_mul_linear(gate, up, down.weight)
        return down(silu_mul(gate, up))


def _geglu_mlp_applies_to(module: nn.Module) -> str | None:
    missing = _missing(module, "gate_proj", "up_proj", "down_proj", "act_fn")
    if missing:
        return missing
    if gelu_approximation(module.act_fn) is None:
        return f"{_activation(module, 'act_fn')}; GeGLUMLP computes F.gelu(gate, approximate=...) * up"
    return None


class GeGLUMLP(nn.Module):
    """Gemma-shaped MLP: ``down_proj(gelu(gate_proj(x)) * up_proj(x))`` with transformers'
    ``gelu_pytorch_tanh`` (tanh GELU) or ``gelu`` (erf GELU) as ``act_fn``; the activation is :func:`gelu_mul`."""

    has_backward = True
    can_torch_compile = True

    @_declares(_geglu_mlp_applies_to)
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(gelu_mul(self.gate_proj(x), self.up_proj(x), gelu_approximation(self.act_fn)))


def _fused_swiglu_mlp_applies_to(module: nn.Module) -> str | None:
    missing = _missing(module, "gate_up_proj", "down_proj", "activation_fn")
    if missing:
        return missing
    if not _is_silu(module.activation_fn):
        return f"{_activation(module, 'activation_fn')}; FusedSwiGLUMLP computes silu(gate) * up"
    return None


class FusedSwiGLUMLP(nn.Module):
    """Phi3/GLM4-shaped MLP with one fused projection: ``gate, up = gate_up_proj(h).chunk(2)``,
    ``down_proj(up * silu(gate))``; the activation is :func:`silu_and_mul`.

    With gradients on, a down projection that is a plain ``nn.Linear`` without bias, of the activation's dtype, runs
    with the activation as one op (:func:`silu_and_mul_linear`), which keeps one tensor less for the backward."""

    has_backward = True
    can_torch_compile = True

    @_declares(_fused_swiglu_mlp_applies_to)
    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        gate_up, down = self.gate_up_proj(hidden_states), self.down_proj
        if torch.is_grad_enabled() and plain_linear(down) and down.bias is None and down.weight.dtype == gate_up.dtype:
            return silu_and_mul_linear(gate_up, down.weight)
        return down(silu_and_mul(gate_up))


def _gemma_rms_norm_applies_to(module: nn.Module) -> str | None:
    return _missing(module, "weight", "eps") or _vector_weight(module)


class GemmaRMSNorm(nn.Module):
    """Gemma 1/2/3's ``RMSNorm``: ``(norm(x.float()) * (1 + weight.float())).type_as(x)``
    (:func:`rms_norm_fp32` with ``offset=1.0``); uses ``self.weight`` and ``self.eps``."""

    has_backward = True
    can_torch_compile = True

    @_declares(_gemma_rms_norm_applies_to)
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm_fp32(x, self.weight, self.eps, 1.0)


def _fp32_rms_norm_applies_to(module: nn.Module) -> str | None:
    return _missing(module, "weight", "variance_epsilon") or _vector_weight(module)


class FP32RMSNorm(nn.Module):
    """OLMo2's and GPT-OSS's ``RMSNorm``: ``(weight * norm(h.float())).to(input_dtype)`` (the weight
    multiply in fp32, the output in the input's dtype: :func:`rms_norm_fp32`); uses ``self.weight`` and
    ``self.variance_epsilon``."""

    has_backward = True
    can_torch_compile = True

    @_declares(_fp32_rms_norm_applies_to)
    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return rms_norm_fp32(hidden_states, self.weight, self.variance_epsilon, 0.0)


def _layer_norm_applies_to(module: nn.Module) -> str | None:
    return _missing(module, "weight", "variance_epsilon") or _vector_weight(module)


class LayerNorm(nn.Module):
    """Cohere's ``CohereLayerNorm`` (mean-centred, fp32 weight multiply, no bias; a ``bias``
    attribute is added when present: :func:`layer_norm`); uses ``self.weight`` and ``self.variance_epsilon``."""

    has_backward = True
    can_torch_compile = True

    @_declares(_layer_norm_applies_to)
    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return layer_norm(hidden_states, self.weight, getattr(self, "bias", None), self.variance_epsilon)


def _torch_layer_norm_applies_to(module: nn.Module) -> str | None:
    missing = _missing(module, "weight", "eps", "normalized_shape")
    if missing:
        return missing
    if module.weight is None:
        return "it has no weight (elementwise_affine=False); TorchLayerNorm multiplies by one"
    if len(module.normalized_shape) != 1:
        return f"it normalises over {tuple(module.normalized_shape)}, not the last dimension only"
    return None


class TorchLayerNorm(nn.Module):
    """``torch.nn.LayerNorm`` over the last dimension with a weight (and a bias, if it has one), in
    fp32 and rounded once, as ``F.layer_norm`` computes it (StarCoder2's norms: :func:`layer_norm`); uses
    ``self.weight``, ``self.bias`` and ``self.eps``."""

    has_backward = True
    can_torch_compile = True

    @_declares(_torch_layer_norm_applies_to)
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return layer_norm(input, self.weight, self.bias, self.eps)


def _bias_gelu_mlp_applies_to(module: nn.Module) -> str | None:
    missing = _missing(module, "c_fc", "c_proj", "act")
    if missing:
        return missing
    if getattr(module.c_fc, "bias", None) is None:
        return "c_fc has no bias (use_bias=False): there is no bias add to fuse"
    if gelu_approximation(module.act) is None:
        return f"{_activation(module, 'act')}; BiasGeluMLP computes F.gelu(x + bias, approximate=...)"
    return None


class BiasGeluMLP(nn.Module):
    """StarCoder2's MLP: ``dropout(c_proj(gelu(c_fc(h))))`` with the bias add of ``c_fc`` fused into the
    GELU (:func:`add_gelu`). ``c_fc`` is applied as ``F.linear`` with its weight (hooks or adapters on
    ``c_fc`` itself are bypassed); ``c_proj`` is called as a module."""

    has_backward = True
    can_torch_compile = True

    @_declares(_bias_gelu_mlp_applies_to)
    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        h = nn.functional.linear(hidden_states, self.c_fc.weight)
        h = self.c_proj(add_gelu(h, self.c_fc.bias, gelu_approximation(self.act)))
        return nn.functional.dropout(h, p=self.residual_dropout, training=self.training)


def _decoder_layer_applies_to(module: nn.Module) -> str | None:
    missing = _missing(module, "input_layernorm", "self_attn", "post_attention_layernorm", "mlp")
    if missing:
        return missing
    return _missing(module.post_attention_layernorm, "weight", "variance_epsilon")


def _decoder_layer_forward(self, hidden_states, attention_mask=None, position_ids=None, cache=None, use_cache=False,
                           position_embeddings=None, **kwargs):
    residual = hidden_states
    hidden_states = self.input_layernorm(hidden_states)
    hidden_states, _ = self.self_attn(
        hidden_states=hidden_states,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=use_cache,
        position_embeddings=position_embeddings,
        **{CACHE_ARGUMENT: cache},
        **kwargs,
    )
    norm = self.post_attention_layernorm
    if hidden_states.dtype == residual.dtype and hidden_states.shape == residual.shape:
        hidden_states, residual = add_rms_norm(hidden_states, residual, norm.weight, norm.variance_epsilon)
    else:
        residual = residual + hidden_states
        hidden_states = norm(residual)
    hidden_states = self.mlp(hidden_states)
    return residual + hidden_states


class DecoderLayer(nn.Module):
    """transformers' Qwen2/Llama/Mistral/Qwen3 decoder layer with the attention's residual add fused
    into the post-attention RMSNorm (:func:`add_rms_norm`): one launch instead of two forward, and
    in backward the MLP branch's residual gradient is added inside the norm's backward kernel
    instead of by autograd (another launch saved). Outputs equal the original's: the sum is
    rounded to the input dtype before normalising, as ``residual + hidden_states`` is.

    Uses the replaced module's ``input_layernorm``, ``self_attn``, ``post_attention_layernorm``
    (its ``weight`` and ``variance_epsilon``; its own forward and hooks are not called) and ``mlp``.
    When the attention output and the residual differ in dtype or shape (e.g. under autocast) it
    computes the original ``residual + hidden_states`` and calls the norm module instead.
    """

    has_backward = True
    can_torch_compile = True

    if CACHE_ARGUMENT == "cache":
        forward = _declares(_decoder_layer_applies_to)(_decoder_layer_forward)
    else:
        @_declares(_decoder_layer_applies_to)
        def forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_values=None, use_cache=False,
                    position_embeddings=None, **kwargs):
            return _decoder_layer_forward(self, hidden_states, attention_mask, position_ids, past_key_values, use_cache,
                                          position_embeddings, **kwargs)
