"""twinkle-kernel-module.md, "Example 2: Hub Kernel Repo", run as written (the Hub served offline:
see _setup.py).

    python examples/docs/kernel_module_2_hub.py
"""

from _setup import DEVICE

# --- the document's block ---
import torch
import torch.nn as nn
from twinkle_fx import (
    kernelize_model,
    register_layer_kernel,
    register_external_layer,
)

# 1) Define the custom layer
class SiluAndMul(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return nn.functional.silu(x1) * x2

# 2) Register the Hub kernel and bind the layer
register_layer_kernel(
    kernel_name="SiluAndMulKernel",
    repo_id="kernels-community/activation",
    layer_name="SiluAndMul",
    device=DEVICE,
    mode="train",
)
register_external_layer(SiluAndMul, "SiluAndMulKernel")

# 3) Apply to a model
class SimpleModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.activation = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.activation(x)

model = SimpleModel()
model = kernelize_model(model, mode="train", device=DEVICE, use_fallback=True)
# --- end of the block ---

from twinkle_fx.core.swaps import swapped_forward  # noqa: E402

print("activation forward:", swapped_forward(model.activation))
x = torch.randn(4, 64, device=DEVICE, requires_grad=True)
expected = nn.functional.silu(x[:, :32]) * x[:, 32:]
print("SimpleModel matches the original:", torch.allclose(model(x), expected, atol=1e-5))
