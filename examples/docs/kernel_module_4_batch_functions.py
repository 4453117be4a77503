"""twinkle-kernel-module.md, "Function-Level, Example 1: Batch Registration", run as written.

    python examples/docs/kernel_module_4_batch_functions.py
"""

from _setup import DEVICE

# --- the document's block ---
from twinkle_fx import register_kernels, kernelize_model

# 1) Register function kernels
config = {
    "functions": {
        "add": {
            "target_module": "my_pkg.math_ops",
            "func_impl": lambda x, y: x + y + 1,
            "device": DEVICE,
            "mode": "inference",
        },
    },
}
register_kernels(config)

# 2) Apply (model can be None when only functions are used)
kernelize_model(model=None, mode="inference", device=DEVICE, use_fallback=True)
# --- end of the block ---

import torch  # noqa: E402

import my_pkg.math_ops  # noqa: E402

one = torch.ones(3, device=DEVICE)
print("my_pkg.math_ops.add(1, 1) is now:", my_pkg.math_ops.add(one, one).tolist())
