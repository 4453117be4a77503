"""How far a kernel's result may be from PyTorch's, per dtype: the one table every check reads.

Used by verify mode (eager and compile), ``twinkle_fx check``, the benchmarks' correctness columns,
and the kernel and convergence tests. A kernel computes in fp32 (fp64 for fp64) and rounds once;
PyTorch's result rounds each intermediate in the input dtype. The values:

- bfloat16 and float16, ``atol = rtol = 2.5 eps`` (eps = 2^-7 for bf16, 2^-10 for fp16, rounded to
  2e-2 and 2.5e-3): a kernel's single rounding (eps/2) plus up to four roundings of the reference's
  intermediates (4 x eps/2) on the path of one element. It is within 25% of ``torch.testing``'s
  default rtol for bf16 (1.6e-2); a kernel that computes in the half dtype instead of fp32, or
  misses a term, is off by far more.
- float32, ``rtol = 1e-4`` (~840 eps): fp32 kernels only reduce in another order than PyTorch, and
  a reordered sum of n terms may differ by ~n eps of its terms' magnitude (n in the hundreds to
  thousands for a norm or a matmul row); ``atol = 1e-5`` is ``torch.testing``'s for fp32.
- float64: ``torch.testing``'s defaults (1e-7); the kernels compute fp64 inputs in fp64.

Whole models add up the differences of every layer:

- ``loss_rtol``, a model's loss after the same step(s) with and without kernels (the bench's loss
  check, the convergence tests): bf16/fp16 1e-2, the worst bf16 difference measured on an H100
  (Qwen2-0.5B first step, 4.4e-3 relative) with a margin of 2; fp32 1e-5, 10x the ~1e-6 of the
  tiny CPU runs (1e-7 measured over three steps of the convergence models).
- ``logits_rtol``, the relative L2 error of a model's logits (the inference bench): fp32 1e-3,
  bf16 3e-2, fp16 1e-2, a few roundings of the dtype per layer.

Comparisons against the fp64 truth (kernel tests, ``twinkle_fx check``) add the reference's own
error to the allowance: "no worse than PyTorch in this dtype, up to one tolerance". Per element, 2.5
bf16 eps (and atol 2e-2) leaves room for an error of a few percent spread over a whole tensor, so the
kernel tests also bound a bf16 / fp16 result's error norm by twice PyTorch's plus one rounding of the
dtype (``tests/kernels/kernel_test_utils.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Tolerance", "TOLERANCES", "tolerance"]


@dataclass(frozen=True)
class Tolerance:
    """Allowed differences in one dtype: ``|ours - reference| <= atol + rtol * |reference|`` per
    element, ``|loss - reference loss| <= loss_rtol * |reference loss|`` for a model's loss and
    ``||logits - reference|| <= logits_rtol * ||reference||`` for a model's logits."""

    atol: float
    rtol: float
    loss_rtol: float
    logits_rtol: float


TOLERANCES: dict[torch.dtype, Tolerance] = {
    torch.float64: Tolerance(atol=1e-7, rtol=1e-7, loss_rtol=1e-7, logits_rtol=1e-6),
    torch.float32: Tolerance(atol=1e-5, rtol=1e-4, loss_rtol=1e-5, logits_rtol=1e-3),
    torch.bfloat16: Tolerance(atol=2e-2, rtol=2e-2, loss_rtol=1e-2, logits_rtol=3e-2),
    torch.float16: Tolerance(atol=2.5e-3, rtol=2.5e-3, loss_rtol=1e-2, logits_rtol=1e-2),
}


def tolerance(dtype: torch.dtype) -> Tolerance:
    """The :class:`Tolerance` of ``dtype``; float32's for dtypes without their own (integers are
    compared exactly by :func:`twinkle_fx.core.numerics.compare`, fp8 results are upcast first).

    Examples:
        >>> tolerance(torch.bfloat16)
        Tolerance(atol=0.02, rtol=0.02, loss_rtol=0.01, logits_rtol=0.03)
    """
    return TOLERANCES.get(dtype, TOLERANCES[torch.float32])
