"""twinkle-kernel-module.md, "Function-Level, Example 2: Advanced Function Sources", run as written.

    python examples/docs/kernel_module_5_function_sources.py
"""

from _setup import DEVICE

# --- the document's block ---
from twinkle_fx.function import (
    register_function_kernel,
    apply_function_kernel,
)
import torch.nn as nn
from twinkle_fx import kernelize_model

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

class MyKernelFunc(nn.Module):
    def forward(self, x, y):
        return x * y

register_function_kernel(
    func_name="mul",
    target_module=TARGET_MODULE,
    repo=MyFuncRepo(),
    device=DEVICE,
    mode="compile",
)

# 3) Hub repo
register_function_kernel(
    func_name="silu_and_mul",
    target_module="my_pkg.activations",
    repo_id="kernels-community/activation",
    revision="main",  # or version="0.1.0"
    device=DEVICE,
    mode="inference",
)

# 4) Apply function kernels
applied = apply_function_kernel(
    target_module=TARGET_MODULE,
    device=DEVICE,
    mode="inference",
    strict=False,
)
print("patched:", applied)

# 5) Optional: unified entry via kernelize_model
model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
kernelize_model(model=model, mode="inference", device=DEVICE, use_fallback=True)
# --- end of the block ---

import torch  # noqa: E402

import my_pkg.activations  # noqa: E402
import my_pkg.math_ops  # noqa: E402

x = torch.randn(4, 16, device=DEVICE)
print("math_ops.add is fast_add:", my_pkg.math_ops.add(x, x).equal(x + x + 1))
# a kernel registered for compile also serves inference (Hugging Face kernels' mode fallback)
print("math_ops.mul is MyKernelFunc:", my_pkg.math_ops.mul(x, x).equal(x * x))
print("activations.silu_and_mul from the Hub matches:",
      torch.allclose(my_pkg.activations.silu_and_mul(x), nn.functional.silu(x[:, :8]) * x[:, 8:], atol=1e-5))
