"""``mul_add(a, b, c) = a * b + c`` in one pass (scale-and-shift, gated residuals).

Computed in fp32 (fp64 for fp64) with one rounding; PyTorch's ``a * b + c`` rounds the product
first in half precision. Inputs of the output's shape that are contiguous are read in place; an
input that broadcasts (e.g. ``[hidden]`` against ``[..., hidden]``) or is non-contiguous is
materialised at the output's shape first (one copy): the kernel is a flat 1D stream, which is what
reaches copy bandwidth. Gradients of broadcast inputs are summed back to their shapes by torch.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._checks import REAL, check_tensors
from ._launch import cdiv, compute_dtype, elementwise_block
from ._library import define_op, wrap_triton


@triton.jit
def _mul_add_fwd_kernel(a_ptr, b_ptr, c_ptr, out_ptr, numel, BLOCK: tl.constexpr, COMPUTE_DTYPE: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    a = tl.load(a_ptr + offs, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    b = tl.load(b_ptr + offs, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    c = tl.load(c_ptr + offs, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    tl.store(out_ptr + offs, (a * b + c).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _mul_add_bwd_kernel(
    grad_ptr, a_ptr, b_ptr, grad_a_ptr, grad_b_ptr, numel, BLOCK: tl.constexpr, COMPUTE_DTYPE: tl.constexpr
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    g = tl.load(grad_ptr + offs, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    a = tl.load(a_ptr + offs, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    b = tl.load(b_ptr + offs, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    tl.store(grad_a_ptr + offs, (g * b).to(grad_a_ptr.dtype.element_ty), mask=mask)
    tl.store(grad_b_ptr + offs, (g * a).to(grad_b_ptr.dtype.element_ty), mask=mask)


def _dense(t: Tensor, shape: torch.Size) -> Tensor:
    # The common case (same shape, contiguous) costs no view: host time is a large part of this
    # op's eager cost (~18 us a Triton launch on an H200 host, GPU time 110 us at 4096 x 14336).
    if t.shape == shape and t.is_contiguous():
        return t
    return t.expand(shape).contiguous()


def _launch(kernel, tensors: tuple[Tensor, ...], numel: int, dtype: torch.dtype) -> None:
    if numel == 0:
        return
    block, num_warps = elementwise_block()
    kernel[(cdiv(numel, block),)](
        *tensors, numel, BLOCK=block, COMPUTE_DTYPE=compute_dtype(dtype), num_warps=num_warps
    )


def _out_shape(a: Tensor, b: Tensor, c: Tensor) -> torch.Size:
    if a.shape == b.shape == c.shape:  # torch.broadcast_shapes costs ~10 us of host time
        return a.shape
    return torch.broadcast_shapes(a.shape, b.shape, c.shape)


def _mul_add_impl(a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    shape = _out_shape(a, b, c)
    out = a.new_empty(shape)
    _launch(wrap_triton(_mul_add_fwd_kernel), (_dense(a, shape), _dense(b, shape), _dense(c, shape), out), out.numel(), a.dtype)
    return out


def _mul_add_fake(a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    return a.new_empty(_out_shape(a, b, c))


def _mul_add_backward_impl(grad: Tensor, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    shape = grad.shape
    grad_a, grad_b = a.new_empty(shape), b.new_empty(shape)
    _launch(wrap_triton(_mul_add_bwd_kernel), (_dense(grad, shape), _dense(a, shape), _dense(b, shape), grad_a, grad_b),
            grad_a.numel(), a.dtype)
    return grad_a, grad_b


def _mul_add_backward_fake(grad: Tensor, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    return a.new_empty(grad.shape), b.new_empty(grad.shape)


# Autograd wired by hand (define_op), not declared with define_differentiable_op: c's gradient is the
# incoming gradient summed to c's shape, so the backward keeps c's shape, where a declaration would keep c.
_mul_add_backward_op = define_op("mul_add_backward", _mul_add_backward_impl, fake=_mul_add_backward_fake)


def _mul_add_setup_context(ctx, inputs, output):
    a, b, c = inputs
    ctx.save_for_backward(a, b)
    ctx.c_shape = c.shape


def _mul_add_backward(ctx, grad):
    a, b = ctx.saved_tensors
    grad_a, grad_b = _mul_add_backward_op(grad, a, b)
    if grad.shape == a.shape == b.shape == ctx.c_shape:
        return grad_a, grad_b, grad
    return grad_a.sum_to_size(a.shape), grad_b.sum_to_size(b.shape), grad.sum_to_size(ctx.c_shape)


_mul_add_op = define_op(
    "mul_add", _mul_add_impl, fake=_mul_add_fake, backward=_mul_add_backward, setup_context=_mul_add_setup_context,
    reference=lambda *args: mul_add_reference(*args),  # defined below
)


def mul_add(a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """``a * b + c`` in one pass, with torch broadcasting.

    Args:
        a (`torch.Tensor`): any shape; a floating, integer or bool dtype (integers are computed exactly,
            wrapping on overflow like torch).
        b (`torch.Tensor`): broadcastable with a and c, same dtype.
        c (`torch.Tensor`): broadcastable with a and b, same dtype.

    Returns:
        `torch.Tensor`: contiguous, the broadcast shape, the inputs' dtype.

    Raises:
        TypeError: an argument is not a tensor (a Python number included: pass a tensor) or is complex.
        ValueError: dtypes or devices differ, or shapes do not broadcast.

    Example:
        ```python
        y = mul_add(x, scale, shift)   # x [B, S, H]; scale, shift [H]
        ```
    """
    check_tensors("mul_add", dtypes=REAL, a=a, b=b, c=c)
    if not (a.dtype == b.dtype == c.dtype):
        raise ValueError(
            f"mul_add: dtypes are a={a.dtype}, b={b.dtype}, c={c.dtype}; cast them to one dtype first."
        )
    try:
        _out_shape(a, b, c)
    except RuntimeError as e:
        raise ValueError(
            f"mul_add: shapes a={tuple(a.shape)}, b={tuple(b.shape)}, c={tuple(c.shape)} do not broadcast."
        ) from e
    return _mul_add_op(a, b, c)


def mul_add_reference(a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """Plain PyTorch ``mul_add``."""
    return a * b + c
