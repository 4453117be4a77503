"""Models calling the registered function directly, and a copy of it written inline."""

import torch

from . import copies, norms


class TwoNorms(torch.nn.Module):
    """Calls ``norms.scaled_rms`` with two different eps, then the same math written inline."""

    def __init__(self, hidden: int = 8) -> None:
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.rand(hidden) + 0.5)
        self.w2 = torch.nn.Parameter(torch.rand(hidden) + 0.5)
        self.proj = torch.nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = norms.scaled_rms(x, self.w1, eps=1e-5)
        h = self.proj(h)
        variance = h.pow(2).mean(-1, keepdim=True)  # the same computation, not a call
        return self.w2 * (h * torch.rsqrt(variance + 1e-3))


class Rolls(torch.nn.Module):
    """Calls ``norms.rolled`` with the default shift and with another one."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return norms.rolled(x) + norms.rolled(x, 3)


class CopyThenCall(torch.nn.Module):
    """Calls the copy in ``copies`` and then the registered ``norms.scaled_rms``."""

    def __init__(self, hidden: int = 8) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.rand(hidden) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return norms.scaled_rms(copies.scaled_rms(x, self.w, eps=1e-4), self.w)


class BiasAdd(torch.nn.Module):
    """A residual ``h + bias`` that broadcasts (bias [8] onto h [2, 3, 8]), and one call of ``norms.add``."""

    def __init__(self, hidden: int = 8) -> None:
        super().__init__()
        self.bias = torch.nn.Parameter(torch.randn(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.bias
        return norms.add(h, x)
