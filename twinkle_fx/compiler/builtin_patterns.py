"""Reference functions whose computation the backend finds wherever it is written.

Register a kernel for one of these targets with ``match_anywhere=True`` and every occurrence of
the computation in a compiled model is swapped, whatever module or function it sits in:

>>> from twinkle_fx.function import register_function_kernel
>>> register_function_kernel(func_name="silu_mul", target_module="twinkle_fx.compiler.builtin_patterns",
...                          func_impl=twinkle_triton.silu_mul, device="cuda", match_anywhere=True)  # doctest: +SKIP

``silu_mul`` is the gated activation of SwiGLU MLPs (``act_fn(gate_proj(x)) * up_proj(x)`` in
Qwen2, Llama, Mistral, ...); ``apply_rotary_pos_emb`` is transformers' rotary embedding, the same
computation as each modeling file's own copy.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["silu_mul", "apply_rotary_pos_emb"]


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``F.silu(gate) * up``."""
    return F.silu(gate) * up


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    """transformers' ``apply_rotary_pos_emb`` (q, k: [B, H, S, D]; cos, sin: [B, S, D])."""
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (_rotate_half(q) * sin)
    k_embed = (k * cos) + (_rotate_half(k) * sin)
    return q_embed, k_embed
