"""GeGLU activation: ``gelu_mul(gate, up)`` and ``gelu_and_mul(x)`` (packed gate|up).

``gelu_mul(gate, up, approximate) = gelu(gate, approximate) * up``: Gemma 1/2/3's MLP,
``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` with ``hidden_activation="gelu_pytorch_tanh"``
(``approximate="tanh"``; ``"none"`` is the erf GELU). ``gelu_and_mul(x)`` takes one fused
``gate_up`` projection of last dim ``2d``. Like ``silu_mul``, the GELU and the product run in fp32
(fp64 for fp64) and round once; PyTorch's ``F.gelu(g) * u`` rounds twice in half precision.

Backward, one kernel from one read of grad, gate and up: d/dgate = grad * up * gelu'(gate),
d/dup = grad * gelu(gate).
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._launch import compute_dtype, elementwise_block, interpreting, rows
from ._library import define_op, wrap_triton
from .add_gelu import _gelu_terms

_APPROXIMATIONS = ("none", "tanh")


@triton.jit
def _gelu_mul_fwd_kernel(
    gate_ptr, up_ptr, out_ptr, gate_row_stride, up_row_stride, n_cols,
    APPROX_TANH: tl.constexpr, BLOCK: tl.constexpr, COMPUTE_DTYPE: tl.constexpr,
):
    # Grid (rows, column blocks), rows on axis 0 (its limit is 2**31 - 1), as silu_mul.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    g = tl.load(gate_ptr + row * gate_row_stride + cols, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    u = tl.load(up_ptr + row * up_row_stride + cols, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    value, _ = _gelu_terms(g, APPROX_TANH)
    tl.store(out_ptr + row * n_cols + cols, (value * u).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gelu_mul_bwd_kernel(
    grad_ptr, gate_ptr, up_ptr, grad_gate_ptr, grad_up_ptr,
    grad_row_stride, gate_row_stride, up_row_stride, grad_gate_row_stride, grad_up_row_stride, n_cols,
    APPROX_TANH: tl.constexpr, BLOCK: tl.constexpr, COMPUTE_DTYPE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    grad = tl.load(grad_ptr + row * grad_row_stride + cols, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    g = tl.load(gate_ptr + row * gate_row_stride + cols, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    u = tl.load(up_ptr + row * up_row_stride + cols, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    value, slope = _gelu_terms(g, APPROX_TANH)
    tl.store(grad_gate_ptr + row * grad_gate_row_stride + cols, (grad * u * slope).to(grad_gate_ptr.dtype.element_ty),
             mask=mask)
    tl.store(grad_up_ptr + row * grad_up_row_stride + cols, (grad * value).to(grad_up_ptr.dtype.element_ty), mask=mask)


def _row_grid(n_rows: int, n_cols: int) -> tuple[tuple[int, int], int, int]:
    block, num_warps = elementwise_block()
    if interpreting():
        block = triton.next_power_of_2(max(n_cols, 1))
    return (n_rows, triton.cdiv(n_cols, block)), block, num_warps


def _launch_fwd(gate: Tensor, up: Tensor, out: Tensor, approximate: str) -> None:
    """gate, up: 2D with unit last stride; out: contiguous, ``rows x d`` elements."""
    n_rows, n_cols = gate.shape
    if n_rows == 0 or n_cols == 0:
        return
    grid, block, num_warps = _row_grid(n_rows, n_cols)
    wrap_triton(_gelu_mul_fwd_kernel)[grid](
        gate, up, out, gate.stride(0), up.stride(0), n_cols,
        APPROX_TANH=approximate == "tanh", BLOCK=block, COMPUTE_DTYPE=compute_dtype(gate.dtype), num_warps=num_warps,
    )


def _launch_bwd(
    grad: Tensor, gate: Tensor, up: Tensor, grad_gate: Tensor, grad_up: Tensor,
    grad_gate_row_stride: int, grad_up_row_stride: int, approximate: str,
) -> None:
    """grad_gate/grad_up: rows of unit last stride at the given row strides (they may be the two
    halves of one tensor)."""
    n_rows, n_cols = gate.shape
    if n_rows == 0 or n_cols == 0:
        return
    grid, block, num_warps = _row_grid(n_rows, n_cols)
    wrap_triton(_gelu_mul_bwd_kernel)[grid](
        grad, gate, up, grad_gate, grad_up,
        grad.stride(0), gate.stride(0), up.stride(0), grad_gate_row_stride, grad_up_row_stride, n_cols,
        APPROX_TANH=approximate == "tanh", BLOCK=block, COMPUTE_DTYPE=compute_dtype(gate.dtype), num_warps=num_warps,
    )


def _check_approximate(op: str, approximate: str) -> None:
    if approximate not in _APPROXIMATIONS:
        raise ValueError(f"{op}: approximate={approximate!r}; use one of {_APPROXIMATIONS}.")


# ----------------------------------------------------------------------------- gelu_mul


def _gelu_mul_impl(gate: Tensor, up: Tensor, approximate: str) -> Tensor:
    out = gate.new_empty(gate.shape)
    if gate.numel():
        _launch_fwd(rows(gate), rows(up), out, approximate)
    return out


def _gelu_mul_fake(gate: Tensor, up: Tensor, approximate: str) -> Tensor:
    return gate.new_empty(gate.shape)


def _gelu_mul_backward_impl(grad: Tensor, gate: Tensor, up: Tensor, approximate: str) -> tuple[Tensor, Tensor]:
    grad_gate, grad_up = gate.new_empty(gate.shape), up.new_empty(up.shape)
    if gate.numel():
        n = gate.shape[-1]
        _launch_bwd(rows(grad), rows(gate), rows(up), grad_gate, grad_up, n, n, approximate)
    return grad_gate, grad_up


def _gelu_mul_backward_fake(grad: Tensor, gate: Tensor, up: Tensor, approximate: str) -> tuple[Tensor, Tensor]:
    return gate.new_empty(gate.shape), up.new_empty(up.shape)


_gelu_mul_backward_op = define_op("gelu_mul_backward", _gelu_mul_backward_impl, fake=_gelu_mul_backward_fake)


def _gelu_mul_setup_context(ctx, inputs, output):
    gate, up, approximate = inputs
    ctx.save_for_backward(gate, up)
    ctx.approximate = approximate


def _gelu_mul_backward(ctx, grad):
    gate, up = ctx.saved_tensors
    grad_gate, grad_up = _gelu_mul_backward_op(grad, gate, up, ctx.approximate)
    return grad_gate, grad_up, None


_gelu_mul_op = define_op(
    "gelu_mul", _gelu_mul_impl, fake=_gelu_mul_fake,
    backward=_gelu_mul_backward, setup_context=_gelu_mul_setup_context,
)


def gelu_mul(gate: Tensor, up: Tensor, approximate: str = "tanh") -> Tensor:
    """``gelu(gate, approximate) * up`` for two tensors of one shape (Gemma's GeGLU MLP).

    Args:
        gate (`torch.Tensor`): ``[..., d]``; rows may be strided.
        up (`torch.Tensor`): same shape and dtype as ``gate`` (no broadcasting).
        approximate (`str`, defaults to ``"tanh"``): ``"tanh"`` (transformers' ``gelu_pytorch_tanh``)
            or ``"none"`` (erf GELU, transformers' ``gelu``).

    Returns:
        `torch.Tensor`: contiguous, gate's shape and dtype.

    Raises:
        ValueError: shapes or dtypes differ, or an unknown ``approximate``.

    Example:
        ```python
        out = down_proj(gelu_mul(gate_proj(x), up_proj(x)))
        ```
    """
    _check_approximate("gelu_mul", approximate)
    if gate.shape != up.shape or gate.dtype != up.dtype or gate.dim() == 0:
        raise ValueError(
            f"gelu_mul: gate is {tuple(gate.shape)} {gate.dtype}, up is {tuple(up.shape)} {up.dtype}; "
            "pass two tensors (at least 1-D) of one shape and dtype (gelu_mul does not broadcast)."
        )
    return _gelu_mul_op(gate, up, approximate)


def gelu_mul_reference(gate: Tensor, up: Tensor, approximate: str = "tanh") -> Tensor:
    """Plain PyTorch ``gelu_mul``."""
    return torch.nn.functional.gelu(gate, approximate=approximate) * up


# ----------------------------------------------------------------------------- gelu_and_mul


def _halves(x: Tensor) -> tuple[Tensor, Tensor]:
    x2 = rows(x)
    d = x2.shape[1] // 2
    return x2[:, :d], x2[:, d:]


def _gelu_and_mul_impl(x: Tensor, approximate: str) -> Tensor:
    out = x.new_empty((*x.shape[:-1], x.shape[-1] // 2))
    if x.numel():
        gate, up = _halves(x)
        _launch_fwd(gate, up, out, approximate)
    return out


def _gelu_and_mul_fake(x: Tensor, approximate: str) -> Tensor:
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))


def _gelu_and_mul_backward_impl(grad: Tensor, x: Tensor, approximate: str) -> Tensor:
    grad_x = x.new_empty(x.shape)
    if x.numel():
        gate, up = _halves(x)
        grad_gate, grad_up = _halves(grad_x)
        _launch_bwd(rows(grad), gate, up, grad_gate, grad_up, x.shape[-1], x.shape[-1], approximate)
    return grad_x


def _gelu_and_mul_backward_fake(grad: Tensor, x: Tensor, approximate: str) -> Tensor:
    return x.new_empty(x.shape)


_gelu_and_mul_backward_op = define_op(
    "gelu_and_mul_backward", _gelu_and_mul_backward_impl, fake=_gelu_and_mul_backward_fake
)


def _gelu_and_mul_setup_context(ctx, inputs, output):
    x, approximate = inputs
    ctx.save_for_backward(x)
    ctx.approximate = approximate


def _gelu_and_mul_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return _gelu_and_mul_backward_op(grad, x, ctx.approximate), None


_gelu_and_mul_op = define_op(
    "gelu_and_mul", _gelu_and_mul_impl, fake=_gelu_and_mul_fake,
    backward=_gelu_and_mul_backward, setup_context=_gelu_and_mul_setup_context,
)


def gelu_and_mul(x: Tensor, approximate: str = "tanh") -> Tensor:
    """``gelu(x[..., :d], approximate) * x[..., d:]`` for ``x`` of last dimension ``2d``
    (vLLM's ``GeluAndMul``; one fused gate_up projection).

    Args:
        x (`torch.Tensor`): ``[..., 2d]``; rows may be strided.
        approximate (`str`, defaults to ``"tanh"``): ``"tanh"`` or ``"none"``.

    Returns:
        `torch.Tensor`: contiguous ``[..., d]`` in x's dtype.

    Raises:
        ValueError: the last dimension is odd, or an unknown ``approximate``.

    Example:
        ```python
        act = gelu_and_mul(gate_up_proj(x))   # gate_up_proj: Linear(hidden, 2 * intermediate)
        ```
    """
    _check_approximate("gelu_and_mul", approximate)
    if x.dim() == 0 or x.shape[-1] % 2:
        raise ValueError(
            f"gelu_and_mul: x has shape {tuple(x.shape)}; its last dimension must be even "
            "(gate and up halves). For two separate tensors use gelu_mul(gate, up)."
        )
    return _gelu_and_mul_op(x, approximate)


def gelu_and_mul_reference(x: Tensor, approximate: str = "tanh") -> Tensor:
    """Plain PyTorch ``gelu_and_mul``."""
    d = x.shape[-1] // 2
    return torch.nn.functional.gelu(x[..., :d], approximate=approximate) * x[..., d:]
