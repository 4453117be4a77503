"""Norms computed entirely in fp32 and rounded once: ``rms_norm_fp32`` and ``layer_norm``.

transformers' Llama-style RMSNorm rounds the normalised row to the input dtype *before* the weight
multiply (``weight * h.to(input_dtype)``: :func:`twinkle_triton.rms_norm`). Other families scale
in fp32 and round after, and return the input dtype whatever the weight's dtype::

    # Gemma 1/2/3 (offset=1.0; the weight is stored as w - 1):
    out = norm(x.float()) * (1.0 + weight.float());  out.type_as(x)
    # OLMo2, GPT-OSS (offset=0.0):
    out = (weight * norm(x.float())).to(x.dtype)
    # Cohere's LayerNorm (mean-centred, no bias), and nn.LayerNorm semantics with a bias:
    out = (weight.float() * (x - mean) * rsqrt(var + eps) [+ bias]).to(x.dtype)

``rms_norm_fp32(x, weight, eps, offset)`` and ``layer_norm(x, weight, bias, eps)`` compute exactly
that: the statistics, the scale and the bias in fp32 (fp64 for fp64), one rounding to x's dtype.
Swapping the Llama kernel in for these would change numbers (Gemma) or the output dtype (OLMo2 with
fp32 weights and bf16 activations returns bf16, the Llama formula fp32).

Forward: one program per row, the whole row in one block. Backward: a fixed number of programs
walk the rows (strided), recompute the statistics from the row they load anyway, write the input
gradient and keep their share of the weight (and bias) gradient in registers; one kernel sums the
``programs x hidden`` partials (:mod:`._partial_sums`).
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._checks import check_tensors
from ._float_args import fp32
from ._launch import accumulation_dtype, compute_dtype, persistent_programs, row_block, rows
from ._library import define_differentiable_op, wrap_triton
from ._partial_sums import sum_partials


@triton.jit
def _fp32_norm_fwd_kernel(
    x_ptr, weight_ptr, bias_ptr, out_ptr, x_row_stride, weight_stride, bias_stride, n_cols, eps, offset,
    CENTER: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr, COMPUTE_DTYPE: tl.constexpr,
):
    eps, offset = fp32(eps), fp32(offset)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    h = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    if CENTER:
        h = tl.where(mask, h - tl.sum(h, axis=0) / n_cols, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(h * h, axis=0) / n_cols + eps)
    w = tl.load(weight_ptr + cols * weight_stride, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    out = h * rstd * (offset + w)
    if HAS_BIAS:
        out += tl.load(bias_ptr + cols * bias_stride, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    tl.store(out_ptr + row * n_cols + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _fp32_norm_bwd_kernel(
    grad_ptr, x_ptr, weight_ptr, grad_x_ptr, grad_weight_partial_ptr, grad_bias_partial_ptr,
    grad_row_stride, x_row_stride, weight_stride, n_rows, n_cols, eps, offset,
    CENTER: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr, COMPUTE_DTYPE: tl.constexpr,
):
    eps, offset = fp32(eps), fp32(offset)
    pid = tl.program_id(0).to(tl.int64)
    n_programs = tl.num_programs(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    w = tl.load(weight_ptr + cols * weight_stride, mask=mask, other=0.0).to(COMPUTE_DTYPE) + offset
    grad_weight = tl.zeros([BLOCK], dtype=COMPUTE_DTYPE)
    grad_bias = tl.zeros([BLOCK], dtype=COMPUTE_DTYPE)
    for row in range(pid, n_rows, n_programs):
        h = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(COMPUTE_DTYPE)
        g = tl.load(grad_ptr + row * grad_row_stride + cols, mask=mask, other=0.0).to(COMPUTE_DTYPE)
        if CENTER:
            h = tl.where(mask, h - tl.sum(h, axis=0) / n_cols, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(h * h, axis=0) / n_cols + eps)
        x_hat = h * rstd
        grad_weight += g * x_hat
        if HAS_BIAS:
            grad_bias += g
        grad_x_hat = g * w
        correction = x_hat * (tl.sum(grad_x_hat * x_hat, axis=0) / n_cols)
        if CENTER:
            correction += tl.sum(grad_x_hat, axis=0) / n_cols
        grad_x = rstd * (grad_x_hat - correction)
        tl.store(grad_x_ptr + row * n_cols + cols, grad_x.to(grad_x_ptr.dtype.element_ty), mask=mask)
    tl.store(grad_weight_partial_ptr + pid * n_cols + cols, grad_weight, mask=mask)
    if HAS_BIAS:
        tl.store(grad_bias_partial_ptr + pid * n_cols + cols, grad_bias, mask=mask)


def _launch_fwd(x: Tensor, weight: Tensor, bias: Tensor | None, eps: float, offset: float, center: bool,
                op: str) -> Tensor:
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    x2 = rows(x)
    if x2.shape[0] == 0 or x2.shape[1] == 0:
        return out
    block, num_warps = row_block(x2.shape[1], op=op)
    wrap_triton(_fp32_norm_fwd_kernel)[(x2.shape[0],)](
        x2, weight, bias if bias is not None else weight, out, x2.stride(0), weight.stride(0),
        bias.stride(0) if bias is not None else 0, x2.shape[1], eps, offset,
        CENTER=center, HAS_BIAS=bias is not None, BLOCK=block, COMPUTE_DTYPE=compute_dtype(x.dtype),
        num_warps=num_warps,
    )
    return out


def _launch_bwd(grad: Tensor, x: Tensor, weight: Tensor, has_bias: bool, eps: float, offset: float, center: bool,
                op: str) -> tuple[Tensor, Tensor, Tensor]:
    grad_x = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    x2, grad2 = rows(x), rows(grad)
    n_rows, n_cols = x2.shape
    acc = accumulation_dtype(x.dtype)
    if n_rows == 0 or n_cols == 0:
        zeros = torch.zeros_like(weight)
        return grad_x, zeros, zeros.clone()
    block, num_warps = row_block(n_cols, op=op)
    programs = persistent_programs(n_rows, x.device)
    partial_w = torch.empty((programs, n_cols), dtype=acc, device=x.device)
    partial_b = torch.empty((programs, n_cols), dtype=acc, device=x.device) if has_bias else partial_w
    wrap_triton(_fp32_norm_bwd_kernel)[(programs,)](
        grad2, x2, weight, grad_x, partial_w, partial_b,
        grad2.stride(0), x2.stride(0), weight.stride(0), n_rows, n_cols, eps, offset,
        CENTER=center, HAS_BIAS=has_bias, BLOCK=block, COMPUTE_DTYPE=compute_dtype(x.dtype), num_warps=num_warps,
    )
    grad_bias = sum_partials(partial_b, weight.dtype) if has_bias else torch.zeros_like(weight)
    return grad_x, sum_partials(partial_w, weight.dtype), grad_bias


def _check(op: str, x: Tensor, weight: Tensor, bias: Tensor | None = None) -> None:
    check_tensors(op, min_dim=1, x=x, weight=weight, bias=bias)
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and (t.dim() != 1 or x.dim() == 0 or t.shape[0] != x.shape[-1]):
            raise ValueError(
                f"{op}: {name} has shape {tuple(t.shape)} but x is {tuple(x.shape)}; pass a 1-D {name} "
                f"of x's last dimension."
            )


# ----------------------------------------------------------------------------- rms_norm_fp32


def _rms_norm_fp32_impl(x: Tensor, weight: Tensor, eps: float, offset: float) -> Tensor:
    return _launch_fwd(x, weight, None, eps, offset, False, "rms_norm_fp32")


def _rms_norm_fp32_fake(x: Tensor, weight: Tensor, eps: float, offset: float) -> Tensor:
    return x.new_empty(x.shape)


def _rms_norm_fp32_backward_impl(grad: Tensor, x: Tensor, weight: Tensor, eps: float, offset: float) -> tuple[Tensor, Tensor]:
    grad_x, grad_weight, _ = _launch_bwd(grad, x, weight, False, eps, offset, False, "rms_norm_fp32")
    return grad_x, grad_weight


def _rms_norm_fp32_backward_fake(grad: Tensor, x: Tensor, weight: Tensor, eps: float, offset: float) -> tuple[Tensor, Tensor]:
    return torch.empty_like(x, memory_format=torch.contiguous_format), torch.empty_like(weight)


_rms_norm_fp32_op = define_differentiable_op(
    "rms_norm_fp32", _rms_norm_fp32_impl, fake=_rms_norm_fp32_fake,
    backward=_rms_norm_fp32_backward_impl, backward_fake=_rms_norm_fp32_backward_fake,
    saved=("x", "weight", "eps", "offset"),
    reference=lambda *args: rms_norm_fp32_reference(*args),  # defined below
)


def rms_norm_fp32(x: Tensor, weight: Tensor, eps: float = 1e-6, offset: float = 0.0) -> Tensor:
    """RMSNorm scaled in fp32 and rounded once: ``(norm(x.float()) * (offset + weight.float())).to(x.dtype)``.

    ``offset=1.0`` is Gemma 1/2/3's ``GemmaRMSNorm``; ``offset=0.0`` is OLMo2's and GPT-OSS's
    ``(weight * h).to(input_dtype)``.

    Args:
        x (`torch.Tensor`): ``[..., hidden]``; rows may be strided.
        weight (`torch.Tensor`): ``[hidden]``, any float dtype.
        eps (`float`, defaults to 1e-6): added to the mean square.
        offset (`float`, defaults to 0.0): added to the weight (in fp32) before scaling.

    Returns:
        `torch.Tensor`: contiguous ``[..., hidden]`` in x's dtype.

    Raises:
        TypeError: a tensor argument is not a floating-point tensor (the error names it).
        ValueError: x is 0-D, weight's shape does not match x's last dimension, hidden > 65536, or
            tensors on two devices.

    Example:
        ```python
        y = rms_norm_fp32(h, gemma_norm.weight, gemma_norm.eps, offset=1.0)
        ```
    """
    _check("rms_norm_fp32", x, weight)
    return _rms_norm_fp32_op(x, weight, float(eps), float(offset))


def rms_norm_fp32_reference(x: Tensor, weight: Tensor, eps: float = 1e-6, offset: float = 0.0) -> Tensor:
    """Plain PyTorch ``rms_norm_fp32`` (transformers' GemmaRMSNorm.forward with ``offset=1.0``)."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (h * (offset + weight.float())).type_as(x)


# ----------------------------------------------------------------------------- layer_norm


def _layer_norm_impl(x: Tensor, weight: Tensor, bias: Tensor | None, eps: float) -> Tensor:
    return _launch_fwd(x, weight, bias, eps, 0.0, True, "layer_norm")


def _layer_norm_fake(x: Tensor, weight: Tensor, bias: Tensor | None, eps: float) -> Tensor:
    return x.new_empty(x.shape)


def _layer_norm_backward_impl(
    grad: Tensor, x: Tensor, weight: Tensor, bias: Tensor | None, eps: float
) -> tuple[Tensor, Tensor, Tensor]:
    return _launch_bwd(grad, x, weight, bias is not None, eps, 0.0, True, "layer_norm")


def _layer_norm_backward_fake(
    grad: Tensor, x: Tensor, weight: Tensor, bias: Tensor | None, eps: float
) -> tuple[Tensor, Tensor, Tensor]:
    return torch.empty_like(x, memory_format=torch.contiguous_format), torch.empty_like(weight), torch.empty_like(weight)


_layer_norm_op = define_differentiable_op(
    "layer_norm", _layer_norm_impl, fake=_layer_norm_fake,
    backward=_layer_norm_backward_impl, backward_fake=_layer_norm_backward_fake,
    saved=("x", "weight", "bias", "eps"),
    # without a bias the backward op's third result is zeros: the missing input gets None
    gradients=lambda grads, saved: (grads[0], grads[1], grads[2] if saved[2] is not None else None, None),
    reference=lambda *args: layer_norm_reference(*args),  # defined below
)


def layer_norm(x: Tensor, weight: Tensor, bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """LayerNorm over the last dimension in fp32, rounded once to x's dtype (Cohere's ``CohereLayerNorm``;
    ``F.layer_norm`` with a bias).

    Args:
        x (`torch.Tensor`): ``[..., hidden]``; rows may be strided.
        weight (`torch.Tensor`): ``[hidden]``, any float dtype.
        bias (`torch.Tensor`, *optional*): ``[hidden]``, weight's dtype.
        eps (`float`, defaults to 1e-5): added to the variance.

    Returns:
        `torch.Tensor`: contiguous ``[..., hidden]`` in x's dtype.

    Raises:
        TypeError: a tensor argument is not a floating-point tensor (the error names it).
        ValueError: x is 0-D, weight or bias shapes do not match x's last dimension, hidden > 65536, or
            tensors on two devices.

    Example:
        ```python
        y = layer_norm(h, norm.weight, None, norm.variance_epsilon)
        ```
    """
    _check("layer_norm", x, weight, bias)
    if bias is not None and bias.dtype != weight.dtype:
        raise ValueError(f"layer_norm: bias is {bias.dtype} but weight is {weight.dtype}; pass one dtype for both.")
    return _layer_norm_op(x, weight, bias, float(eps))


def layer_norm_reference(x: Tensor, weight: Tensor, bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """Plain PyTorch ``layer_norm`` (transformers' CohereLayerNorm.forward, plus an optional bias)."""
    h = x.float()
    mean = h.mean(-1, keepdim=True)
    h = (h - mean) * torch.rsqrt((h - mean).pow(2).mean(-1, keepdim=True) + eps)
    h = weight.float() * h
    if bias is not None:
        h = h + bias.float()
    return h.to(x.dtype)
