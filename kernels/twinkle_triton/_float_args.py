"""Float arguments of a kernel as fp32, however the launch typed them.

Triton's own launch types a Python float argument fp32. Inductor, launching the same kernel from a compiled
graph, types it fp64, to keep the float's precision. Arithmetic between an fp32 block and an fp64 scalar is
fp64, so a norm's ``eps`` would make the whole row's arithmetic fp64 there: twice the registers, spills, and on
an H200 a kernel 1.6x to 20x slower under torch.compile than launched eagerly. Each kernel converts its float
arguments with :func:`fp32` before using them, so both launches compile the same arithmetic (the kernels
compute in fp32 whatever their inputs' dtype).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def fp32(value):
    """``value`` (a float argument, fp32 or fp64) as an fp32 scalar."""
    return tl.cast(value, tl.float32)
