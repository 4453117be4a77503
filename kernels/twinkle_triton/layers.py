"""Hugging Face ``kernels``-compatible layers.

``kernels`` (and twinkle_fx) swap a layer's ``forward`` onto an existing module instance, so these
classes have no ``__init__`` and no members beyond ``has_backward`` / ``can_torch_compile``:
``forward`` reads the attributes of the module it replaces (transformers' names).
"""

import torch
from torch import nn

from .causal_lm import CausalLMFusedLoss  # noqa: F401  (a layer too: the causal-LM head with fused loss)
from .rms_norm import rms_norm
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
