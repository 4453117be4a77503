"""Plain PyTorch functions, called from user models."""

import torch


def scaled_rms(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMS-normalise the last dimension of ``x`` and scale by ``weight``."""
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps))


def rolled(x: torch.Tensor, shift: int = 1) -> torch.Tensor:
    """Roll the last dimension by ``shift`` and double."""
    return torch.roll(x, shift, -1) * 2


def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Elementwise sum (a one-op function: the kind a bare-computation match would take everywhere)."""
    return x + y
