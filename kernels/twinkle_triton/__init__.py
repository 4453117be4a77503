"""twinkle_triton: Triton kernels for transformer training, as ``torch.ops.twinkle.*`` custom ops.

Importing the package registers the operators. Each op ``<op>`` has a Python function (what users
call), a ``<op>_reference`` in plain PyTorch, forward and backward Triton kernels, and a
``torch.ops.twinkle.<op>`` / ``<op>_backward`` pair with fake (meta) implementations and autograd.
``layers`` holds Hugging Face ``kernels``-compatible layers built on them.
"""

from . import layers
from .add_gelu import add_gelu, add_gelu_reference
from .clamped_swiglu import clamped_swiglu, clamped_swiglu_reference
from .embedding_grad import (add_embedding_grad, add_embedding_grad_reference, embedding_grad_sums,
                             embedding_grad_sums_reference)
from .fp32_norm import layer_norm, layer_norm_reference, rms_norm_fp32, rms_norm_fp32_reference
from .fused_linear_cross_entropy import fused_linear_cross_entropy, fused_linear_cross_entropy_reference
from .gemv import gemv, gemv_reference, gemv_swiglu, gemv_swiglu_reference
from .gelu_mul import gelu_and_mul, gelu_and_mul_reference, gelu_mul, gelu_mul_reference
from .gqa_attention import gqa_attention, gqa_attention_reference
from .moe_gemm import moe_swiglu_experts, moe_swiglu_experts_reference
from .mul_add import mul_add, mul_add_reference
from .rms_norm import add_rms_norm, add_rms_norm_reference, rms_norm, rms_norm_reference
from .rotary import apply_rotary_pos_emb, apply_rotary_pos_emb_reference
from .rotary_cache import apply_rotary_pos_emb_to_cache, apply_rotary_pos_emb_to_cache_reference
from .rotary_cache_attention import rotary_cache_attention, rotary_cache_attention_reference
from .scale_in_place import scale_in_place, scale_in_place_reference
from .topk import topk, topk_reference
from .rotary_variants import (
    apply_rotary_pos_emb_deinterleave,
    apply_rotary_pos_emb_deinterleave_reference,
    apply_rotary_pos_emb_half_angle,
    apply_rotary_pos_emb_half_angle_reference,
    apply_rotary_pos_emb_interleaved,
    apply_rotary_pos_emb_interleaved_partial,
    apply_rotary_pos_emb_interleaved_partial_reference,
    apply_rotary_pos_emb_interleaved_reference,
    apply_rotary_pos_emb_partial,
    apply_rotary_pos_emb_partial_reference,
)
from .silu_and_mul import (silu_and_mul, silu_and_mul_linear, silu_and_mul_linear_reference, silu_and_mul_reference,
                           silu_mul, silu_mul_linear, silu_mul_linear_reference, silu_mul_reference)

# The names of the custom-kernel quick-start guide: the same ops (one op, two spellings).
fused_add_gelu = add_gelu
element_wise_mul_add = mul_add

__all__ = [
    "add_embedding_grad",
    "add_embedding_grad_reference",
    "add_gelu",
    "add_gelu_reference",
    "add_rms_norm",
    "add_rms_norm_reference",
    "apply_rotary_pos_emb",
    "apply_rotary_pos_emb_reference",
    "apply_rotary_pos_emb_to_cache",
    "apply_rotary_pos_emb_to_cache_reference",
    "apply_rotary_pos_emb_deinterleave",
    "apply_rotary_pos_emb_deinterleave_reference",
    "apply_rotary_pos_emb_half_angle",
    "apply_rotary_pos_emb_half_angle_reference",
    "apply_rotary_pos_emb_interleaved",
    "apply_rotary_pos_emb_interleaved_partial",
    "apply_rotary_pos_emb_interleaved_partial_reference",
    "apply_rotary_pos_emb_interleaved_reference",
    "apply_rotary_pos_emb_partial",
    "apply_rotary_pos_emb_partial_reference",
    "clamped_swiglu",
    "clamped_swiglu_reference",
    "element_wise_mul_add",
    "embedding_grad_sums",
    "embedding_grad_sums_reference",
    "fused_add_gelu",
    "fused_linear_cross_entropy",
    "fused_linear_cross_entropy_reference",
    "gelu_and_mul",
    "gelu_and_mul_reference",
    "gelu_mul",
    "gelu_mul_reference",
    "gemv",
    "gemv_reference",
    "gemv_swiglu",
    "gemv_swiglu_reference",
    "gqa_attention",
    "gqa_attention_reference",
    "layer_norm",
    "layer_norm_reference",
    "layers",
    "moe_swiglu_experts",
    "moe_swiglu_experts_reference",
    "mul_add",
    "mul_add_reference",
    "rms_norm",
    "rms_norm_reference",
    "rotary_cache_attention",
    "rotary_cache_attention_reference",
    "rms_norm_fp32",
    "rms_norm_fp32_reference",
    "scale_in_place",
    "scale_in_place_reference",
    "silu_and_mul",
    "silu_and_mul_linear",
    "silu_and_mul_linear_reference",
    "silu_and_mul_reference",
    "silu_mul",
    "silu_mul_linear",
    "silu_mul_linear_reference",
    "silu_mul_reference",
    "topk",
    "topk_reference",
]

# What loaders check before using a function kernel (the Hugging Face kernels convention, read by
# twinkle_fx): each has a backward, and each is a custom op with a fake implementation, so
# torch.compile traces it without breaking the graph.
for _kernel in (add_gelu, add_rms_norm, apply_rotary_pos_emb, fused_linear_cross_entropy, mul_add, rms_norm,
                silu_and_mul, silu_and_mul_linear, silu_mul, silu_mul_linear, gelu_mul, gelu_and_mul, rms_norm_fp32,
                layer_norm, apply_rotary_pos_emb_partial, apply_rotary_pos_emb_interleaved_partial,
                apply_rotary_pos_emb_interleaved, apply_rotary_pos_emb_half_angle, apply_rotary_pos_emb_deinterleave,
                clamped_swiglu, gqa_attention, moe_swiglu_experts):
    _kernel.has_backward = True
    _kernel.can_torch_compile = True
del _kernel
