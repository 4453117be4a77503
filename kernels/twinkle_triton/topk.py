"""``topk(x, k)``: the ``k`` largest values of each row of ``x`` along its last dimension, and their indices, in one
kernel.

A mixture-of-experts router picks each token's experts with ``torch.topk`` over its scores, a row of 8 to a few
hundred experts. torch runs that as a radix selection and a sort, two kernels, 32.9 us a call for 4096 tokens of 128
experts (Qwen3-30B-A3B's router) replayed in a CUDA graph on an H200, which Inductor leaves as they are (it has no
lowering for topk). Here one program holds a few rows in registers and takes the largest remaining value of each row
``k`` times: 6.7 us there.

The order is ``torch.topk``'s (``largest=True, sorted=True``): values descending, a nan above every number (torch
orders nans as the largest); among equal values the lower index first (torch's CUDA kernel does not say which). The
values are the input's, in its dtype; the indices int64. The gradient of the values goes to the chosen positions,
as torch's.

The backend's ``topk`` rewrite (``twinkle_fx.compiler.inner.topk``) puts it in place of such a ``torch.topk`` in the
graphs it compiles.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._checks import check_tensors
from ._launch import cdiv, interpreting, next_power_of_2
from ._library import define_differentiable_op, wrap_triton

__all__ = ["DTYPES", "MAX_K", "MAX_ROW", "topk", "topk_reference"]

MAX_ROW = 1024  # the longest row a program holds in registers (its block of rows shrinks as rows grow)
MAX_K = 32  # the k the kernel unrolls its selection for
DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # exact in the kernel's fp32 comparisons
# The launch: each program's k selections are a chain of reductions over its rows, so small programs, many at once,
# and reductions within one or two warps. Graph-replayed on an H200, us a call for 4096 rows (k, warps), elements a
# program 4096 / 512 / 256: rows of 128 (8; 4 warps) 15.6 / 7.0 / 15.3, (2 warps) 38.3 / 7.7 / 6.7; rows of 256 (8; 1
# warp) 83.8 / 15.2 / 12.7, (4 warps) 19.8 / 18.8 / 28.3; rows of 8 (2; 2 warps) 19.4 / 4.1 / 2.3. torch.topk: 32.9,
# 56.9 and 15.3 us. (Timed with each value taken from the row in registers; it is read back from memory since, one
# load a selection, to keep its bits: not timed again.)
_ELEMENTS = 256


@triton.jit
def _topk_kernel(x_ptr, values_ptr, indices_ptr, rows, n, sx, K: tl.constexpr, BLOCK_R: tl.constexpr,
                 BLOCK_N: tl.constexpr):
    """Rows ``BLOCK_R`` at a time, each whole in registers: K times the largest value still in the row (a nan
    first), the lowest index among equal ones, then that position taken out."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    r_mask = r < rows
    cols = tl.arange(0, BLOCK_N)
    live = r_mask[:, None] & (cols < n)[None, :]
    x = tl.load(x_ptr + r[:, None].to(tl.int64) * sx + cols[None, :], mask=live, other=0.0)
    key = x.to(tl.float32)  # exact for the dtypes taken
    nan = key != key
    out = r.to(tl.int64) * K
    for j in tl.static_range(K):
        nans = live & nan
        nan_index = tl.min(tl.where(nans, cols[None, :], BLOCK_N), axis=1)
        numbers = live & ~nan
        largest = tl.max(tl.where(numbers, key, float("-inf")), axis=1)
        index = tl.min(tl.where(numbers & (key == largest[:, None]), cols[None, :], BLOCK_N), axis=1)
        index = tl.where(nan_index < BLOCK_N, nan_index, index)
        chosen = live & (cols[None, :] == index[:, None])
        # the chosen element read again: its bits (a -0's sign, a nan's payload), which a sum over its row loses
        value = tl.load(x_ptr + r.to(tl.int64) * sx + index, mask=r_mask)
        tl.store(values_ptr + out + j, value, mask=r_mask)
        tl.store(indices_ptr + out + j, index.to(tl.int64), mask=r_mask)
        live = live & ~chosen


def _topk_impl(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    n = x.shape[-1]
    rows = x.reshape(-1, n)
    if rows.shape[0] and rows.stride(-1) != 1:
        rows = rows.contiguous()
    values = x.new_empty((*x.shape[:-1], k))
    indices = torch.empty((*x.shape[:-1], k), dtype=torch.int64, device=x.device)
    if rows.shape[0] and k:
        block_n = next_power_of_2(n)
        block_r = max(1, min(_ELEMENTS // block_n, next_power_of_2(rows.shape[0])))
        if interpreting():
            block_r = max(block_r, min(64, next_power_of_2(rows.shape[0])))
        wrap_triton(_topk_kernel)[(cdiv(rows.shape[0], block_r),)](
            rows, values, indices, rows.shape[0], n, rows.stride(0), K=k, BLOCK_R=block_r, BLOCK_N=block_n,
            num_warps=2 if block_n < 256 else 1,
        )
    return values, indices


def _topk_fake(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    shape = (*x.shape[:-1], k)
    return x.new_empty(shape), x.new_empty(shape, dtype=torch.int64)


def _topk_backward_impl(grad: Tensor, x: Tensor, indices: Tensor) -> Tensor:
    # the values' gradient to the positions they came from (torch's topk backward); no kernel of its own
    return torch.zeros_like(x).scatter_(-1, indices, grad)


def _topk_backward_fake(grad: Tensor, x: Tensor, indices: Tensor) -> Tensor:
    return torch.empty_like(x)


_topk_op = define_differentiable_op(
    "topk", _topk_impl, fake=_topk_fake, backward=_topk_backward_impl, backward_fake=_topk_backward_fake,
    saved=("x", "output[1]"), non_differentiable=("output[1]",),
    # opaque to Inductor: the backend puts it in graphs after AOTAutograd, in place of an aten.topk Inductor runs
    # as torch's kernels anyway
    inline_kernels=False,
    reference=lambda x, k: topk_reference(x, k),  # defined below
)


def topk(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """``torch.topk(x, k)`` along the last dimension (largest, sorted) in one kernel: (values, int64 indices), each
    ``[..., k]``; among equal values the lower index first, a nan above every number.

    Args:
        x (`torch.Tensor`): float16, bfloat16 or float32, rows of at most ``MAX_ROW`` (1024) along the last
            dimension; any strides.
        k (`int`): 0 to ``min(MAX_K, x.shape[-1])`` (``MAX_K`` is 32).

    Returns:
        `tuple[torch.Tensor, torch.Tensor]`: the values, in ``x``'s dtype, and their indices.

    Raises:
        TypeError: ``x`` of another dtype.
        ValueError: a 0-dimensional ``x``, a row longer than ``MAX_ROW`` or ``k`` out of range.

    Example:
        ```python
        weights, experts = topk(router_probs, 8)   # as torch.topk(router_probs, 8)
        ```
    """
    check_tensors("topk", min_dim=1, x=x)
    if x.dtype not in DTYPES:
        raise TypeError(f"topk: x is {x.dtype}; pass float16, bfloat16 or float32 (torch.topk takes {x.dtype}).")
    if x.shape[-1] > MAX_ROW:
        raise ValueError(f"topk: x is {tuple(x.shape)}; pass rows of at most {MAX_ROW} along the last dimension "
                         "(torch.topk takes longer ones).")
    if not 0 <= k <= min(MAX_K, x.shape[-1]):
        raise ValueError(f"topk: k={k} for rows of {x.shape[-1]}; pass 0 <= k <= {min(MAX_K, x.shape[-1])} "
                         f"(torch.topk takes a k above {MAX_K}).")
    return _topk_op(x, k)


def topk_reference(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Plain PyTorch ``topk``: ``torch.topk`` along the last dimension, equal values ordered by index (a stable
    sort of the values, nans first)."""
    order = torch.sort(x, dim=-1, descending=True, stable=True).indices[..., :k]
    return x.gather(-1, order), order
