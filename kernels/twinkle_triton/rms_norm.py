"""RMSNorm and fused residual-add + RMSNorm with transformers' semantics.

``rms_norm(x, weight, eps)`` equals transformers' Qwen2/Llama/Mistral/Qwen3 RMSNorm::

    h = x.float(); h = h * rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)

(fp32 accumulation; the normalised row is rounded to x's dtype before the weight multiply, and the
result dtype is torch's promotion of weight and x). ``add_rms_norm(x, residual, weight, eps)``
returns ``(rms_norm(x + residual), x + residual)``, the decoder-layer pattern, in one pass.

Forward: one program per row, the whole row in one block. Backward recomputes 1/rms from the row
it loads anyway (saving nothing but the inputs) and accumulates the weight gradient per program
over a strided set of rows, so only ``programs x hidden`` partial sums reach the final sum (one kernel,
:mod:`._partial_sums`).
fp64 inputs are computed in fp64 (for gradcheck); the reference, like transformers, rounds them
through fp32.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._checks import check_tensors
from ._float_args import fp32
from ._launch import (accumulation_dtype, cdiv, compute_dtype, interpreting, persistent_programs, row_block, rows,
                      shared_memory_per_block)
from ._library import define_differentiable_op, wrap_triton
from ._partial_sums import sum_partials

# Backward tiling: a loop step of ROWS rows, its warps, programs per SM, and the loop's pipeline stages (see
# _bwd_tiling). The loop is software-pipelined (tl.range's num_stages): each tile's loads are asynchronous copies
# into shared memory issued STAGES - 1 tiles ahead, so one program an SM keeps the HBM busy while it reduces and
# stores the tile before. tools/rms_norm_bwd_sweep.py on an H200 (triton 3.6, bf16, the kernel and the partial
# weight-gradient sum by the profiler's device time, L2 flushed; docs/performance/rms-norm-bwd-h200.json), these
# against the sweep's best unpipelined tiling (1-2 programs an SM): 4096 rows of hidden 896 16.1 us against 18.6
# (17.5 against 19.6 with the sum's gradient), 2048 23.6 against 26.9 (28.2 / 30.5), 3072 30.5 / 38.6 (37.3 /
# 43.2), 4096 36.7 / 41.5 (44.3 / 48.1), 5120 46.3 / 59.7 (53.7 / 70.3), 8192 61.6 / 73.9 (78.6 / 85.6); 16384 x
# 4096 110.0 / 123.5 (139.9 / 150.1). Three stages, one program an SM, row_block's warps, a step of 8K elements and
# of at least 4 rows up to 16K elements: the sweep's best or within 4% at each of these.
BWD_TILE_ELEMENTS = 8192
BWD_MIN_ROWS = 4
BWD_MAX_TILE_ELEMENTS = 16384
BWD_STAGES = 3
BWD_PROGRAMS_PER_SM = 1
# shared memory a program keeps beside the pipeline's buffers (its reductions' scratch: up to 16 KB at 16 warps)
BWD_SHARED_RESERVE = 16384
# Short rows (BLOCK <= SHORT_ROW: the per-head q/k norms of Qwen3, OLMo 2 and Gemma 3, head_dim 64-256) are many:
# 131,072 rows of 128 in a Qwen3 step of 4 x 1024 tokens and 32 heads. One row a program (the forward) or eight rows a
# loop step (the backward's long-row tiling) left each program a few hundred bytes in flight, latency-bound; these
# take FWD_SHORT_ROW_ELEMENTS (forward) and BWD_SHORT_ROW_ELEMENTS (backward) elements a program or loop step.
# Kernel time on an H200 (bf16), one row a program / eight a step -> these: forward 81.1 -> 17.0 us at 131,072 x 128
# (Inductor's 17.3), 11.3 -> 2.5 at 16,384 x 128, 40.9 -> 3.9 at 65,536 x 64. The backward, with its weight
# gradient's partial sums (a one-off probe, since deleted: profiler device time, L2 flushed, H200, triton 3.6): 4
# warps, 8 programs an SM, its weight gradient summed over each tile's rows as it went, no pipeline: 52.8 + 18.2 us
# (the partial sums of 1,056 programs) at 131,072 x 128, 8.9 + 6.8 at 16,384 x 128; summed once at the end
# (TILE_SUMS) with 8 warps, 2 programs an SM and 3 stages, the best of 36 tilings there: 31.0 + 4.3 and 8.7 + 4.4
# (Inductor's code for the same backward: 29.8 + 6.5, and about 12 in all at 16,384 x 128).
SHORT_ROW = 512
FWD_SHORT_ROW_ELEMENTS = 2048
BWD_SHORT_ROW_ELEMENTS = 4096
BWD_SHORT_ROW_ELEMENTS_PER_WARP = 512
BWD_SHORT_ROW_PROGRAMS_PER_SM = 2


@triton.jit
def _rms_norm_fwd_kernel(
    x_ptr, residual_ptr, weight_ptr, out_ptr, sum_ptr,
    x_row_stride, residual_row_stride, weight_stride, n_rows, n_cols, eps,
    HAS_RESIDUAL: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr, COMPUTE_DTYPE: tl.constexpr,
):
    eps = fp32(eps)
    row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)[:, None]
    cols = tl.arange(0, BLOCK)[None, :]
    mask = (row < n_rows) & (cols < n_cols)
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * residual_row_stride + cols, mask=mask, other=0.0)
        # Rounded to the input dtype like transformers' `residual + hidden_states`.
        x = (x.to(COMPUTE_DTYPE) + r.to(COMPUTE_DTYPE)).to(x_ptr.dtype.element_ty)
        tl.store(sum_ptr + row * n_cols + cols, x, mask=mask)
    h = x.to(COMPUTE_DTYPE)
    rstd = 1.0 / tl.sqrt(tl.sum(h * h, axis=1, keep_dims=True) / n_cols + eps)
    normed = (h * rstd).to(x_ptr.dtype.element_ty).to(COMPUTE_DTYPE)
    w = tl.load(weight_ptr + cols * weight_stride, mask=cols < n_cols, other=0.0).to(COMPUTE_DTYPE)
    tl.store(out_ptr + row * n_cols + cols, (w * normed).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rms_norm_bwd_kernel(
    grad_ptr, grad_sum_ptr, x_ptr, weight_ptr, grad_x_ptr, grad_weight_partial_ptr,
    grad_row_stride, grad_sum_row_stride, x_row_stride, weight_stride, n_rows, n_cols, eps,
    HAS_GRAD_SUM: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr, COMPUTE_DTYPE: tl.constexpr,
    STAGES: tl.constexpr, TILE_SUMS: tl.constexpr,
):
    eps = fp32(eps)
    # Persistent: each program walks tiles of ROWS rows (strided by the grid) and keeps its share
    # of the weight gradient in registers: summed over each tile's rows as it goes, or, with TILE_SUMS,
    # as a whole tile of sums reduced over its rows once at the end (short rows, whose tile spans the
    # warps: a sum across them each step would wait on the others). With STAGES > 1 the loop is
    # pipelined: the loads of the next STAGES - 1 tiles are in flight while this one is reduced and stored.
    # int64 row indices: row * stride overflows int32 past 2**31 elements.
    pid = tl.program_id(0).to(tl.int64)
    n_programs = tl.num_programs(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)[None, :]
    col_mask = cols < n_cols
    w = tl.load(weight_ptr + cols * weight_stride, mask=col_mask, other=0.0).to(COMPUTE_DTYPE)
    grad_weight = tl.zeros([ROWS if TILE_SUMS else 1, BLOCK], dtype=COMPUTE_DTYPE)
    for start in tl.range(pid * ROWS, n_rows, n_programs * ROWS, num_stages=STAGES):
        row = start + tl.arange(0, ROWS)[:, None]
        mask = (row < n_rows) & col_mask
        x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0)
        g = tl.load(grad_ptr + row * grad_row_stride + cols, mask=mask, other=0.0).to(COMPUTE_DTYPE)
        if HAS_GRAD_SUM:
            grad_sum = tl.load(grad_sum_ptr + row * grad_sum_row_stride + cols, mask=mask, other=0.0)
        h = x.to(COMPUTE_DTYPE)
        rstd = 1.0 / tl.sqrt(tl.sum(h * h, axis=1, keep_dims=True) / n_cols + eps)
        x_hat = h * rstd
        product = g * x_hat.to(x_ptr.dtype.element_ty).to(COMPUTE_DTYPE)
        if TILE_SUMS:
            grad_weight += product
        else:
            grad_weight += tl.sum(product, axis=0, keep_dims=True)
        grad_normed = g * w
        grad_x = rstd * (grad_normed - x_hat * (tl.sum(grad_normed * x_hat, axis=1, keep_dims=True) / n_cols))
        if HAS_GRAD_SUM:
            grad_x += grad_sum.to(COMPUTE_DTYPE)
        tl.store(grad_x_ptr + row * n_cols + cols, grad_x.to(grad_x_ptr.dtype.element_ty), mask=mask)
    tl.store(grad_weight_partial_ptr + pid * n_cols + tl.arange(0, BLOCK), tl.sum(grad_weight, axis=0),
             mask=tl.arange(0, BLOCK) < n_cols)


def _out_dtype(x: Tensor, weight: Tensor) -> torch.dtype:
    return torch.promote_types(weight.dtype, x.dtype)


def _launch_fwd(x: Tensor, residual: Tensor | None, weight: Tensor, eps: float, op: str):
    out = torch.empty(x.shape, dtype=_out_dtype(x, weight), device=x.device)
    summed = torch.empty_like(x, memory_format=torch.contiguous_format) if residual is not None else None
    x2 = rows(x)
    if x2.shape[0] == 0:
        return out, summed
    residual2 = rows(residual) if residual is not None else x2
    block, num_warps = row_block(x2.shape[1], op=op)
    rows_per_program = max(1, FWD_SHORT_ROW_ELEMENTS // block) if block <= SHORT_ROW else 1
    # Without a residual, sum_ptr gets a tensor the kernel only reads (never an output twice:
    # the traced launch clones each written argument on its own).
    wrap_triton(_rms_norm_fwd_kernel)[(cdiv(x2.shape[0], rows_per_program),)](
        x2, residual2, weight, out, summed if summed is not None else x2,
        x2.stride(0), residual2.stride(0), weight.stride(0), x2.shape[0], x2.shape[1], eps,
        HAS_RESIDUAL=residual is not None, ROWS=rows_per_program, BLOCK=block, COMPUTE_DTYPE=compute_dtype(x.dtype),
        num_warps=num_warps,
    )
    return out, summed


def _short_rows(block: int) -> bool:
    """Whether the backward takes rows of ``block`` columns as short ones (SHORT_ROW): many rows a loop step, the
    weight gradient's sums kept as a tile (TILE_SUMS)."""
    return block <= SHORT_ROW and bool(BWD_SHORT_ROW_ELEMENTS)


def _bwd_tiling(n_cols: int, has_grad_sum: bool, op: str, element_size: int,
                device: torch.device) -> tuple[int, int, int, int, int]:
    """(BLOCK, ROWS, num_warps, programs per SM, pipeline stages) of the backward kernel (the sweeps are above
    BWD_TILE_ELEMENTS and SHORT_ROW): as many stages, up to BWD_STAGES, as the tiles of the tensors the kernel
    reads (grad, x and the sum's gradient, ``element_size`` bytes an element) fit in ``device``'s shared memory."""
    block, num_warps = row_block(n_cols, op=op)
    if _short_rows(block):
        rows_per_tile = BWD_SHORT_ROW_ELEMENTS // block
        num_warps = max(num_warps, rows_per_tile * block // BWD_SHORT_ROW_ELEMENTS_PER_WARP)
        per_sm = BWD_SHORT_ROW_PROGRAMS_PER_SM
    else:
        rows_per_tile = max(1, BWD_TILE_ELEMENTS // block, min(BWD_MIN_ROWS, BWD_MAX_TILE_ELEMENTS // block))
        per_sm = BWD_PROGRAMS_PER_SM
    stages = 1
    if not interpreting():
        buffer = rows_per_tile * block * element_size * (3 if has_grad_sum else 2)
        stages = max(1, min(BWD_STAGES, 1 + (shared_memory_per_block(device) - BWD_SHARED_RESERVE) // buffer))
    return block, rows_per_tile, num_warps, per_sm, stages


def _launch_bwd(grad: Tensor, grad_sum: Tensor | None, x: Tensor, weight: Tensor, eps: float, op: str):
    grad_x = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    x2, grad2 = rows(x), rows(grad)
    n_rows, n_cols = x2.shape
    if n_rows == 0:
        return grad_x, torch.zeros_like(weight)
    grad_sum2 = rows(grad_sum) if grad_sum is not None else grad2
    block, rows_per_tile, num_warps, per_sm, stages = _bwd_tiling(
        n_cols, grad_sum is not None, op, max(x.element_size(), grad.element_size()), x.device)
    programs = persistent_programs(cdiv(n_rows, rows_per_tile), x.device, per_sm=per_sm)
    acc = accumulation_dtype(x.dtype)
    partial = torch.empty((programs, n_cols), dtype=acc, device=x.device)
    wrap_triton(_rms_norm_bwd_kernel)[(programs,)](
        grad2, grad_sum2, x2, weight, grad_x, partial,
        grad2.stride(0), grad_sum2.stride(0), x2.stride(0), weight.stride(0), n_rows, n_cols, eps,
        HAS_GRAD_SUM=grad_sum is not None, ROWS=rows_per_tile, BLOCK=block, COMPUTE_DTYPE=compute_dtype(x.dtype),
        STAGES=stages, TILE_SUMS=_short_rows(block), num_warps=num_warps,
    )
    return grad_x, sum_partials(partial, weight.dtype)


def _check(op: str, x: Tensor, weight: Tensor, residual: Tensor | None = None) -> None:
    check_tensors(op, min_dim=1, x=x, residual=residual, weight=weight)
    if weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
        raise ValueError(
            f"{op}: weight has shape {tuple(weight.shape)} but x's last dimension is {x.shape[-1]}; "
            f"pass a 1-D weight of size {x.shape[-1]}."
        )
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(
            f"{op}: residual is {tuple(residual.shape)} {residual.dtype} but x is "
            f"{tuple(x.shape)} {x.dtype}; pass a residual of x's shape and dtype."
        )


# ----------------------------------------------------------------------------- rms_norm


def _rms_norm_impl(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return _launch_fwd(x, None, weight, eps, "rms_norm")[0]


def _rms_norm_fake(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return x.new_empty(x.shape, dtype=_out_dtype(x, weight))


def _rms_norm_backward_impl(grad: Tensor, x: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    return _launch_bwd(grad, None, x, weight, eps, "rms_norm")


def _rms_norm_backward_fake(grad: Tensor, x: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    return torch.empty_like(x, memory_format=torch.contiguous_format), torch.empty_like(weight)


_rms_norm_op = define_differentiable_op(
    "rms_norm", _rms_norm_impl, fake=_rms_norm_fake,
    backward=_rms_norm_backward_impl, backward_fake=_rms_norm_backward_fake, saved=("x", "weight", "eps"),
    reference=lambda *args: rms_norm_reference(*args),  # defined below
)


def rms_norm(x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    """RMSNorm over the last dimension, exactly as transformers' ``Qwen2RMSNorm.forward``.

    Args:
        x (`torch.Tensor`): input ``[..., hidden]``, any float dtype; rows may be strided.
        weight (`torch.Tensor`): ``[hidden]`` scale.
        eps (`float`, defaults to 1e-6): added to the mean square.

    Returns:
        `torch.Tensor`: contiguous ``[..., hidden]`` in ``torch.promote_types(weight.dtype, x.dtype)``.

    Raises:
        TypeError: a tensor argument is not a floating-point tensor (the error names it).
        ValueError: x is 0-D, weight's shape does not match x's last dimension, hidden > 65536, or
            tensors on two devices.

    Example:
        ```python
        y = rms_norm(torch.randn(2, 8, 64), torch.ones(64), eps=1e-6)
        ```
    """
    _check("rms_norm", x, weight)
    return _rms_norm_op(x, weight, float(eps))


def rms_norm_reference(x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    """Plain PyTorch ``rms_norm`` (transformers' Qwen2RMSNorm.forward)."""
    input_dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(input_dtype)


# ----------------------------------------------------------------------------- add_rms_norm


def _add_rms_norm_impl(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    return _launch_fwd(x, residual, weight, eps, "add_rms_norm")


def _add_rms_norm_fake(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    return x.new_empty(x.shape, dtype=_out_dtype(x, weight)), x.new_empty(x.shape)


def _add_rms_norm_backward_impl(
    grad_normed: Tensor, grad_sum: Tensor, summed: Tensor, weight: Tensor, eps: float
) -> tuple[Tensor, Tensor]:
    return _launch_bwd(grad_normed, grad_sum, summed, weight, eps, "add_rms_norm")


def _add_rms_norm_backward_fake(
    grad_normed: Tensor, grad_sum: Tensor, summed: Tensor, weight: Tensor, eps: float
) -> tuple[Tensor, Tensor]:
    return torch.empty_like(summed, memory_format=torch.contiguous_format), torch.empty_like(weight)


_add_rms_norm_op = define_differentiable_op(
    "add_rms_norm", _add_rms_norm_impl, fake=_add_rms_norm_fake,
    backward=_add_rms_norm_backward_impl, backward_fake=_add_rms_norm_backward_fake,
    saved=("output[1]", "weight", "eps"),  # the sum x + residual, the norm's input
    # d(x + residual)/dx = d(x + residual)/d(residual) = identity: both get the same gradient.
    gradients=lambda grads, _: (grads[0], grads[0], grads[1], None),
    reference=lambda *args: add_rms_norm_reference(*args),  # defined below
)


def add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float = 1e-6) -> tuple[Tensor, Tensor]:
    """Residual add fused with RMSNorm: ``(rms_norm(x + residual, weight, eps), x + residual)``.

    The sum is rounded to x's dtype before normalising, like transformers' decoder layers.

    Args:
        x (`torch.Tensor`): ``[..., hidden]``.
        residual (`torch.Tensor`): same shape and dtype as ``x``.
        weight (`torch.Tensor`): ``[hidden]``.
        eps (`float`, defaults to 1e-6).

    Returns:
        `tuple[torch.Tensor, torch.Tensor]`: the normalised sum and the sum (the next residual).

    Example:
        ```python
        normed, residual = add_rms_norm(attn_out, residual, norm.weight, norm.variance_epsilon)
        ```
    """
    _check("add_rms_norm", x, weight, residual)
    return _add_rms_norm_op(x, residual, weight, float(eps))


def add_rms_norm_reference(x: Tensor, residual: Tensor, weight: Tensor, eps: float = 1e-6) -> tuple[Tensor, Tensor]:
    """Plain PyTorch ``add_rms_norm``."""
    summed = x + residual
    return rms_norm_reference(summed, weight, eps), summed
