"""user-scenarios.md, scenario 4 "one config for layers and functions", run as written.

    python examples/docs/user_scenarios_4.py
"""

from _setup import DEVICE, LOCAL_REPO

# --- the document's block ---
from twinkle_fx import register_kernels

config = {
    "layers": {
        "linear": {
            "repo_id": "kernels-community/linear",
            "layer_name": "Linear",
            "version": "0.1.0",
            "device": DEVICE,
            "mode": "inference",
        },
        "conv2d": {
            "repo_path": LOCAL_REPO,
            "package_name": "my_kernels",
            "layer_name": "Conv2d",
            "device": DEVICE,
        },
    },
    "functions": {
        "add": {
            "target_module": "my_pkg.math_ops",
            "func_impl": lambda x, y: x + y + 1,
            "device": DEVICE,
            "mode": "inference",
        },
        "relu": {
            "target_module": "my_pkg.activations",
            "repo_id": "kernels-community/activation",
            "revision": "main",
            "device": DEVICE,
        },
    },
}

register_kernels(config)

# Optional: apply both layer and function kernels via kernelize_model
from twinkle_fx import kernelize_model
import torch.nn as nn

model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
kernelize_model(model=model, mode="inference", device=DEVICE, use_fallback=True)
# --- end of the block ---

import my_pkg.math_ops  # noqa: E402

from twinkle_fx.core.swaps import swapped_forward  # noqa: E402

print("model[0] swapped:", swapped_forward(model[0]) is not None, "(no class is bound to 'linear')")
print("my_pkg.math_ops.add patched:", my_pkg.math_ops.add.__module__ != "my_pkg.math_ops")
