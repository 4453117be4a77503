"""custom-kernel-quickstart.md, "Into production" 2: a fallback, run as written; twinkle_fx gives
every swapped kernel this fallback itself (``use_fallback=True``).

    python examples/docs/quickstart_9_fallback.py
"""

import importlib.util

import torch

from _setup import DEVICE
from quickstart_4_triton_kernel import my_custom_op as custom_kernel, torch_reference as torch_fallback

KERNELS_AVAILABLE = importlib.util.find_spec("triton") is not None
x = torch.randn(4096, device=DEVICE)

# --- the document's block ---
def safe_custom_op(x):
    if x.is_cuda and KERNELS_AVAILABLE:
        return custom_kernel(x)
    else:
        return torch_fallback(x)
# --- end of the block ---

print(f"safe_custom_op on {x.device.type}: {'the kernel' if x.is_cuda else 'the PyTorch fallback'},",
      "result == 2 * x:", torch.equal(safe_custom_op(x), 2 * x))
