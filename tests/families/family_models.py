"""Tiny random models of every family of the built-in mapping, for the family tests
(``tools/family_reference.py`` runs the bench workloads' configs instead, real size or ``--tiny``).

Sizes are the smallest that still exercise each family's variant: 2 layers, hidden 64, heads of 16
(GQA 4 → 2), a 128-token vocabulary with the special ids inside it (several families default to pad
ids beyond a tiny vocabulary), partial rotary where the family has it.
"""

from __future__ import annotations

import torch
import transformers
from device_under_test import DEVICE

TINY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, vocab_size=128, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)

# per family: what differs from TINY (MoE sizes; the variant a family's kernels must handle)
OVERRIDES = {
    "phi3": dict(partial_rotary_factor=0.5),                        # Phi3's partial rotary
    "deepseek_v3": dict(q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
                        n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, first_k_dense_replace=1,
                        n_group=1, topk_group=1, head_dim=8, num_key_value_heads=4),  # rope_interleave=True
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
    "qwen3_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, mlp_only_layers=[0]),
    "gpt_oss": dict(num_local_experts=4, num_experts_per_tok=2),
    "ernie4_5_moe": dict(moe_num_experts=4, moe_k=2, moe_intermediate_size=32, moe_num_shared_experts=1,
                         moe_layer_start_index=1),
    "starcoder2": dict(use_bias=True),
}


def tiny_config(family: str, **overrides) -> transformers.PretrainedConfig:
    from twinkle_fx.builtin import BUILTIN_MODELS

    config = transformers.AutoConfig.for_model(BUILTIN_MODELS[family].model_type,
                                               **{**TINY, **OVERRIDES.get(family, {}), **overrides})
    config._attn_implementation = "eager"
    return config


def tiny_model(family: str, *, dtype: torch.dtype = torch.float32, seed: int = 0, device: str | torch.device = DEVICE,
               **overrides) -> torch.nn.Module:
    """A randomly initialised ``*ForCausalLM`` of ``family`` on ``device`` (the suite's: CUDA on a GPU
    machine, else the CPU); norm weights are randomised too, so a kernel that ignored a weight or an
    offset would show. Weights are drawn on the CPU, so they are the same whatever the device."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(tiny_config(family, **overrides))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(torch.randn_like(p) * 0.2 + (0.0 if "norm" in name and family.startswith("gemma") else 1.0)
                        if "norm" in name else torch.randn_like(p) * 0.1)
    return model.to(device=device, dtype=dtype)
