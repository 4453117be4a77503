"""twinkle_triton: Triton kernels for transformer training, as ``torch.ops.twinkle.*`` custom ops.

Importing the package registers the operators. Each op ``<op>`` has a Python function (what users
call), a ``<op>_reference`` in plain PyTorch, forward and backward Triton kernels, and a
``torch.ops.twinkle.<op>`` / ``<op>_backward`` pair with fake (meta) implementations and autograd.
``layers`` holds Hugging Face ``kernels``-compatible layers built on them.
"""

from . import layers
from .add_gelu import add_gelu, add_gelu_reference
from .fused_linear_cross_entropy import fused_linear_cross_entropy, fused_linear_cross_entropy_reference
from .mul_add import mul_add, mul_add_reference
from .rms_norm import add_rms_norm, add_rms_norm_reference, rms_norm, rms_norm_reference
from .rotary import apply_rotary_pos_emb, apply_rotary_pos_emb_reference
from .silu_and_mul import silu_and_mul, silu_and_mul_reference, silu_mul, silu_mul_reference

# The names of the custom-kernel quick-start guide: the same ops (one op, two spellings).
fused_add_gelu = add_gelu
element_wise_mul_add = mul_add

__all__ = [
    "add_gelu",
    "add_gelu_reference",
    "add_rms_norm",
    "add_rms_norm_reference",
    "apply_rotary_pos_emb",
    "apply_rotary_pos_emb_reference",
    "element_wise_mul_add",
    "fused_linear_cross_entropy",
    "fused_linear_cross_entropy_reference",
    "fused_add_gelu",
    "layers",
    "mul_add",
    "mul_add_reference",
    "rms_norm",
    "rms_norm_reference",
    "silu_and_mul",
    "silu_and_mul_reference",
    "silu_mul",
    "silu_mul_reference",
]

# What loaders check before using a function kernel (the Hugging Face kernels convention, read by
# twinkle_fx): each has a backward, and each is a custom op with a fake implementation, so
# torch.compile traces it without breaking the graph.
for _kernel in (add_gelu, add_rms_norm, apply_rotary_pos_emb, fused_linear_cross_entropy, mul_add, rms_norm,
                silu_and_mul, silu_mul):
    _kernel.has_backward = True
    _kernel.can_torch_compile = True
del _kernel
