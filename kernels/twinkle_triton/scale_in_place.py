"""``scale_in_place(out, scale)``: ``out *= scale``, the scale read on the device, nothing touched when it is 1.

A gradient computed before the backward runs is scaled there by the loss's gradient: the fused loss computes the
LM head's weight gradient in the forward and saves it, and the backward multiplies it by the gradient the loss
receives. That is a pass over the whole gradient (an untied head's 151,936 x 2048 bf16 gradient: 1.2 GB read and
written, 0.29 ms of a training step on an H200) which changes nothing when the loss is backpropagated as it is,
with a gradient of 1. This op reads the scale on the device (no host synchronisation), and its programs return at
once when it is 1; any other scale (a loss divided for gradient accumulation, a scaled fp16 loss, a nan) multiplies
every element in the compute dtype (fp32; fp64 for fp64) rounded once, as ``out * scale`` computes it.

The backend's ``scaled_gradient`` rewrite (``twinkle_fx.compiler.inner.scaled_gradient``) puts it where a backward
graph returns such a product of a saved tensor it owns.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._checks import check_tensors
from ._launch import cdiv, compute_dtype, loop_block, persistent_programs
from ._library import define_op, wrap_triton

# The launch: programs that loop over blocks of the flat elements. With a scale of 1 each program reads it and
# returns, so the launch costs its programs: a few an SM. With another scale the pass is memory-bound and needs
# megabytes of loads in flight to reach the HBM's rate: 8 programs an SM (64 warps, an H100's whole occupancy) of 4096
# elements a step put 8 MB in flight on 132 SMs in bf16. (A one-element-block elementwise launch, 1024 elements, would
# need hundreds of thousands of programs for an LM head's gradient, each reading the scale.) Timed on an H200
# (triton.testing.do_bench, a 151,936 x 2048 bf16 gradient): 4.6 us at a scale of 1; 335 us at 0.25, 3.7 TB/s of reads
# and writes, where torch's eager ``out.mul_(scale)`` of a 0-dim fp32 scale took 1140 us.
_PROGRAMS_PER_SM = 8
_BLOCK, _WARPS = 4096, 8


@triton.jit
def _scale_in_place_kernel(out_ptr, scale_ptr, n, BLOCK: tl.constexpr, COMPUTE_DTYPE: tl.constexpr):
    # out[i] *= scale over blocks p, p + P, ... of the flat elements; nothing read or written when scale is 1
    scale = tl.load(scale_ptr).to(COMPUTE_DTYPE)
    if scale != 1.0:
        lanes = tl.arange(0, BLOCK)
        for start in tl.range(tl.program_id(0).to(tl.int64) * BLOCK, n, tl.num_programs(0) * BLOCK):
            offsets = start + lanes
            mask = offsets < n
            x = tl.load(out_ptr + offsets, mask=mask).to(COMPUTE_DTYPE)
            tl.store(out_ptr + offsets, (x * scale).to(out_ptr.dtype.element_ty), mask=mask)


def _scale_in_place_impl(out: Tensor, scale: Tensor) -> None:
    n = out.numel()
    if n == 0:
        return
    if not out.is_contiguous():  # a copy would be scaled in out's place
        raise ValueError(f"scale_in_place: out has strides {tuple(out.stride())}; pass a contiguous tensor.")
    block = loop_block(n, _BLOCK)
    programs = persistent_programs(cdiv(n, block), out.device, per_sm=_PROGRAMS_PER_SM)
    wrap_triton(_scale_in_place_kernel)[(programs,)](out, scale, n, BLOCK=block,
                                                     COMPUTE_DTYPE=compute_dtype(out.dtype), num_warps=_WARPS)


def _scale_in_place_fake(out: Tensor, scale: Tensor) -> None:
    return None


# Opaque to Inductor: the backend inserts it into backward graphs after AOTAutograd, like add_embedding_grad.
_scale_in_place_op = define_op(
    "scale_in_place", _scale_in_place_impl, fake=_scale_in_place_fake, mutates_args=("out",), inline_kernels=False,
    reference=lambda *args: scale_in_place_reference(*args),  # defined below
)


def scale_in_place(out: Tensor, scale: Tensor) -> None:
    """In place, ``out = out * scale``, with ``scale`` read on the device: when it is 1 nothing is read or written.

    Each element is computed in fp32 (fp64 for fp64) and rounded once, as ``out * scale`` is; a scale of 1 leaves
    every bit as it was.

    Args:
        out (`torch.Tensor`): floating, contiguous; updated in place.
        scale (`torch.Tensor`): a one-element floating tensor on ``out``'s device.

    Raises:
        TypeError: a tensor that is not floating point (the error names it).
        ValueError: a strided ``out``, a scale of more than one element, or tensors on different devices.

    Example:
        ```python
        scale_in_place(head_grad, grad_loss)   # head_grad * grad_loss, without a pass when grad_loss is 1
        ```
    """
    check_tensors("scale_in_place", min_dim=0, out=out, scale=scale)
    if not out.is_contiguous() or scale.numel() != 1:
        raise ValueError(f"scale_in_place: out {tuple(out.shape)} (strides {tuple(out.stride())}) and scale "
                         f"{tuple(scale.shape)} do not fit; pass a contiguous out and a one-element scale.")
    _scale_in_place_op(out, scale)


def scale_in_place_reference(out: Tensor, scale: Tensor) -> None:
    """Plain PyTorch ``scale_in_place`` (every element), the kernel's arithmetic: both in the compute dtype."""
    compute = torch.float64 if out.dtype == torch.float64 else torch.float32
    out.copy_(out.to(compute) * scale.to(compute).reshape(()))
