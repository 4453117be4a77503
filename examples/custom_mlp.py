"""``CustomGatedMLP``: the gated (SwiGLU) MLP of the custom-kernel quick-start guide, as a module
you construct yourself (``twinkle_triton.layers.SwiGLUMLP`` is the swap-in ``forward`` instead), built
on the kernel package's ``silu_mul`` the way a user's own layers would be.

    python examples/custom_mlp.py      # checks the layer against plain PyTorch, forward and backward

Its parameters are named as in transformers' Qwen2/Qwen3/Llama MLPs (``gate_proj``, ``up_proj``,
``down_proj``), so a ``state_dict`` of one loads into the other.
"""

if __name__ == "__main__":
    # Run as a script: the examples' device, and on a machine without a GPU Triton's interpreter,
    # switched on before the kernel is imported (else the op would run its PyTorch reference there).
    from _common import DEVICE

import torch
import torch.nn.functional as F
from torch import nn

from twinkle_triton import silu_mul

__all__ = ["CustomGatedMLP"]


class CustomGatedMLP(nn.Module):
    """``down_proj(silu(gate_proj(x)) * up_proj(x))`` with the activation and the product in one
    Triton kernel (``twinkle_triton.silu_mul``, forward and backward).

    Args:
        hidden_size (`int`): input and output width.
        intermediate_size (`int`): width of the gate and up projections.
        use_custom_kernels (`bool`, defaults to `True`): `False` computes the same in plain PyTorch
            (the fallback, and the reference the kernel is checked against).
        bias (`bool`, defaults to `False`): biases on the three projections (Qwen/Llama have none).

    Example:
        >>> mlp = CustomGatedMLP(hidden_size=64, intermediate_size=128, use_custom_kernels=True)
        >>> mlp(torch.randn(2, 5, 64)).shape
        torch.Size([2, 5, 64])
    """

    def __init__(self, hidden_size: int, intermediate_size: int, *, use_custom_kernels: bool = True,
                 bias: bool = False) -> None:
        super().__init__()
        self.hidden_size, self.intermediate_size = hidden_size, intermediate_size
        self.use_custom_kernels = use_custom_kernels
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_proj(x), self.up_proj(x)
        hidden = silu_mul(gate, up) if self.use_custom_kernels else F.silu(gate) * up
        return self.down_proj(hidden)

    def extra_repr(self) -> str:
        return f"use_custom_kernels={self.use_custom_kernels}"


def _self_test(device: str) -> None:
    """Kernel vs plain PyTorch on odd sizes, outputs and every gradient (fp32)."""
    torch.manual_seed(0)
    fast = CustomGatedMLP(hidden_size=96, intermediate_size=200, use_custom_kernels=True).to(device)
    plain = CustomGatedMLP(hidden_size=96, intermediate_size=200, use_custom_kernels=False).to(device)
    plain.load_state_dict(fast.state_dict())
    x = torch.randn(3, 37, 96, device=device, requires_grad=True)
    ours, reference = fast(x), plain(x)
    grads = torch.autograd.grad(ours.sum(), [x, *fast.parameters()])
    expected = torch.autograd.grad(reference.sum(), [x, *plain.parameters()])
    errors = [(ours - reference).abs().max().item()] + [(a - b).abs().max().item() for a, b in zip(grads, expected)]
    ok = all(e <= 1e-4 for e in errors)
    print(f"CustomGatedMLP(96 -> 200) on {device}, x {tuple(x.shape)}: max abs error output {errors[0]:.2e}, "
          f"gradients {max(errors[1:]):.2e} -> {'ok' if ok else 'MISMATCH'}")
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    _self_test(DEVICE)
