"""twinkle-kernel-module.md, "Unified Layer + Function Batch Registration", run as written.

    python examples/docs/kernel_module_6_unified.py
"""

from _setup import DEVICE, LOCAL_REPO

# --- the document's block ---
from twinkle_fx import register_kernels, kernelize_model
import torch.nn as nn

# 1) Register layer + function kernels
config = {
    "layers": {
        "linear": {
            "repo_id": "kernels-community/linear",
            "layer_name": "Linear",
            "version": "0.1.0",
            "device": DEVICE,
            "mode": "train",
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

# 2) Apply via kernelize_model
model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
kernelize_model(model=model, mode="train", device=DEVICE, use_fallback=True)
# --- end of the block ---

import my_pkg.activations  # noqa: E402
import my_pkg.math_ops  # noqa: E402

from twinkle_fx.core.swaps import swapped_forward  # noqa: E402

# no class is bound to "linear" or "conv2d" (register_external_layer(nn.Linear, "linear") would
# bind one), so the model keeps its layers; kernels-community/activation has no relu: kept too
print("model[0] swapped:", swapped_forward(model[0]) is not None)
print("my_pkg.math_ops.add patched:", my_pkg.math_ops.add.__module__ != "my_pkg.math_ops")
print("my_pkg.activations.relu patched:", my_pkg.activations.relu.__module__ != "my_pkg.activations")
