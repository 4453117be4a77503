"""Function kernels, eagerly: the documentation's example, run as written (on the GPU, or on the CPU
through the Triton interpreter where there is none).

    python examples/function_kernels.py
"""

import torch
from _common import DEVICE

from twinkle_fx import kernelize_model, undo_kernelize
from twinkle_fx.function import apply_function_kernel, register_function_kernel

import my_pkg.activations
import my_pkg.math_ops
from my_pkg.fast_ops import MulRepo, fast_add

register_function_kernel(func_name="add", target_module="my_pkg.math_ops", func_impl=fast_add,
                         device=DEVICE, mode="inference")
register_function_kernel(func_name="mul", target_module="my_pkg.math_ops", repo=MulRepo(),
                         device=DEVICE, mode="compile")         # repo.load() returns the kernel
register_function_kernel(func_name="silu_and_mul", target_module="my_pkg.activations",
                         repo_id="kernels-community/activation", revision="main")  # or version=

patched = apply_function_kernel(target_module="my_pkg.math_ops", device=DEVICE,
                                mode="inference", use_fallback=True, strict=False)
print("patched:", patched)
a, b = torch.randn(1000, device=DEVICE), torch.randn(1000, device=DEVICE)
print("scaled_sum uses the kernel:", my_pkg.math_ops.add.__name__,
      torch.allclose(my_pkg.math_ops.scaled_sum(a, b), (a + b) * 0.5))

kernelize_model(model=None, mode="inference", device=DEVICE)   # functions only: adds the Hub kernel
print("silu_and_mul is now:", getattr(my_pkg.activations.silu_and_mul, "__module__", "?"))
x = torch.randn(8, 64, device=DEVICE)
d = x.shape[-1] // 2
print("silu_and_mul matches:", torch.allclose(my_pkg.activations.silu_and_mul(x),
                                              torch.nn.functional.silu(x[..., :d]) * x[..., d:], atol=1e-5))

undo_kernelize()
print("restored:", my_pkg.math_ops.add.__module__, my_pkg.activations.silu_and_mul.__module__)
