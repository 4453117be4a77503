"""user-scenarios.md, scenario 3 "full control over function kernel sources", run as written.

    python examples/docs/user_scenarios_3.py
"""

from _setup import DEVICE

# --- the document's block ---
from twinkle_fx.function import register_function_kernel, apply_function_kernel

TARGET_MODULE = "my_pkg.math_ops"

# 1) Direct implementation
def fast_add(x, y):
    return x + y + 1

register_function_kernel(
    func_name="add",
    target_module=TARGET_MODULE,
    func_impl=fast_add,
    device=DEVICE,
    mode="inference",
)

# 2) Repo object (FuncRepositoryProtocol)
class MyFuncRepo:
    def load(self):
        return MyKernelFunc

class MyKernelFunc:
    can_torch_compile = True
    has_backward = True
    def __call__(self, x, y):
        return x + y + 2

register_function_kernel(
    func_name="mul",
    target_module=TARGET_MODULE,
    repo=MyFuncRepo(),
    device=DEVICE,
    mode="compile",
)

# 3) Hub repo_id
register_function_kernel(
    func_name="silu_and_mul",
    target_module="my_pkg.activations",
    repo_id="kernels-community/activation",
    revision="main",  # or version="0.1.0"
    device=DEVICE,
    mode="inference",
)

applied = apply_function_kernel(
    target_module=TARGET_MODULE,
    device=DEVICE,
    mode="inference",
    use_fallback=True,
    strict=False,
)

print("patched:", applied)

# Optional: apply via kernelize_model as the entry point
from twinkle_fx import kernelize_model
import torch.nn as nn

model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
kernelize_model(model=model, mode="inference", device=DEVICE, use_fallback=True)
# --- end of the block ---

import torch  # noqa: E402

import my_pkg.activations  # noqa: E402
import my_pkg.math_ops  # noqa: E402

x = torch.ones(3, device=DEVICE)
print("add(1, 1):", my_pkg.math_ops.add(x, x).tolist(), "mul(1, 1):", my_pkg.math_ops.mul(x, x).tolist())
y = torch.randn(4, 16, device=DEVICE)
print("silu_and_mul from the Hub matches:",
      torch.allclose(my_pkg.activations.silu_and_mul(y), nn.functional.silu(y[:, :8]) * y[:, 8:], atol=1e-5))
