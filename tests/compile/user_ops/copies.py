"""A modeling file's own copy of ``norms.scaled_rms`` (transformers copies such helpers per model)."""

import torch


def scaled_rms(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps))
