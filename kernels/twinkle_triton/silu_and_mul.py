"""SwiGLU activation: ``silu_and_mul(x)`` (vLLM's packed form) and ``silu_mul(gate, up)``.

``silu_and_mul(x) = silu(x[..., :d]) * x[..., d:]`` for ``x`` of last dim ``2d`` (one fused
gate_up projection); ``silu_mul(gate, up) = silu(gate) * up`` for the two separate projections of
Qwen2MLP/LlamaMLP, which avoids concatenating them first. Both compute in fp32 (fp64 for fp64) and
round once; PyTorch's ``F.silu(g) * u`` rounds twice in half precision.

Backward, with s = sigmoid(g): d/dg = grad * u * s * (1 + g * (1 - s)), d/du = grad * silu(g);
one kernel writes both from one read of grad, g and u.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._launch import cdiv, compute_dtype, elementwise_block, interpreting, next_power_of_2, rows
from ._library import define_op, wrap_triton


@triton.jit
def _silu_and_mul_fwd_kernel(
    gate_ptr, up_ptr, out_ptr, gate_row_stride, up_row_stride, n_cols,
    BLOCK: tl.constexpr, COMPUTE_DTYPE: tl.constexpr,
):
    # Grid (rows, column blocks): rows on axis 0, whose limit is 2**31 - 1 (axis 1 allows 65535).
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    g = tl.load(gate_ptr + row * gate_row_stride + cols, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    u = tl.load(up_ptr + row * up_row_stride + cols, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    out = g * tl.sigmoid(g) * u
    tl.store(out_ptr + row * n_cols + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _silu_and_mul_bwd_kernel(
    grad_ptr, gate_ptr, up_ptr, grad_gate_ptr, grad_up_ptr,
    grad_row_stride, gate_row_stride, up_row_stride, grad_gate_row_stride, grad_up_row_stride, n_cols,
    BLOCK: tl.constexpr, COMPUTE_DTYPE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    grad = tl.load(grad_ptr + row * grad_row_stride + cols, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    g = tl.load(gate_ptr + row * gate_row_stride + cols, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    u = tl.load(up_ptr + row * up_row_stride + cols, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    s = tl.sigmoid(g)
    grad_g = grad * u * s * (1.0 + g * (1.0 - s))
    grad_u = grad * g * s
    tl.store(grad_gate_ptr + row * grad_gate_row_stride + cols, grad_g.to(grad_gate_ptr.dtype.element_ty), mask=mask)
    tl.store(grad_up_ptr + row * grad_up_row_stride + cols, grad_u.to(grad_up_ptr.dtype.element_ty), mask=mask)


def _row_grid(n_rows: int, n_cols: int) -> tuple[tuple[int, int], int, int]:
    block, num_warps = elementwise_block()
    if interpreting():
        block = next_power_of_2(max(n_cols, 1))
    return (n_rows, cdiv(n_cols, block)), block, num_warps


# Outputs are passed as the freshly allocated tensors themselves, not as 2D views of them, with
# their row strides as numbers: a traced launch (triton_op) that writes into a view costs
# functionalization a copy back into the base.


def _launch_fwd(gate: Tensor, up: Tensor, out: Tensor) -> None:
    """gate, up: 2D with unit last stride; out: contiguous, ``rows x d`` elements."""
    n_rows, n_cols = gate.shape
    if n_rows == 0 or n_cols == 0:
        return
    grid, block, num_warps = _row_grid(n_rows, n_cols)
    wrap_triton(_silu_and_mul_fwd_kernel)[grid](
        gate, up, out, gate.stride(0), up.stride(0), n_cols,
        BLOCK=block, COMPUTE_DTYPE=compute_dtype(gate.dtype), num_warps=num_warps,
    )


def _launch_bwd(
    grad: Tensor, gate: Tensor, up: Tensor, grad_gate: Tensor, grad_up: Tensor,
    grad_gate_row_stride: int, grad_up_row_stride: int,
) -> None:
    """grad, gate, up: 2D with unit last stride; grad_gate/grad_up: rows of unit last stride at the
    given row strides (they may be the two halves of one tensor)."""
    n_rows, n_cols = gate.shape
    if n_rows == 0 or n_cols == 0:
        return
    grid, block, num_warps = _row_grid(n_rows, n_cols)
    wrap_triton(_silu_and_mul_bwd_kernel)[grid](
        grad, gate, up, grad_gate, grad_up,
        grad.stride(0), gate.stride(0), up.stride(0), grad_gate_row_stride, grad_up_row_stride, n_cols,
        BLOCK=block, COMPUTE_DTYPE=compute_dtype(gate.dtype), num_warps=num_warps,
    )


# ----------------------------------------------------------------------------- silu_and_mul


def _halves(x: Tensor) -> tuple[Tensor, Tensor]:
    x2 = rows(x)
    d = x2.shape[1] // 2
    return x2[:, :d], x2[:, d:]


def _silu_and_mul_impl(x: Tensor) -> Tensor:
    d = x.shape[-1] // 2
    out = x.new_empty((*x.shape[:-1], d))
    gate, up = _halves(x)
    _launch_fwd(gate, up, out)
    return out


def _silu_and_mul_fake(x: Tensor) -> Tensor:
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))


def _silu_and_mul_backward_impl(grad: Tensor, x: Tensor) -> Tensor:
    grad_x = x.new_empty(x.shape)
    gate, up = _halves(x)
    grad_gate, grad_up = _halves(grad_x)
    _launch_bwd(rows(grad), gate, up, grad_gate, grad_up, x.shape[-1], x.shape[-1])
    return grad_x


def _silu_and_mul_backward_fake(grad: Tensor, x: Tensor) -> Tensor:
    return x.new_empty(x.shape)


_silu_and_mul_backward_op = define_op(
    "silu_and_mul_backward", _silu_and_mul_backward_impl, fake=_silu_and_mul_backward_fake
)


def _silu_and_mul_setup_context(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


def _silu_and_mul_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return _silu_and_mul_backward_op(grad, x)


_silu_and_mul_op = define_op(
    "silu_and_mul", _silu_and_mul_impl, fake=_silu_and_mul_fake,
    backward=_silu_and_mul_backward, setup_context=_silu_and_mul_setup_context,
)


def silu_and_mul(x: Tensor) -> Tensor:
    """``silu(x[..., :d]) * x[..., d:]`` for ``x`` of last dimension ``2d`` (vLLM semantics).

    Args:
        x (`torch.Tensor`): ``[..., 2d]``; rows may be strided.

    Returns:
        `torch.Tensor`: contiguous ``[..., d]`` in x's dtype.

    Raises:
        ValueError: the last dimension is odd.

    Example:
        ```python
        act = silu_and_mul(gate_up_proj(x))   # gate_up_proj: Linear(hidden, 2 * intermediate)
        ```
    """
    if x.dim() == 0 or x.shape[-1] % 2:
        raise ValueError(
            f"silu_and_mul: x has shape {tuple(x.shape)}; its last dimension must be even "
            "(gate and up halves). For two separate tensors use silu_mul(gate, up)."
        )
    return _silu_and_mul_op(x)


def silu_and_mul_reference(x: Tensor) -> Tensor:
    """Plain PyTorch ``silu_and_mul``."""
    d = x.shape[-1] // 2
    return torch.nn.functional.silu(x[..., :d]) * x[..., d:]


# ----------------------------------------------------------------------------- silu_mul


def _silu_mul_impl(gate: Tensor, up: Tensor) -> Tensor:
    out = gate.new_empty(gate.shape)
    if gate.numel():
        _launch_fwd(rows(gate), rows(up), out)
    return out


def _silu_mul_fake(gate: Tensor, up: Tensor) -> Tensor:
    return gate.new_empty(gate.shape)


def _silu_mul_backward_impl(grad: Tensor, gate: Tensor, up: Tensor) -> tuple[Tensor, Tensor]:
    grad_gate, grad_up = gate.new_empty(gate.shape), up.new_empty(up.shape)
    if gate.numel():
        n = gate.shape[-1]
        _launch_bwd(rows(grad), rows(gate), rows(up), grad_gate, grad_up, n, n)
    return grad_gate, grad_up


def _silu_mul_backward_fake(grad: Tensor, gate: Tensor, up: Tensor) -> tuple[Tensor, Tensor]:
    return gate.new_empty(gate.shape), up.new_empty(up.shape)


_silu_mul_backward_op = define_op("silu_mul_backward", _silu_mul_backward_impl, fake=_silu_mul_backward_fake)


def _silu_mul_setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _silu_mul_backward(ctx, grad):
    gate, up = ctx.saved_tensors
    return _silu_mul_backward_op(grad, gate, up)


_silu_mul_op = define_op(
    "silu_mul", _silu_mul_impl, fake=_silu_mul_fake,
    backward=_silu_mul_backward, setup_context=_silu_mul_setup_context,
)


def silu_mul(gate: Tensor, up: Tensor) -> Tensor:
    """``silu(gate) * up`` for two tensors of one shape (Qwen2MLP's ``act_fn(gate_proj(x)) * up_proj(x)``).

    Args:
        gate (`torch.Tensor`): ``[..., d]``; rows may be strided.
        up (`torch.Tensor`): same shape and dtype as ``gate`` (no broadcasting).

    Returns:
        `torch.Tensor`: contiguous, gate's shape and dtype.

    Raises:
        ValueError: shapes or dtypes differ.

    Example:
        ```python
        out = down_proj(silu_mul(gate_proj(x), up_proj(x)))
        ```
    """
    if gate.shape != up.shape or gate.dtype != up.dtype or gate.dim() == 0:
        raise ValueError(
            f"silu_mul: gate is {tuple(gate.shape)} {gate.dtype}, up is {tuple(up.shape)} {up.dtype}; "
            "pass two tensors (at least 1-D) of one shape and dtype (silu_mul does not broadcast)."
        )
    return _silu_mul_op(gate, up)


def silu_mul_reference(gate: Tensor, up: Tensor) -> Tensor:
    """Plain PyTorch ``silu_mul``."""
    return torch.nn.functional.silu(gate) * up
