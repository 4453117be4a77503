"""Bias add fused with GELU: ``add_gelu(x, bias, approximate) = gelu(x + bias)``.

The pattern after a Linear whose bias is applied separately (and GPT-2/BERT MLPs). Both GELU
forms: ``"none"`` (erf) and ``"tanh"``. The sum is rounded to x's dtype before the GELU, like
``F.gelu(x + bias)``, then the GELU runs in fp32 (fp64 for fp64). ``bias`` is either
``[hidden]`` (broadcast over the rows of ``x [..., hidden]``) or x's shape.

Backward: one kernel writes ``grad_x = grad * gelu'(x + bias)``; the bias gradient is that summed
over rows by torch (one extra read of grad_x, cheaper than a cross-program reduction for the
typical hidden sizes).
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._checks import check_tensors
from ._launch import accumulation_dtype, cdiv, compute_dtype, elementwise_block
from ._library import define_differentiable_op, wrap_triton

_APPROXIMATIONS = ("none", "tanh")


@triton.jit
def gelu_terms(s, APPROX_TANH: tl.constexpr):
    """(gelu(s), gelu'(s)) in s's dtype."""
    if APPROX_TANH:
        k0: tl.constexpr = 0.7978845608028654  # sqrt(2 / pi)
        k1: tl.constexpr = 0.044715
        inner = k0 * (s + k1 * s * s * s)
        t = 2.0 * tl.sigmoid(2.0 * inner) - 1.0  # tanh(inner), without a libdevice call
        value = 0.5 * s * (1.0 + t)
        slope = 0.5 * (1.0 + t) + 0.5 * s * (1.0 - t * t) * k0 * (1.0 + 3.0 * k1 * s * s)
    else:
        cdf = 0.5 * (1.0 + tl.erf(s * 0.7071067811865476))
        value = s * cdf
        slope = cdf + s * tl.exp(-0.5 * s * s) * 0.3989422804014327  # 1 / sqrt(2 pi)
    return value, slope


@triton.jit
def _add_gelu_fwd_kernel(
    x_ptr, bias_ptr, out_ptr, numel, n_cols,
    BIAS_IS_ROW: tl.constexpr, APPROX_TANH: tl.constexpr, BLOCK: tl.constexpr, COMPUTE_DTYPE: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    if BIAS_IS_ROW:
        bias_offs = offs % n_cols
    else:
        bias_offs = offs
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    b = tl.load(bias_ptr + bias_offs, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    s = (x + b).to(x_ptr.dtype.element_ty).to(COMPUTE_DTYPE)
    value, _ = gelu_terms(s, APPROX_TANH)
    tl.store(out_ptr + offs, value.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _add_gelu_bwd_kernel(
    grad_ptr, x_ptr, bias_ptr, grad_x_ptr, numel, n_cols,
    BIAS_IS_ROW: tl.constexpr, APPROX_TANH: tl.constexpr, BLOCK: tl.constexpr, COMPUTE_DTYPE: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    if BIAS_IS_ROW:
        bias_offs = offs % n_cols
    else:
        bias_offs = offs
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    b = tl.load(bias_ptr + bias_offs, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    g = tl.load(grad_ptr + offs, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    s = (x + b).to(x_ptr.dtype.element_ty).to(COMPUTE_DTYPE)
    _, slope = gelu_terms(s, APPROX_TANH)
    tl.store(grad_x_ptr + offs, (g * slope).to(grad_x_ptr.dtype.element_ty), mask=mask)


def _launch(kernel, tensors: tuple[Tensor, ...], x: Tensor, bias: Tensor, approximate: str) -> None:
    numel = x.numel()
    if numel == 0:
        return
    block, num_warps = elementwise_block()
    kernel[(cdiv(numel, block),)](
        *tensors, numel, x.shape[-1],
        BIAS_IS_ROW=bias.dim() == 1 and x.dim() != 1, APPROX_TANH=approximate == "tanh",
        BLOCK=block, COMPUTE_DTYPE=compute_dtype(x.dtype), num_warps=num_warps,
    )


def _add_gelu_impl(x: Tensor, bias: Tensor, approximate: str) -> Tensor:
    x, bias = x.contiguous(), bias.contiguous()
    out = torch.empty_like(x)
    _launch(wrap_triton(_add_gelu_fwd_kernel), (x, bias, out), x, bias, approximate)
    return out


def _add_gelu_fake(x: Tensor, bias: Tensor, approximate: str) -> Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _add_gelu_backward_impl(grad: Tensor, x: Tensor, bias: Tensor, approximate: str) -> tuple[Tensor, Tensor]:
    grad, x, bias = grad.contiguous(), x.contiguous(), bias.contiguous()
    grad_x = torch.empty_like(x)
    _launch(wrap_triton(_add_gelu_bwd_kernel), (grad, x, bias, grad_x), x, bias, approximate)
    if bias.shape == x.shape:
        return grad_x, grad_x.clone()
    acc = accumulation_dtype(x.dtype)
    return grad_x, grad_x.reshape(-1, x.shape[-1]).sum(0, dtype=acc).to(bias.dtype)


def _add_gelu_backward_fake(grad: Tensor, x: Tensor, bias: Tensor, approximate: str) -> tuple[Tensor, Tensor]:
    return torch.empty_like(x, memory_format=torch.contiguous_format), torch.empty_like(bias, memory_format=torch.contiguous_format)


_add_gelu_op = define_differentiable_op(
    "add_gelu", _add_gelu_impl, fake=_add_gelu_fake,
    backward=_add_gelu_backward_impl, backward_fake=_add_gelu_backward_fake, saved=("x", "bias", "approximate"),
    reference=lambda *args: add_gelu_reference(*args),  # defined below
)


def add_gelu(x: Tensor, bias: Tensor, approximate: str = "none") -> Tensor:
    """``F.gelu(x + bias, approximate=approximate)`` in one pass.

    Args:
        x (`torch.Tensor`): ``[..., hidden]`` (non-contiguous inputs are copied first).
        bias (`torch.Tensor`): ``[hidden]`` or x's shape, x's dtype.
        approximate (`str`, defaults to ``"none"``): ``"none"`` (erf GELU) or ``"tanh"``.

    Returns:
        `torch.Tensor`: contiguous, x's shape and dtype.

    Raises:
        TypeError: a tensor argument is not a floating-point tensor (the error names it).
        ValueError: unknown ``approximate``, a bias shape/dtype other than the supported ones, or
            tensors on two devices.

    Example:
        ```python
        h = add_gelu(x @ fc.weight.T, fc.bias, approximate="tanh")
        ```
    """
    check_tensors("add_gelu", min_dim=1, x=x, bias=bias)
    if approximate not in _APPROXIMATIONS:
        raise ValueError(f"add_gelu: approximate={approximate!r}; use one of {_APPROXIMATIONS}.")
    if x.dim() == 0 or bias.dtype != x.dtype or (
        bias.shape != x.shape and (bias.dim() != 1 or bias.shape[0] != x.shape[-1])
    ):
        raise ValueError(
            f"add_gelu: x is {tuple(x.shape)} {x.dtype}, bias is {tuple(bias.shape)} {bias.dtype}; "
            f"pass a bias of x's dtype shaped [{x.shape[-1] if x.dim() else '?'}] or like x."
        )
    return _add_gelu_op(x, bias, approximate)


def add_gelu_reference(x: Tensor, bias: Tensor, approximate: str = "none") -> Tensor:
    """Plain PyTorch ``add_gelu``."""
    return torch.nn.functional.gelu(x + bias, approximate=approximate)
