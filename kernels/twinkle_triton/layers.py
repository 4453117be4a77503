"""Hugging Face ``kernels``-compatible layers.

``kernels`` (and twinkle_fx) swap a layer's ``forward`` onto an existing module instance, so these
classes have no ``__init__`` and no members beyond ``has_backward`` / ``can_torch_compile``:
``forward`` reads the attributes of the module it replaces (transformers' names).
"""

import torch
from torch import nn

from .causal_lm import CausalLMFusedLoss  # noqa: F401  (a layer too: the causal-LM head with fused loss)
from .rms_norm import add_rms_norm, rms_norm
from .silu_and_mul import silu_and_mul, silu_mul


class SiluAndMul(nn.Module):
    """``silu(x[..., :d]) * x[..., d:]`` (vLLM / kernels-community ``SiluAndMul``)."""

    has_backward = True
    can_torch_compile = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return silu_and_mul(x)


class RMSNorm(nn.Module):
    """transformers' Qwen2/Llama/Mistral/Qwen3 ``RMSNorm``: uses ``self.weight`` and
    ``self.variance_epsilon``."""

    has_backward = True
    can_torch_compile = True

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return rms_norm(hidden_states, self.weight, self.variance_epsilon)


class SwiGLUMLP(nn.Module):
    """Qwen2MLP/LlamaMLP-shaped MLP: ``down_proj(silu(gate_proj(x)) * up_proj(x))``.

    The projections are called as submodules (so LoRA adapters and hooks on them keep working);
    only the activation is fused. Assumes the module's ``act_fn`` is SiLU, as in those models.
    """

    has_backward = True
    can_torch_compile = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_mul(self.gate_proj(x), self.up_proj(x)))


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

    def forward(
        self,
        hidden_states,
        attention_mask=None,
        position_ids=None,
        past_key_values=None,
        use_cache=False,
        position_embeddings=None,
        **kwargs,
    ):
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states, _ = self.self_attn(
            hidden_states=hidden_states,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            use_cache=use_cache,
            position_embeddings=position_embeddings,
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
