"""Small kernels as torch.library custom ops (fake + autograd), written the way kernel authors
write them, so the backend can be tested without Triton."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul_reference(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


@torch.library.custom_op("twinkle_test::silu_and_mul", mutates_args=())
def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    return silu_and_mul_reference(x)


@silu_and_mul.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], x.shape[-1] // 2)


@torch.library.custom_op("twinkle_test::silu_and_mul_backward", mutates_args=())
def silu_and_mul_backward(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    gate, up = x[..., :d], x[..., d:]
    sig = torch.sigmoid(gate)
    d_gate = grad * up * sig * (1 + gate * (1 - sig))
    return torch.cat([d_gate, grad * gate * sig], dim=-1)


@silu_and_mul_backward.register_fake
def _(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


def _backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return silu_and_mul_backward(grad, x)


silu_and_mul.register_autograd(_backward, setup_context=_setup)


class SiluAndMulKernel(torch.nn.Module):
    """A layer kernel: ``forward(self, x)`` calling the custom op."""

    has_backward = True
    can_torch_compile = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.twinkle_test.silu_and_mul(x)


class SiluAndMul(torch.nn.Module):
    """The model's own layer the kernel replaces."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:]


class GatedMLP(torch.nn.Module):
    def __init__(self, hidden: int = 8, inner: int = 16) -> None:
        super().__init__()
        self.up = torch.nn.Linear(hidden, 2 * inner)
        self.act = SiluAndMul()
        self.down = torch.nn.Linear(inner, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))


@torch.library.custom_op("twinkle_test::scaled_rms", mutates_args=())
def scaled_rms_op(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


@scaled_rms_op.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.empty_like(x)


EPS_SEEN: list[float] = []


def fast_scaled_rms(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """A function kernel (inference only: no autograd registered on its op)."""
    EPS_SEEN.append(eps)
    return torch.ops.twinkle_test.scaled_rms(x, weight, eps)


fast_scaled_rms.can_torch_compile = True
fast_scaled_rms.has_backward = False
