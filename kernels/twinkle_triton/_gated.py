"""Gated activations ``act(gate) * up``: the kernels and launchers behind SwiGLU
(:mod:`.silu_and_mul`), GeGLU (:mod:`.gelu_mul`) and GPT-OSS's clamped SwiGLU
(:mod:`.clamped_swiglu`), which differ only in ``act`` (and, for the last, in a clamp of both halves
and an ``up + 1``).

All compute in fp32 (fp64 for fp64) and round once. Backward, one kernel from one read of grad,
gate and up: d/dgate = grad * up * act'(gate), d/dup = grad * act(gate); for SiLU, with
s = sigmoid(g), act' = s * (1 + g * (1 - s)). The clamped SwiGLU reads ``min(gate, limit)`` and
``clamp(up, -limit, limit) + 1`` in their place, and each half's gradient is zero where its clamp
bites (the bounds themselves pass, as with ``torch.clamp``).

Gate and up are read at a column stride (``IN_COL_STRIDE``, a ``tl.constexpr``): 1 for separate
tensors or the two halves of a packed row, 2 for GPT-OSS's interleaved ``[g0, u0, g1, u1, ...]``,
so no de-interleaving copy is made.

``ACTIVATION`` is a ``tl.constexpr``: each activation compiles to its own kernel, as the separate
kernels did before they shared this code.
"""

import triton
import triton.language as tl
from torch import Tensor

from ._float_args import fp32
from ._launch import cdiv, compute_dtype, elementwise_block, loop_block, rows
from ._library import wrap_triton
from .add_gelu import gelu_terms

# ACTIVATION values
SILU = 0
GELU = 1  # erf GELU, approximate="none"
GELU_TANH = 2  # approximate="tanh"
CLAMPED_SWIGLU = 3  # GPT-OSS: (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g), g = min(gate, limit)

GELU_APPROXIMATIONS = {"none": GELU, "tanh": GELU_TANH}


@triton.jit
def _act_terms(g, alpha, limit, ACTIVATION: tl.constexpr):
    """(act(g), act'(g)) in g's dtype (``alpha``, ``limit``: the clamped SwiGLU's only)."""
    if ACTIVATION == 0:
        s = tl.sigmoid(g)
        value = g * s
        slope = s * (1.0 + g * (1.0 - s))
    elif ACTIVATION == 3:
        clamped = tl.minimum(g, limit)
        s = tl.sigmoid(alpha * clamped)
        value = clamped * s
        slope = tl.where(g <= limit, s * (1.0 + alpha * clamped * (1.0 - s)), 0.0)
    else:
        value, slope = gelu_terms(g, ACTIVATION == 2)
    return value, slope


@triton.jit
def _up_terms(u, limit, ACTIVATION: tl.constexpr):
    """(the factor up contributes, its slope): (u, 1) but for the clamped SwiGLU's clamp(u) + 1."""
    if ACTIVATION == 3:
        factor = tl.minimum(tl.maximum(u, -limit), limit) + 1.0
        slope = tl.where((u >= -limit) & (u <= limit), 1.0, 0.0)
    else:
        factor = u
        slope = 1.0
    return factor, slope


@triton.jit
def _gated_act_fwd_kernel(
    gate_ptr, up_ptr, out_ptr, gate_row_stride, up_row_stride, n_cols, alpha, limit,
    ACTIVATION: tl.constexpr, IN_COL_STRIDE: tl.constexpr, BLOCK: tl.constexpr, COMPUTE_DTYPE: tl.constexpr,
):
    alpha, limit = fp32(alpha), fp32(limit)
    # Grid (rows, column blocks): rows on axis 0, whose limit is 2**31 - 1 (axis 1 allows 65535).
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    g = tl.load(gate_ptr + row * gate_row_stride + cols * IN_COL_STRIDE, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    u = tl.load(up_ptr + row * up_row_stride + cols * IN_COL_STRIDE, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    value, _ = _act_terms(g, alpha, limit, ACTIVATION)
    factor, _ = _up_terms(u, limit, ACTIVATION)
    tl.store(out_ptr + row * n_cols + cols, (value * factor).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gated_act_bwd_kernel(
    grad_ptr, gate_ptr, up_ptr, grad_gate_ptr, grad_up_ptr, value_ptr,
    grad_row_stride, gate_row_stride, up_row_stride, grad_gate_row_stride, grad_up_row_stride, n_cols, alpha, limit,
    ACTIVATION: tl.constexpr, IN_COL_STRIDE: tl.constexpr, WRITE_VALUE: tl.constexpr, BLOCK: tl.constexpr,
    COMPUTE_DTYPE: tl.constexpr,
):
    alpha, limit = fp32(alpha), fp32(limit)
    # gate, up, grad_gate and grad_up at IN_COL_STRIDE; grad at 1; WRITE_VALUE: the forward's output again, into
    # value (contiguous), the same arithmetic as the forward kernel's, so the same bits
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_cols = cols * IN_COL_STRIDE
    mask = cols < n_cols
    grad = tl.load(grad_ptr + row * grad_row_stride + cols, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    g = tl.load(gate_ptr + row * gate_row_stride + in_cols, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    u = tl.load(up_ptr + row * up_row_stride + in_cols, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    value, slope = _act_terms(g, alpha, limit, ACTIVATION)
    factor, up_slope = _up_terms(u, limit, ACTIVATION)
    tl.store(grad_gate_ptr + row * grad_gate_row_stride + in_cols,
             (grad * factor * slope).to(grad_gate_ptr.dtype.element_ty), mask=mask)
    tl.store(grad_up_ptr + row * grad_up_row_stride + in_cols,
             (grad * value * up_slope).to(grad_up_ptr.dtype.element_ty), mask=mask)
    if WRITE_VALUE:
        tl.store(value_ptr + row * n_cols + cols, (value * factor).to(value_ptr.dtype.element_ty), mask=mask)


def _row_grid(n_rows: int, n_cols: int) -> tuple[tuple[int, int], int, int]:
    gpu_block, num_warps = elementwise_block()
    block = loop_block(n_cols, gpu_block)  # the interpreter: the whole row in one program
    return (n_rows, cdiv(n_cols, block)), block, num_warps


# Outputs are passed as the freshly allocated tensors themselves, not as 2D views of them, with
# their row strides as numbers: a traced launch (triton_op) that writes into a view costs
# functionalization a copy back into the base.


def _col_stride(gate: Tensor) -> int:
    return gate.stride(1) if gate.shape[1] > 1 else 1


def launch_fwd(gate: Tensor, up: Tensor, out: Tensor, activation: int, alpha: float = 0.0, limit: float = 0.0) -> None:
    """gate, up: 2D with one last stride (1, or 2 when interleaved); out: contiguous, ``rows x d`` elements."""
    n_rows, n_cols = gate.shape
    if n_rows == 0 or n_cols == 0:
        return
    grid, block, num_warps = _row_grid(n_rows, n_cols)
    wrap_triton(_gated_act_fwd_kernel)[grid](
        gate, up, out, gate.stride(0), up.stride(0), n_cols, alpha, limit,
        ACTIVATION=activation, IN_COL_STRIDE=_col_stride(gate), BLOCK=block, COMPUTE_DTYPE=compute_dtype(gate.dtype),
        num_warps=num_warps,
    )


def launch_bwd(
    grad: Tensor, gate: Tensor, up: Tensor, grad_gate: Tensor, grad_up: Tensor,
    grad_gate_row_stride: int, grad_up_row_stride: int, activation: int, alpha: float = 0.0, limit: float = 0.0,
    value: Tensor | None = None,
) -> None:
    """grad: 2D with unit last stride; gate, up: 2D with one last stride (1, or 2 when interleaved);
    grad_gate/grad_up: rows at the given row strides and gate's last stride (they may be the two
    halves, or the even and odd columns, of one tensor); value: None, or contiguous ``rows x d`` that gets the
    forward's output again (what a following projection's weight gradient reads, so the forward need not keep it)."""
    n_rows, n_cols = gate.shape
    if n_rows == 0 or n_cols == 0:
        return
    grid, block, num_warps = _row_grid(n_rows, n_cols)
    # without a value, value_ptr gets a tensor the kernel only reads (never an output twice)
    wrap_triton(_gated_act_bwd_kernel)[grid](
        grad, gate, up, grad_gate, grad_up, value if value is not None else grad,
        grad.stride(0), gate.stride(0), up.stride(0), grad_gate_row_stride, grad_up_row_stride, n_cols, alpha, limit,
        ACTIVATION=activation, IN_COL_STRIDE=_col_stride(gate), WRITE_VALUE=value is not None, BLOCK=block,
        COMPUTE_DTYPE=compute_dtype(gate.dtype), num_warps=num_warps,
    )


def halves(x: Tensor) -> tuple[Tensor, Tensor]:
    """The gate and up halves of a packed ``[..., 2d]`` tensor, as 2D row views."""
    x2 = rows(x)
    d = x2.shape[1] // 2
    return x2[:, :d], x2[:, d:]


def separate_impl(gate: Tensor, up: Tensor, activation: int) -> Tensor:
    """``act(gate) * up`` for two tensors of one shape."""
    out = gate.new_empty(gate.shape)
    if gate.numel():
        launch_fwd(rows(gate), rows(up), out, activation)
    return out


def _separate_backward(grad: Tensor, gate: Tensor, up: Tensor, activation: int,
                       value: Tensor | None) -> tuple[Tensor, Tensor]:
    grad_gate, grad_up = gate.new_empty(gate.shape), up.new_empty(up.shape)
    if gate.numel():
        n = gate.shape[-1]
        launch_bwd(rows(grad), rows(gate), rows(up), grad_gate, grad_up, n, n, activation, value=value)
    return grad_gate, grad_up


def separate_backward_impl(grad: Tensor, gate: Tensor, up: Tensor, activation: int) -> tuple[Tensor, Tensor]:
    return _separate_backward(grad, gate, up, activation, None)


def separate_backward_with_value_impl(grad: Tensor, gate: Tensor, up: Tensor, activation: int
                                      ) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`separate_backward_impl`'s gradients and ``act(gate) * up`` again (contiguous), from one kernel."""
    value = gate.new_empty(gate.shape)
    return (*_separate_backward(grad, gate, up, activation, value), value)


def packed_impl(x: Tensor, activation: int) -> Tensor:
    """``act(x[..., :d]) * x[..., d:]``."""
    out = x.new_empty((*x.shape[:-1], x.shape[-1] // 2))
    if x.numel():
        gate, up = halves(x)
        launch_fwd(gate, up, out, activation)
    return out


def _packed_backward(grad: Tensor, x: Tensor, activation: int, value: Tensor | None) -> Tensor:
    grad_x = x.new_empty(x.shape)
    if x.numel():
        gate, up = halves(x)
        grad_gate, grad_up = halves(grad_x)
        launch_bwd(rows(grad), gate, up, grad_gate, grad_up, x.shape[-1], x.shape[-1], activation, value=value)
    return grad_x


def packed_backward_impl(grad: Tensor, x: Tensor, activation: int) -> Tensor:
    return _packed_backward(grad, x, activation, None)


def packed_backward_with_value_impl(grad: Tensor, x: Tensor, activation: int) -> tuple[Tensor, Tensor]:
    """:func:`packed_backward_impl`'s gradient and ``act(x[..., :d]) * x[..., d:]`` again (contiguous), from one
    kernel."""
    value = x.new_empty((*x.shape[:-1], x.shape[-1] // 2))
    return _packed_backward(grad, x, activation, value), value


def interleaved_impl(x: Tensor, activation: int, alpha: float, limit: float) -> Tensor:
    """The gated activation of ``x[..., 0::2]`` (gate) and ``x[..., 1::2]`` (up)."""
    out = x.new_empty((*x.shape[:-1], x.shape[-1] // 2))
    if x.numel():
        x2 = rows(x)
        launch_fwd(x2[:, 0::2], x2[:, 1::2], out, activation, alpha, limit)
    return out


def interleaved_backward_impl(grad: Tensor, x: Tensor, activation: int, alpha: float, limit: float) -> Tensor:
    grad_x = x.new_empty(x.shape)
    if x.numel():
        x2, g2 = rows(x), rows(grad_x)
        launch_bwd(rows(grad), x2[:, 0::2], x2[:, 1::2], g2[:, 0::2], g2[:, 1::2], x.shape[-1], x.shape[-1],
                   activation, alpha, limit)
    return grad_x
