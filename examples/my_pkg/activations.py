"""The gated activation of Llama-style MLPs, written the plain way."""

import torch
import torch.nn.functional as F


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


def relu(x: torch.Tensor) -> torch.Tensor:
    """Registered by the documents' unified config against kernels-community/activation, which has no
    relu kernel: the original is kept (use_fallback) and the reason is logged."""
    return F.relu(x)
