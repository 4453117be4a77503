"""Rotary embedding variants of other model families: partial, interleaved, half-width cos/sin.

:func:`twinkle_triton.apply_rotary_pos_emb` is Llama/Qwen2's rotary (``rotate_half`` over the whole
head, full-width cos/sin). Other transformers families differ in three ways, all handled by one
kernel and op ``twinkle::rotary_embedding_variant``:

- **partial** (Phi3 with ``partial_rotary_factor < 1``, GLM4): only the first ``rotary_dim``
  columns of each head rotate; the rest pass through unchanged (``torch.cat([rotated, pass])``);
- **interleaved** pairs (GLM4, Cohere): column ``2i`` rotates with ``2i + 1`` (``x[..., 0::2]`` /
  ``x[..., 1::2]``) instead of ``i`` with ``i + rotary_dim / 2``;
- **shared angle** (GPT-OSS's half-width cos/sin; GLM4's ``cos[..., :d/2].repeat_interleave(2)``):
  both columns of pair ``i`` use ``cos[i]``/``sin[i]``; otherwise each column uses the cos/sin entry
  at its own position (Phi3, Cohere).

For pair ``(a, b)`` with angles ``(cos_a, sin_a)``, ``(cos_b, sin_b)``::

    out[a] = x[a] * cos_a - x[b] * sin_a        out[b] = x[b] * cos_b + x[a] * sin_b

computed in fp32 and rounded once (Cohere's own code computes in fp32 too). The public functions
have transformers' signature ``(q, k, cos, sin, unsqueeze_dim=1)`` and each equals one family's
``apply_rotary_pos_emb``, so they can be registered as function kernels for it. As in
:mod:`.rotary`, cos and sin get no gradient; backward is the transposed rotation.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._launch import compute_dtype
from ._library import define_op, wrap_triton
from .rotary import _bhsd_strides, _check, _cos_sin_rows


@triton.jit
def _rotate_variant_heads(
    src_ptr, dst_ptr, cos_a, cos_b, sin_a, sin_b, b, s, n_heads,
    src_sb, src_sh, src_ss, dst_sb, dst_sh, dst_ss, half, head_dim, rotary_dim,
    BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr,
    INTERLEAVED: tl.constexpr, COMPUTE_DTYPE: tl.constexpr, TRANSPOSE: tl.constexpr,
):
    heads = tl.arange(0, BLOCK_H)[:, None]
    pairs = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (heads < n_heads) & (pairs < half)
    if INTERLEAVED:
        col_a = 2 * pairs
        col_b = 2 * pairs + 1
    else:
        col_a = pairs
        col_b = pairs + half
    src = src_ptr + b * src_sb + s * src_ss + heads * src_sh
    dst = dst_ptr + b * dst_sb + s * dst_ss + heads * dst_sh
    xa = tl.load(src + col_a, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    xb = tl.load(src + col_b, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    if TRANSPOSE:
        out_a = xa * cos_a + xb * sin_b
        out_b = xb * cos_b - xa * sin_a
    else:
        out_a = xa * cos_a - xb * sin_a
        out_b = xb * cos_b + xa * sin_b
    tl.store(dst + col_a, out_a.to(dst_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + col_b, out_b.to(dst_ptr.dtype.element_ty), mask=mask)
    if BLOCK_PASS > 0:  # the columns past rotary_dim are copied (their gradient passes through too)
        cols = rotary_dim + tl.arange(0, BLOCK_PASS)[None, :]
        pass_mask = (heads < n_heads) & (cols < head_dim)
        tl.store(dst + cols, tl.load(src + cols, mask=pass_mask, other=0.0), mask=pass_mask)


@triton.jit
def _rotary_variant_kernel(
    q_ptr, k_ptr, cos_ptr, sin_ptr, q_out_ptr, k_out_ptr,
    seq_len, n_q_heads, n_k_heads, half, head_dim, rotary_dim,
    q_sb, q_sh, q_ss, k_sb, k_sh, k_ss,
    qo_sb, qo_sh, qo_ss, ko_sb, ko_sh, ko_ss,
    cos_sb, cos_ss, sin_sb, sin_ss,
    BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr,
    INTERLEAVED: tl.constexpr, SHARED_ANGLE: tl.constexpr, COMPUTE_DTYPE: tl.constexpr, TRANSPOSE: tl.constexpr,
):
    # One program per (batch, position), like rotary.py: cos/sin rows are read once for all heads.
    pid = tl.program_id(0).to(tl.int64)
    b = pid // seq_len
    s = pid % seq_len
    pairs = tl.arange(0, BLOCK_HALF)[None, :]
    mask = pairs < half
    if SHARED_ANGLE:
        angle_a = pairs
        angle_b = pairs
    elif INTERLEAVED:
        angle_a = 2 * pairs
        angle_b = 2 * pairs + 1
    else:
        angle_a = pairs
        angle_b = pairs + half
    cos_row = cos_ptr + b * cos_sb + s * cos_ss
    sin_row = sin_ptr + b * sin_sb + s * sin_ss
    cos_a = tl.load(cos_row + angle_a, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    cos_b = tl.load(cos_row + angle_b, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    sin_a = tl.load(sin_row + angle_a, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    sin_b = tl.load(sin_row + angle_b, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    _rotate_variant_heads(q_ptr, q_out_ptr, cos_a, cos_b, sin_a, sin_b, b, s, n_q_heads,
                          q_sb, q_sh, q_ss, qo_sb, qo_sh, qo_ss, half, head_dim, rotary_dim,
                          BLOCK_HQ, BLOCK_HALF, BLOCK_PASS, INTERLEAVED, COMPUTE_DTYPE, TRANSPOSE)
    _rotate_variant_heads(k_ptr, k_out_ptr, cos_a, cos_b, sin_a, sin_b, b, s, n_k_heads,
                          k_sb, k_sh, k_ss, ko_sb, ko_sh, ko_ss, half, head_dim, rotary_dim,
                          BLOCK_HK, BLOCK_HALF, BLOCK_PASS, INTERLEAVED, COMPUTE_DTYPE, TRANSPOSE)


def _launch(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int, rotary_dim: int,
            interleaved: bool, shared_angle: bool, transpose: bool) -> tuple[Tensor, Tensor]:
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
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
    cos_width = cos.shape[-1]
    cos, cos_sb, cos_ss = _cos_sin_rows(cos, unsqueeze_dim, batch, seq_len, cos_width)
    sin, sin_sb, sin_ss = _cos_sin_rows(sin, unsqueeze_dim, batch, seq_len, cos_width)
    half = rotary_dim // 2
    block_pass = triton.next_power_of_2(head_dim - rotary_dim) if head_dim > rotary_dim else 0
    block_hq, block_hk = triton.next_power_of_2(n_q_heads), triton.next_power_of_2(n_k_heads)
    block_half = triton.next_power_of_2(max(half, 1))
    num_warps = 4 if (block_hq + block_hk) * block_half * 2 <= 4096 else 8
    wrap_triton(_rotary_variant_kernel)[(batch * seq_len,)](
        q, k, cos, sin, q_out, k_out,
        seq_len, n_q_heads, n_k_heads, half, head_dim, rotary_dim,
        *_bhsd_strides(q, unsqueeze_dim), *_bhsd_strides(k, unsqueeze_dim),
        *_bhsd_strides(q_out, unsqueeze_dim), *_bhsd_strides(k_out, unsqueeze_dim),
        cos_sb, cos_ss, sin_sb, sin_ss,
        BLOCK_HQ=block_hq, BLOCK_HK=block_hk, BLOCK_HALF=block_half, BLOCK_PASS=block_pass,
        INTERLEAVED=interleaved, SHARED_ANGLE=shared_angle, COMPUTE_DTYPE=compute_dtype(q.dtype),
        TRANSPOSE=transpose, num_warps=num_warps,
    )
    return q_out, k_out


def _variant_impl(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int, rotary_dim: int,
                  interleaved: bool, shared_angle: bool) -> tuple[Tensor, Tensor]:
    return _launch(q, k, cos, sin, unsqueeze_dim, rotary_dim, interleaved, shared_angle, transpose=False)


def _variant_fake(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int, rotary_dim: int,
                  interleaved: bool, shared_angle: bool) -> tuple[Tensor, Tensor]:
    return torch.empty_like(q), torch.empty_like(k)


def _variant_backward_impl(grad_q: Tensor, grad_k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int,
                           rotary_dim: int, interleaved: bool, shared_angle: bool) -> tuple[Tensor, Tensor]:
    return _launch(grad_q, grad_k, cos, sin, unsqueeze_dim, rotary_dim, interleaved, shared_angle, transpose=True)


def _variant_backward_fake(grad_q: Tensor, grad_k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int,
                           rotary_dim: int, interleaved: bool, shared_angle: bool) -> tuple[Tensor, Tensor]:
    return torch.empty_like(grad_q), torch.empty_like(grad_k)


_variant_backward_op = define_op(
    "rotary_embedding_variant_backward", _variant_backward_impl, fake=_variant_backward_fake
)


def _variant_setup_context(ctx, inputs, output):
    _, _, cos, sin, *flags = inputs
    ctx.save_for_backward(cos, sin)
    ctx.flags = flags


def _variant_backward(ctx, grad_q, grad_k):
    cos, sin = ctx.saved_tensors
    grad_q, grad_k = _variant_backward_op(grad_q, grad_k, cos, sin, *ctx.flags)
    return grad_q, grad_k, None, None, None, None, None, None


_variant_op = define_op(
    "rotary_embedding_variant", _variant_impl, fake=_variant_fake,
    backward=_variant_backward, setup_context=_variant_setup_context,
)


def _run(name: str, q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int, rotary_dim: int,
         interleaved: bool, shared_angle: bool) -> tuple[Tensor, Tensor]:
    head_dim = q.shape[-1] if q.dim() else 0
    if rotary_dim % 2 or not 0 < rotary_dim <= head_dim:
        raise ValueError(
            f"{name}: cos/sin of width {cos.shape[-1]} give a rotary dim of {rotary_dim} for heads of "
            f"{head_dim}; it must be even and at most the head dim."
        )
    width = cos.shape[-1] if cos.dim() else 0
    if width > head_dim:
        raise ValueError(f"{name}: cos/sin are {width} wide but the heads of q are {head_dim}; pass cos/sin "
                         "at most as wide as the head.")
    # shapes, dtypes and no-grad cos/sin as for the Llama rotary, checked on the columns cos/sin cover
    _check(q[..., :width], k[..., :width], cos, sin, unsqueeze_dim)
    return _variant_op(q, k, cos, sin, int(unsqueeze_dim), int(rotary_dim), bool(interleaved), bool(shared_angle))


def apply_rotary_pos_emb_partial(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1
                                 ) -> tuple[Tensor, Tensor]:
    """Phi3's ``apply_rotary_pos_emb``: ``rotate_half`` over the first ``cos.shape[-1]`` columns of each
    head; the others pass through.

    Args:
        q (`torch.Tensor`): ``[B, Hq, S, D]`` (``unsqueeze_dim=1``) or ``[B, S, Hq, D]`` (``=2``).
        k (`torch.Tensor`): like q with its own head count.
        cos (`torch.Tensor`): ``[B or 1, S, R]`` with ``R <= D`` even; no gradient flows to it.
        sin (`torch.Tensor`): like cos.
        unsqueeze_dim (`int`, defaults to 1): the head dimension of q and k.

    Returns:
        `tuple[torch.Tensor, torch.Tensor]`: ``(q_embed, k_embed)`` laid out like q and k.

    Raises:
        ValueError: bad shapes, an odd rotary width or one wider than the head, cos/sin requiring grad.

    Example:
        ```python
        q, k = apply_rotary_pos_emb_partial(q, k, cos[..., :48], sin[..., :48])   # heads of 64
        ```
    """
    return _run("apply_rotary_pos_emb_partial", q, k, cos, sin, unsqueeze_dim, cos.shape[-1], False, False)


def apply_rotary_pos_emb_partial_reference(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1
                                           ) -> tuple[Tensor, Tensor]:
    """Plain PyTorch ``apply_rotary_pos_emb_partial`` (transformers' Phi3 version)."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    rotary_dim = cos.shape[-1]
    out = []
    for x in (q, k):
        x_rot, x_pass = x[..., :rotary_dim], x[..., rotary_dim:]
        half = rotary_dim // 2
        rotated = torch.cat((-x_rot[..., half:], x_rot[..., :half]), dim=-1)
        out.append(torch.cat([x_rot * cos + rotated * sin, x_pass], dim=-1))
    return out[0], out[1]


def apply_rotary_pos_emb_interleaved_partial(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1
                                             ) -> tuple[Tensor, Tensor]:
    """GLM4's ``apply_rotary_pos_emb``: interleaved pairs ``(2i, 2i+1)`` over the first
    ``cos.shape[-1]`` columns, pair ``i`` at angle ``cos[..., i]`` (the first half of cos/sin, as
    ``cos[..., :R/2].repeat_interleave(2)``); the other columns pass through.

    Args and returns as :func:`apply_rotary_pos_emb_partial`.

    Example:
        ```python
        q, k = apply_rotary_pos_emb_interleaved_partial(q, k, cos, sin)   # GLM4: R = head_dim / 2
        ```
    """
    return _run("apply_rotary_pos_emb_interleaved_partial", q, k, cos, sin, unsqueeze_dim,
                2 * (cos.shape[-1] // 2), True, True)


def apply_rotary_pos_emb_interleaved_partial_reference(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor,
                                                       unsqueeze_dim: int = 1) -> tuple[Tensor, Tensor]:
    """Plain PyTorch ``apply_rotary_pos_emb_interleaved_partial`` (transformers' GLM4 version)."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    cos = cos[..., : cos.shape[-1] // 2].repeat_interleave(2, dim=-1)
    sin = sin[..., : sin.shape[-1] // 2].repeat_interleave(2, dim=-1)
    rotary_dim = cos.shape[-1]
    out = []
    for x in (q, k):
        x_rot, x_pass = x[..., :rotary_dim], x[..., rotary_dim:]
        rotated = torch.stack((-x_rot[..., 1::2], x_rot[..., 0::2]), dim=-1).flatten(-2)
        out.append(torch.cat([x_rot * cos + rotated * sin, x_pass], dim=-1))
    return out[0], out[1]


def apply_rotary_pos_emb_interleaved(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1
                                     ) -> tuple[Tensor, Tensor]:
    """Cohere's ``apply_rotary_pos_emb``: interleaved pairs ``(2i, 2i+1)`` over the whole head, each
    column at its own cos/sin entry, computed in fp32 and returned in q's dtype.

    Args and returns as :func:`apply_rotary_pos_emb_partial` (cos/sin as wide as the head).

    Example:
        ```python
        q, k = apply_rotary_pos_emb_interleaved(q, k, cos, sin)
        ```
    """
    return _run("apply_rotary_pos_emb_interleaved", q, k, cos, sin, unsqueeze_dim, cos.shape[-1], True, False)


def apply_rotary_pos_emb_interleaved_reference(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1
                                               ) -> tuple[Tensor, Tensor]:
    """Plain PyTorch ``apply_rotary_pos_emb_interleaved`` (transformers' Cohere version)."""
    dtype = q.dtype
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    out = []
    for x in (q.float(), k.float()):
        rotated = torch.stack([-x[..., 1::2], x[..., ::2]], dim=-1).flatten(-2)
        out.append((x * cos + rotated * sin).to(dtype))
    return out[0], out[1]


def apply_rotary_pos_emb_half_angle(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1
                                    ) -> tuple[Tensor, Tensor]:
    """GPT-OSS's ``apply_rotary_pos_emb``: ``rotate_half`` over the whole head with half-width cos/sin
    (``cos[..., i]`` for both columns ``i`` and ``i + D/2``).

    Args and returns as :func:`apply_rotary_pos_emb_partial`, with cos/sin ``[B or 1, S, D/2]``.

    Example:
        ```python
        q, k = apply_rotary_pos_emb_half_angle(q, k, cos, sin)
        ```
    """
    return _run("apply_rotary_pos_emb_half_angle", q, k, cos, sin, unsqueeze_dim, 2 * cos.shape[-1], False, True)


def apply_rotary_pos_emb_half_angle_reference(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1
                                              ) -> tuple[Tensor, Tensor]:
    """Plain PyTorch ``apply_rotary_pos_emb_half_angle`` (transformers' GPT-OSS version)."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    out = []
    for x in (q, k):
        first, second = torch.chunk(x, 2, dim=-1)
        out.append(torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1))
    return out[0], out[1]
