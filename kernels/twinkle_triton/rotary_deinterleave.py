"""DeepSeek-V3's interleaved rotary embedding: pairs read interleaved, written de-interleaved.

transformers' DeepSeek-V3 (``rope_interleave=True``, the default) stores the rotary part of each
head as interleaved pairs ``(x[2i], x[2i+1])`` and returns the rotated pairs in ``rotate_half``
layout: for pair ``i`` at angle ``(cos[..., i], sin[..., i])`` (the first half of cos/sin, which are
``cat(freqs, freqs)``)::

    out[i]       = x[2i] * cos_i - x[2i+1] * sin_i
    out[i + D/2] = x[2i+1] * cos_i + x[2i] * sin_i

so the input and output layouts differ, unlike the variants of :mod:`.rotary_variants`, which read
and write each pair in place. One program per (batch, position) reads the cos/sin row once for all
heads of q and k; the math is in fp32, rounded once. Backward is the transposed rotation, read in
``rotate_half`` layout and written interleaved. cos and sin get no gradient.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._launch import compute_dtype
from ._library import define_differentiable_op, wrap_triton
from .rotary import _bhsd_strides, _check, _cos_sin_rows, out_like


@triton.jit
def _deinterleave_heads(
    src_ptr, dst_ptr, cos, sin, b, s, n_heads, src_sb, src_sh, src_ss, dst_sb, dst_sh, dst_ss, half,
    BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, COMPUTE_DTYPE: tl.constexpr, TRANSPOSE: tl.constexpr,
):
    heads = tl.arange(0, BLOCK_H)[:, None]
    pairs = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (heads < n_heads) & (pairs < half)
    if TRANSPOSE:  # gradient: read rotate_half layout, write interleaved
        src_a, src_b, dst_a, dst_b = pairs, pairs + half, 2 * pairs, 2 * pairs + 1
    else:
        src_a, src_b, dst_a, dst_b = 2 * pairs, 2 * pairs + 1, pairs, pairs + half
    src = src_ptr + b * src_sb + s * src_ss + heads * src_sh
    dst = dst_ptr + b * dst_sb + s * dst_ss + heads * dst_sh
    xa = tl.load(src + src_a, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    xb = tl.load(src + src_b, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    if TRANSPOSE:
        out_a = xa * cos + xb * sin
        out_b = xb * cos - xa * sin
    else:
        out_a = xa * cos - xb * sin
        out_b = xb * cos + xa * sin
    tl.store(dst + dst_a, out_a.to(dst_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + dst_b, out_b.to(dst_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_deinterleave_kernel(
    q_ptr, k_ptr, cos_ptr, sin_ptr, q_out_ptr, k_out_ptr,
    seq_len, n_q_heads, n_k_heads, half,
    q_sb, q_sh, q_ss, k_sb, k_sh, k_ss, qo_sb, qo_sh, qo_ss, ko_sb, ko_sh, ko_ss,
    cos_sb, cos_ss, sin_sb, sin_ss,
    BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_HALF: tl.constexpr,
    COMPUTE_DTYPE: tl.constexpr, TRANSPOSE: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    b = pid // seq_len
    s = pid % seq_len
    pairs = tl.arange(0, BLOCK_HALF)[None, :]
    mask = pairs < half
    cos = tl.load(cos_ptr + b * cos_sb + s * cos_ss + pairs, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    sin = tl.load(sin_ptr + b * sin_sb + s * sin_ss + pairs, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    _deinterleave_heads(q_ptr, q_out_ptr, cos, sin, b, s, n_q_heads, q_sb, q_sh, q_ss, qo_sb, qo_sh, qo_ss, half,
                        BLOCK_HQ, BLOCK_HALF, COMPUTE_DTYPE, TRANSPOSE)
    _deinterleave_heads(k_ptr, k_out_ptr, cos, sin, b, s, n_k_heads, k_sb, k_sh, k_ss, ko_sb, ko_sh, ko_ss, half,
                        BLOCK_HK, BLOCK_HALF, COMPUTE_DTYPE, TRANSPOSE)


def _launch(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int, transpose: bool
            ) -> tuple[Tensor, Tensor]:
    q_out, k_out = out_like(q), out_like(k)
    if q.numel() == 0 and k.numel() == 0:
        return q_out, k_out
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k.stride(-1) != 1:
        k = k.contiguous()
    shape = q.shape
    batch, n_q_heads, seq_len, head_dim = (shape[0], shape[1], shape[2], shape[3]) if unsqueeze_dim == 1 else (
        shape[0], shape[2], shape[1], shape[3])
    n_k_heads = k.shape[unsqueeze_dim]
    cos, cos_sb, cos_ss = _cos_sin_rows(cos, unsqueeze_dim, batch, seq_len, cos.shape[-1])
    sin, sin_sb, sin_ss = _cos_sin_rows(sin, unsqueeze_dim, batch, seq_len, sin.shape[-1])
    half = head_dim // 2
    block_hq, block_hk = triton.next_power_of_2(n_q_heads), triton.next_power_of_2(n_k_heads)
    block_half = triton.next_power_of_2(max(half, 1))
    wrap_triton(_rotary_deinterleave_kernel)[(batch * seq_len,)](
        q, k, cos, sin, q_out, k_out, seq_len, n_q_heads, n_k_heads, half,
        *_bhsd_strides(q, unsqueeze_dim), *_bhsd_strides(k, unsqueeze_dim),
        *_bhsd_strides(q_out, unsqueeze_dim), *_bhsd_strides(k_out, unsqueeze_dim),
        cos_sb, cos_ss, sin_sb, sin_ss,
        BLOCK_HQ=block_hq, BLOCK_HK=block_hk, BLOCK_HALF=block_half, COMPUTE_DTYPE=compute_dtype(q.dtype),
        TRANSPOSE=transpose, num_warps=4 if (block_hq + block_hk) * block_half * 2 <= 4096 else 8,
    )
    return q_out, k_out


def _impl(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int) -> tuple[Tensor, Tensor]:
    return _launch(q, k, cos, sin, unsqueeze_dim, transpose=False)


def _fake(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int) -> tuple[Tensor, Tensor]:
    return out_like(q), out_like(k)


def _backward_impl(grad_q: Tensor, grad_k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int
                   ) -> tuple[Tensor, Tensor]:
    return _launch(grad_q, grad_k, cos, sin, unsqueeze_dim, transpose=True)


def _backward_fake(grad_q: Tensor, grad_k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int
                   ) -> tuple[Tensor, Tensor]:
    return out_like(grad_q), out_like(grad_k)


_op = define_differentiable_op(
    "rotary_embedding_deinterleave", _impl, fake=_fake, backward=_backward_impl, backward_fake=_backward_fake,
    saved=("cos", "sin", "unsqueeze_dim"),
    gradients=lambda grads, _: (*grads, None, None, None),  # cos and sin get none (as rotary_embedding)
    reference=lambda q, k, cos, sin, unsqueeze_dim: apply_rotary_pos_emb_deinterleave_reference(
        q, k, cos, sin, None, unsqueeze_dim),  # defined below
)


def apply_rotary_pos_emb_deinterleave(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, position_ids=None,
                                      unsqueeze_dim: int = 1) -> tuple[Tensor, Tensor]:
    """DeepSeek-V3's ``apply_rotary_pos_emb_interleave``: interleaved pairs ``(2i, 2i+1)`` rotated by
    ``cos[..., i]`` / ``sin[..., i]`` and returned in ``rotate_half`` layout (pair ``i`` at columns
    ``i`` and ``i + D/2``).

    Args:
        q (`torch.Tensor`): ``[B, Hq, S, D]`` (``unsqueeze_dim=1``) or ``[B, S, Hq, D]`` (``=2``), D even.
        k (`torch.Tensor`): like q with its own head count (DeepSeek's shared key: 1 head).
        cos (`torch.Tensor`): ``[B or 1, S, D]`` as ``cat(freqs, freqs)``; only the first half is read,
            as transformers does. No gradient flows to it.
        sin (`torch.Tensor`): like cos.
        position_ids: unused (transformers' signature has it and ignores it too).
        unsqueeze_dim (`int`, defaults to 1): the head dimension of q and k.

    Returns:
        `tuple[torch.Tensor, torch.Tensor]`: ``(q_embed, k_embed)`` laid out like q and k.

    Raises:
        TypeError: q, k, cos or sin is not a floating-point tensor.
        ValueError: bad shapes, an odd head dim, cos/sin requiring grad, tensors on two devices.

    Example:
        ```python
        q_rot, k_rot = apply_rotary_pos_emb_deinterleave(q_rot, k_rot, cos, sin)   # DeepSeek-V3 MLA
        ```
    """
    _check(q, k, cos, sin, unsqueeze_dim)
    return _op(q, k, cos, sin, int(unsqueeze_dim))


def apply_rotary_pos_emb_deinterleave_reference(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, position_ids=None,
                                                unsqueeze_dim: int = 1) -> tuple[Tensor, Tensor]:
    """Plain PyTorch ``apply_rotary_pos_emb_deinterleave`` (transformers' DeepSeek-V3 version)."""
    cos = cos[..., : cos.shape[-1] // 2].unsqueeze(unsqueeze_dim)
    sin = sin[..., : sin.shape[-1] // 2].unsqueeze(unsqueeze_dim)
    out = []
    for x in (q, k):
        x1, x2 = x[..., 0::2], x[..., 1::2]
        out.append(torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1))
    return out[0], out[1]
