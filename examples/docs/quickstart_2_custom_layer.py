"""custom-kernel-quickstart.md, "In a custom layer", run as written (twinkle_triton for nanovllm.kernels).

    python examples/docs/quickstart_2_custom_layer.py
"""

import torch  # the block uses torch without importing it

from _setup import DEVICE

# --- the document's block ---
from torch import nn
from twinkle_triton import fused_add_gelu

class MyCustomLayer(nn.Module):
    def __init__(self, hidden_size):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        self.bias = nn.Parameter(torch.zeros(hidden_size))

    def forward(self, x):
        x = self.linear(x)
        # the custom kernel instead of F.gelu(x + bias)
        return fused_add_gelu(x, self.bias)
# --- end of the block ---

torch.manual_seed(0)
layer = MyCustomLayer(96).to(DEVICE)
with torch.no_grad():
    layer.bias.normal_()
x = torch.randn(3, 37, 96, device=DEVICE, requires_grad=True)
out = layer(x)
reference = nn.functional.gelu(layer.linear(x) + layer.bias)
grads = torch.autograd.grad(out.sum(), [x, layer.bias])
expected = torch.autograd.grad(reference.sum(), [x, layer.bias])
print("MyCustomLayer == F.gelu(linear(x) + bias), forward and backward:",
      torch.allclose(out, reference, atol=1e-5) and all(torch.allclose(a, b, atol=1e-4) for a, b in zip(grads, expected)))
