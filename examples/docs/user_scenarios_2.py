"""user-scenarios.md, scenario 2 "speed up a few hot functions", run as written.

    python examples/docs/user_scenarios_2.py
"""

from _setup import DEVICE

# --- the document's block ---
from twinkle_fx import kernelize_model, register_kernels

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

# model can be None when you only need function kernels
kernelize_model(model=None, mode="inference", device=DEVICE, use_fallback=True)
# --- end of the block ---

import torch  # noqa: E402

import my_pkg.math_ops  # noqa: E402

one = torch.ones(2, device=DEVICE)
print("my_pkg.math_ops.add(1, 1) is now:", my_pkg.math_ops.add(one, one).tolist())
