"""GPT-OSS's clamped SwiGLU: ``clamped_swiglu(x, alpha, limit)`` over interleaved gate / up columns.

GPT-OSS's experts project each token to ``[..., 2d]`` with gate and up interleaved
(``gate = x[..., 0::2]``, ``up = x[..., 1::2]``) and compute, with ``g = min(gate, limit)``::

    (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g)

(``GptOssExperts._apply_gate`` in transformers; ``alpha`` 1.702 and ``limit`` 7.0 in the published
configs). PyTorch runs that as two strided slices, two clamps, a multiply, a sigmoid, two more
multiplies and an add, each a launch and a pass over memory in training; here it is one kernel
forward and one backward, computed in fp32 (fp64 for fp64) and rounded once.

Backward, with s = sigmoid(alpha * g): d/dgate = grad * (clamp(up) + 1) * s * (1 + alpha * g * (1 - s))
where gate <= limit, d/dup = grad * g * s where -limit <= up <= limit, and zero where a clamp bites
(the bounds themselves pass, as with ``torch.clamp``). The kernels are :mod:`._gated`'s (shared with
SwiGLU and GeGLU), reading the interleaved columns at stride 2.
"""

import torch
from torch import Tensor

from ._gated import CLAMPED_SWIGLU, interleaved_backward_impl, interleaved_impl
from ._checks import check_tensors
from ._library import define_differentiable_op


def _clamped_swiglu_impl(x: Tensor, alpha: float, limit: float) -> Tensor:
    return interleaved_impl(x, CLAMPED_SWIGLU, alpha, limit)


def _clamped_swiglu_fake(x: Tensor, alpha: float, limit: float) -> Tensor:
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))


def _clamped_swiglu_backward_impl(grad: Tensor, x: Tensor, alpha: float, limit: float) -> Tensor:
    return interleaved_backward_impl(grad, x, CLAMPED_SWIGLU, alpha, limit)


def _clamped_swiglu_backward_fake(grad: Tensor, x: Tensor, alpha: float, limit: float) -> Tensor:
    return x.new_empty(x.shape)


_clamped_swiglu_op = define_differentiable_op(
    "clamped_swiglu", _clamped_swiglu_impl, fake=_clamped_swiglu_fake,
    backward=_clamped_swiglu_backward_impl, backward_fake=_clamped_swiglu_backward_fake,
    saved=("x", "alpha", "limit"),
    reference=lambda *args: clamped_swiglu_reference(*args),  # defined below
)


def clamped_swiglu(x: Tensor, alpha: float, limit: float) -> Tensor:
    """GPT-OSS's gated activation of interleaved ``[g0, u0, g1, u1, ...]`` columns (see the module docstring).

    Args:
        x (`torch.Tensor`): ``[..., 2d]``, gate at even and up at odd positions of the last dimension;
            rows may be strided.
        alpha (`float`): the sigmoid's scale (GPT-OSS config ``swiglu_alpha``, 1.702).
        limit (`float`): the clamp bound (``swiglu_limit``, 7.0); gate is clamped above, up both sides.

    Returns:
        `torch.Tensor`: contiguous ``[..., d]`` in x's dtype.

    Raises:
        TypeError: a tensor argument is not a floating-point tensor (the error names it).
        ValueError: the last dimension is odd, or ``limit`` is not positive.

    Example:
        ```python
        h = clamped_swiglu(hidden @ expert.gate_up_proj[e] + expert.gate_up_proj_bias[e], 1.702, 7.0)
        ```
    """
    check_tensors("clamped_swiglu", min_dim=1, x=x)
    if x.dim() == 0 or x.shape[-1] % 2:
        raise ValueError(f"clamped_swiglu: x has shape {tuple(x.shape)}; its last dimension must be even "
                         "(interleaved gate and up columns).")
    if not limit > 0:
        raise ValueError(f"clamped_swiglu: limit={limit!r}; pass a positive clamp bound (GPT-OSS uses 7.0).")
    return _clamped_swiglu_op(x, float(alpha), float(limit))


def clamped_swiglu_reference(x: Tensor, alpha: float, limit: float) -> Tensor:
    """Plain PyTorch ``clamped_swiglu`` (transformers' ``GptOssExperts._apply_gate``)."""
    gate, up = x[..., ::2], x[..., 1::2]
    gate = gate.clamp(min=None, max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))
