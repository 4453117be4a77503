"""custom-kernel-quickstart.md, "Common scenario — fuse to cut memory traffic", run as written.

    python examples/docs/quickstart_7_fusion.py
"""

import torch
import torch.nn.functional as F

from _setup import DEVICE
from twinkle_triton import fused_add_gelu

torch.manual_seed(0)
x = torch.randn(64, 1000, device=DEVICE)
bias = torch.randn(1000, device=DEVICE)
start = x

# --- the document's block ---
# slow: two passes over memory
x = x + bias
x = F.gelu(x)

# fast: one pass
x = fused_add_gelu(x, bias)
# --- end of the block ---

two_pass = F.gelu(F.gelu(start + bias) + bias)
print("the two halves compose as written:", torch.allclose(x, two_pass, atol=1e-5))
print("one pass == two passes:", torch.allclose(fused_add_gelu(start, bias), F.gelu(start + bias), atol=1e-5))
