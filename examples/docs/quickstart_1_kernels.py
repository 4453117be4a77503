"""custom-kernel-quickstart.md, "Using the kernels directly", run as written (twinkle_triton for
nanovllm.kernels).

    python examples/docs/quickstart_1_kernels.py
"""

from _setup import DEVICE

# --- the document's block ---
import torch
from twinkle_triton import fused_add_gelu, element_wise_mul_add

# Fused Add + GELU
x = torch.randn(16, 128, 4096, device=DEVICE)
bias = torch.randn(4096, device=DEVICE)
output = fused_add_gelu(x, bias)

# Element-wise Mul + Add
a = torch.randn(16, 128, 4096, device=DEVICE)
b = torch.randn(16, 128, 4096, device=DEVICE)
c = torch.randn(16, 128, 4096, device=DEVICE)
result = element_wise_mul_add(a, b, c)  # a * b + c
# --- end of the block ---

print("fused_add_gelu == gelu(x + bias):", torch.allclose(output, torch.nn.functional.gelu(x + bias), atol=1e-5))
print("element_wise_mul_add == a * b + c:", torch.allclose(result, a * b + c, atol=1e-5))
