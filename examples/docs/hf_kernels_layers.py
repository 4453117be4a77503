"""hf-kernels-layers.md: every block of the document, run as written against
``twinkle_fx.integrations.kernels_api`` (the document's API over twinkle_fx's registry), with ``my_pkg.layers``
for ``somelibrary`` and the machine's device for the mapping's "cuda" key. The mapping
(blocks 8 and 9) is registered before the kernelize calls that need it (blocks 4-7; with
``use_fallback=False`` and no mapping, block 7 raises, as the document says it should; here it
raises because block 1's layer names its argument differently, and the script prints the refusal).
Each kernelize call prints what it swapped.

    python examples/docs/hf_kernels_layers.py
"""

import torch
import torch.nn.functional as F
from torch import nn

from _setup import DEVICE
from twinkle_fx import KernelSelectionError
from twinkle_fx.core.swaps import swapped_forward
from twinkle_fx.integrations.kernels_api import (LayerRepository, kernelize, register_kernel_mapping,
                                    replace_kernel_forward_from_hub, use_kernel_forward_from_hub, use_kernel_mapping)

# --- block 1 ---
@use_kernel_forward_from_hub("SiluAndMul")
class SiluAndMul(nn.Module):
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        d = input.shape[-1] // 2
        return F.silu(input[..., :d]) * input[..., d:]
# --- end of block 1 ---

DecoratedSiluAndMul = SiluAndMul

# --- block 2 ---
from my_pkg.layers import SiluAndMul

replace_kernel_forward_from_hub(SiluAndMul, "SiluAndMul")
# --- end of block 2 ---


class MyModel(nn.Module):
    """The document's MyModel(...): a projection, then both activations (decorated and bound)."""

    def __init__(self, *args):
        super().__init__()
        # "..." stands for the user's own arguments; built on the machine's device, as a user would
        self.proj = nn.Linear(16, 32, device=DEVICE)
        self.decorated = DecoratedSiluAndMul()
        self.external = SiluAndMul()

    def forward(self, x):
        h = self.proj(x)
        return self.decorated(h) + self.external(h)


def show(step, model):
    swapped = [name for name, m in model.named_modules() if swapped_forward(m) is not None]
    print(f"{step}: swapped {swapped or 'nothing'}")


# --- block 8 ---
kernel_layer_mapping = {
    "SiluAndMul": {
        DEVICE: LayerRepository(
            repo_id="kernels-community/activation",
            layer_name="SiluAndMul",
            revision="layers",
        )
    }
}
# --- end of block 8 ---

# --- block 3 ---
model = MyModel(...)
model = kernelize(model)
# --- end of block 3 ---
show("kernelize(model) before any mapping is registered", model)

# --- block 10 ---
with use_kernel_mapping(kernel_layer_mapping):
    # Use the layer for which the mapping is applied.
    model = kernelize(model)
# --- end of block 10 ---
show("with use_kernel_mapping(...): kernelize(model)", model)
x = torch.randn(4, 16, device=DEVICE)
model = model.to(DEVICE)
reference = MyModel(...).to(DEVICE)
reference.load_state_dict(model.state_dict())
print("outputs match the original model:", torch.allclose(model(x), reference(x), atol=1e-5))
show("outside the with block, kernelize(MyModel(...))", kernelize(MyModel(...)))

# --- block 9 ---
register_kernel_mapping(kernel_layer_mapping)
# --- end of block 9 ---

# --- block 4 ---
model = MyModel(...)
model = kernelize(model, device=DEVICE)
# --- end of block 4 ---
show("after register_kernel_mapping: kernelize(model, device=...)", model)

# --- block 5 ---
model = MyModel(...)
model = kernelize(model, needs_backward=False)
# --- end of block 5 ---
show("kernelize(model, needs_backward=False)", model)

# --- block 6 ---
model = MyModel(...)
model = kernelize(model, needs_torch_compile=True)
# --- end of block 6 ---
show("kernelize(model, needs_torch_compile=True)", model)

# --- block 7 ---
try:
    model = MyModel(...)
    model = kernelize(model, needs_torch_compile=True, use_fallback=False)
except KernelSelectionError as e:
    # block 1's layer names its forward argument `input`, the Hub layer `x`: twinkle_fx refuses a kernel whose
    # parameter names differ (Hugging Face kernels compares only their number and kinds), and use_fallback=False
    # makes the refusal an error
    print(f"kernelize(model, needs_torch_compile=True, use_fallback=False) refused: {e}")
else:
    show("kernelize(model, needs_torch_compile=True, use_fallback=False)", model)
# --- end of block 7 ---
