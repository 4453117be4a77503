"""The last step of a weight gradient that persistent programs accumulate: their ``[programs, n]`` partial sums
added up, in one kernel.

A norm's backward walks rows in a fixed number of programs, each keeping its share of the weight gradient,
and stores those shares. ``partial.sum(0).to(weight.dtype)`` was that step: under Inductor, a split reduction and
a cast, two kernels per norm call (66 a training step at Llama-3.2-1B). :func:`sum_partials` adds the shares in
one launch, each column block by one program, the rows in order (the same bits every run), accumulating in the
partials' dtype and rounding once to the gradient's.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._launch import cdiv
from ._library import wrap_triton

# Columns a program sums, and partial rows a loop step reads: a 64 x 64 tile, 16 KB of fp32 in flight.
_BLOCK = 64
_ROWS = 64


@triton.jit
def _sum_partials_kernel(partial_ptr, out_ptr, n_rows, n_cols, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    in_row = cols < n_cols
    acc = tl.zeros([BLOCK], dtype=partial_ptr.dtype.element_ty)
    for start in range(0, n_rows, ROWS):
        rows = start + tl.arange(0, ROWS)
        tile = tl.load(partial_ptr + rows[:, None].to(tl.int64) * n_cols + cols[None, :],
                       mask=(rows < n_rows)[:, None] & in_row[None, :], other=0.0)
        acc += tl.sum(tile, axis=0)
    tl.store(out_ptr + cols, acc.to(out_ptr.dtype.element_ty), mask=in_row)


def sum_partials(partial: Tensor, dtype: torch.dtype) -> Tensor:
    """``partial.sum(0).to(dtype)`` of a contiguous ``[programs, n]`` tensor of partial sums, in one kernel."""
    n_rows, n_cols = partial.shape
    out = torch.empty(n_cols, dtype=dtype, device=partial.device)
    if n_cols:
        wrap_triton(_sum_partials_kernel)[(cdiv(n_cols, _BLOCK),)](
            partial, out, n_rows, n_cols, ROWS=_ROWS, BLOCK=_BLOCK, num_warps=4,
        )
    return out
