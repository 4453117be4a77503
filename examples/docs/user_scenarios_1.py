"""user-scenarios.md, scenario 1 "speed up whole model layers", run as written; then the binding the
document leaves out, which makes the kernel apply.

    python examples/docs/user_scenarios_1.py
"""

from _setup import DEVICE

# --- the document's block ---
from twinkle_fx import kernelize_model, register_layer_kernel
import torch.nn as nn

register_layer_kernel(
    kernel_name="linear",
    repo_id="kernels-community/linear",
    device=DEVICE,
    mode="inference",
)

model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
model = kernelize_model(model, mode="inference", device=DEVICE, use_fallback=True)
# --- end of the block ---

import torch  # noqa: E402

from twinkle_fx import register_external_layer, undo_kernelize  # noqa: E402
from twinkle_fx.core.swaps import swapped_forward  # noqa: E402

# No class is bound to "linear", so the block changes nothing. Binding nn.Linear makes it apply:
print("swapped by the block:", swapped_forward(model[0]) is not None)
register_external_layer(nn.Linear, "linear")
x = torch.randn(5, 8, device=DEVICE)
model = model.to(DEVICE).eval()
with torch.no_grad():
    expected = model(x)
    kernelize_model(model, mode="inference", device=DEVICE, use_fallback=True)
    print("after register_external_layer(nn.Linear, 'linear'):", swapped_forward(model[0]))
    print("outputs match:", torch.allclose(model(x), expected, atol=1e-5))
undo_kernelize(model)
