"""Plain PyTorch math that ``register_function_kernel`` targets in the examples."""

import torch


def add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a + b


def mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a * b


def scaled_sum(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Calls add() through the module global, so a patched add is picked up here too."""
    return add(a, b) * 0.5
