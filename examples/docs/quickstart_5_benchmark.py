"""custom-kernel-quickstart.md, "Performance advice" 1: benchmark against PyTorch, run as written
(``twinkle_fx.benchmark_kernel`` for ``nanovllm.kernels.benchmark_kernel``). On the CPU the Triton
kernel runs through the interpreter: the speed-up printed there is the interpreter's, not the kernel's.

    python examples/docs/quickstart_5_benchmark.py
"""

import torch

from _setup import DEVICE
from quickstart_4_triton_kernel import my_custom_op, torch_reference

x = torch.randn(1 << 20 if DEVICE == "cuda" else 4096, device=DEVICE)

# --- the document's block ---
from twinkle_fx import benchmark_kernel

time_custom = benchmark_kernel(my_custom_op, x, warmup=20, iters=100)
time_torch = benchmark_kernel(torch_reference, x, warmup=20, iters=100)

print(f"speed-up: {time_torch/time_custom:.2f}x")
# --- end of the block ---

print(time_custom)
print(time_torch)
