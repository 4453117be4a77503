"""A decode step's attention after its projections, in two launches: rotary position embedding, the write of
the new keys and values into a static KV cache, the cache's length advanced, and grouped-query attention.

``rotary_cache_attention(q, k, v, cos, sin, key_cache, value_cache, attn_mask, scale, cache_length=n)`` equals::

    positions = n + torch.arange(L)                               # StaticCache's layer update
    n += L
    q = apply_rotary_pos_emb_to_cache(q, k, v, cos, sin, key_cache, value_cache, positions)
    return gqa_attention(q, key_cache, value_cache, attn_mask, scale)

(``cache_position=positions`` instead of ``cache_length`` gives the rows and leaves any counter alone.)

Why: at batch 1 a decoder layer's attention is otherwise four kernels between the q/k/v and the output
projections (the length update, the rotary cache write, the attention's key splits and their combine), each
moving a few kilobytes, so the layer pays their latencies one after the other.

The forward kernel is :mod:`.gqa_attention`'s (one program per batch row, KV head, block of the group's query
rows and split of the cache's rows) with two additions: each program rotates its query rows as it loads them,
and the programs whose split holds a new position's cache row rotate that position's k, write k and v there
and attend to them from registers (the loaded K and V blocks hold the row's old contents; no program waits for
another's write, and the other splits never read those rows). With ``cache_length`` every program reads the
length, and the combine kernel, which runs after them all, adds L to it; there is always a combine, even over
one split.

Positions past the cache's end are not written (transformers' ``generate`` sizes a static cache for the whole
call; ``index_copy_`` would raise). q, k and v are ``[B, H, L, D]`` with unit-stride head dims (the
``.view(...).transpose(1, 2)`` of a projection, read in place); rotary is transformers' ``rotate_half`` over the
whole head. A decode kernel: no autograd; under grad mode, q, k or v requiring grad is refused.
"""

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._dependent_launch import launch_options, wait_for_inputs
from ._float_args import fp32
from ._gqa_attention_kernels import _attend_keys, _batch_and_kv_head, _group_rows, _store_split
from ._launch import compute_dtype, dot_options, next_power_of_2
from ._library import define_op, wrap_triton
from .gqa_attention import _blocks, _check, _mask_layout, _num_splits, combine_splits, gqa_attention_reference
from .rotary import _cos_sin_rows
from .rotary_cache import apply_rotary_pos_emb_to_cache_reference, check_cache_write

__all__ = ["rotary_cache_attention", "rotary_cache_attention_reference"]


@triton.jit
def _rotated(src, cos_row, sin_row, d, partner, half, mask, COMPUTE_DTYPE: tl.constexpr):
    """Rows ``src[:, None] + d`` of a head rotated by transformers' ``rotate_half``: column ``d < half`` is
    ``x[d] cos[d] - x[d + half] sin[d]``, column ``d >= half`` is ``x[d] cos[d] + x[d - half] sin[d]``."""
    x = tl.load(src[:, None] + d[None, :], mask=mask, other=0.0).to(COMPUTE_DTYPE)
    x_pair = tl.load(src[:, None] + partner[None, :], mask=mask, other=0.0).to(COMPUTE_DTYPE)
    cos = tl.load(cos_row[:, None] + d[None, :], mask=mask, other=0.0).to(COMPUTE_DTYPE)
    sin = tl.load(sin_row[:, None] + d[None, :], mask=mask, other=0.0).to(COMPUTE_DTYPE)
    return x * cos + tl.where((d < half)[None, :], -x_pair, x_pair) * sin


@triton.jit
def _rotary_cache_attention_kernel(
    q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, key_cache_ptr, value_cache_ptr, rows_ptr, mask_ptr,
    part_o_ptr, part_stats_ptr,
    sqb, sqh, sql, skb, skh, skl, svb, svh, svl, cos_sb, cos_sl, sin_sb, sin_sl,
    kcb, kch, kcs, vcb, vch, vcs, smb, smh, sml, sms,
    n_kv_heads, group, seq_q, seq_k, head_dim, half, split_len, n_splits, scale,
    HAS_MASK: tl.constexpr, MASK_BOOL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_L: tl.constexpr,
    COUNTER: tl.constexpr, COMPUTE_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr,
    PDL: tl.constexpr,
):
    # COUNTER: rows_ptr is the cache length (the new positions' rows follow it), else the rows themselves.
    wait_for_inputs(PDL)  # q, k, v come from the projection just before
    scale = fp32(scale)
    pid_bh = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_s = tl.program_id(2)
    b, hk = _batch_and_kv_head(pid_bh, n_kv_heads)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < head_dim
    partner = tl.where(d < half, d + half, d - half)
    s_begin = pid_s * split_len
    s_end = tl.minimum(s_begin + split_len, seq_k)
    row_ok, h, pos = _group_rows(pid_m, hk, group, seq_q, BLOCK_M)
    q = _rotated(q_ptr + b * sqb + h * sqh + pos * sql, cos_ptr + b * cos_sb + pos * cos_sl,
                 sin_ptr + b * sin_sb + pos * sin_sl, d, partner, half, row_ok[:, None] & d_ok[None, :],
                 COMPUTE_DTYPE).to(q_ptr.dtype.element_ty)  # rounded as the rotary kernel's output is

    # The new positions: k rotated and v, into the caches where the rows fall in this split, and into the
    # attention below as they are (no program reads another's write).
    new = tl.arange(0, BLOCK_L)
    new_ok = new < seq_q
    if COUNTER:
        row = tl.load(rows_ptr).to(tl.int64) + new
    else:
        row = tl.load(rows_ptr + new, mask=new_ok, other=0).to(tl.int64)
    new_mask = new_ok[:, None] & d_ok[None, :]
    k_new = _rotated(k_ptr + b * skb + hk * skh + new * skl, cos_ptr + b * cos_sb + new * cos_sl,
                     sin_ptr + b * sin_sb + new * sin_sl, d, partner, half, new_mask,
                     COMPUTE_DTYPE).to(key_cache_ptr.dtype.element_ty)
    v_new = tl.load(v_ptr + b * svb + hk * svh + new[:, None] * svl + d[None, :], mask=new_mask,
                    other=0.0).to(value_cache_ptr.dtype.element_ty)
    here = new_ok & (row >= s_begin) & (row < s_end)
    key_base = key_cache_ptr + b * kcb + hk * kch
    value_base = value_cache_ptr + b * vcb + hk * vch
    m_i, l_i, acc = _attend_keys(
        q, key_base, value_base, mask_ptr, b * smb + h * smh + pos * sml, row_ok, d, d_ok, s_begin, s_end,
        kcs, 1, vcs, 1, sms, scale, tl.where(here, row, -1), k_new, v_new,
        HAS_MASK, MASK_BOOL, BLOCK_S, DOT_PRECISION, DOT_UPCAST, BLOCK_L,
    )
    # after the loop, which read these rows' old contents and took the new ones from registers
    tl.store(key_base + row[:, None] * kcs + d[None, :], k_new, mask=here[:, None] & d_ok[None, :])
    tl.store(value_base + row[:, None] * vcs + d[None, :], v_new, mask=here[:, None] & d_ok[None, :])
    row_index = (b * n_kv_heads * group + h) * seq_q + pos
    _store_split(part_o_ptr, part_stats_ptr, m_i, l_i, acc, row_index, row_ok, d, d_ok, pid_s, n_splits, head_dim)


def _impl(q: Tensor, k: Tensor, v: Tensor, cos: Tensor, sin: Tensor, key_cache: Tensor, value_cache: Tensor,
          cache_position: Tensor | None, cache_length: Tensor | None, attn_mask: Tensor | None, scale: float) -> Tensor:
    batch, n_heads, seq_q, head_dim = q.shape
    n_kv_heads, seq_k = key_cache.shape[1], key_cache.shape[2]
    group = n_heads // n_kv_heads
    out = torch.empty((batch, n_heads, seq_q, head_dim), dtype=q.dtype, device=q.device)
    if out.numel() == 0 or seq_k == 0:
        if cache_length is not None:
            cache_length.add_(seq_q)
        return out.zero_()
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k.stride(-1) != 1:
        k = k.contiguous()
    if v.stride(-1) != 1:
        v = v.contiguous()
    cos, cos_sb, cos_sl = _cos_sin_rows(cos, 1, batch, seq_q, cos.shape[-1])
    sin, sin_sb, sin_sl = _cos_sin_rows(sin, 1, batch, seq_q, sin.shape[-1])
    block_m, block_s, block_d, num_warps = _blocks(group * seq_q, head_dim)
    row_blocks = triton.cdiv(group * seq_q, block_m)
    splits, split_len = _num_splits(batch * n_kv_heads * row_blocks, seq_k, block_s, q.device)
    stats = torch.empty((batch, n_heads, seq_q, 2), dtype=torch.float32, device=q.device)
    part_o = torch.empty((batch * n_heads * seq_q * splits, head_dim), dtype=torch.float32, device=q.device)
    part_stats = torch.empty((batch * n_heads * seq_q * splits, 2), dtype=torch.float32, device=q.device)
    mask, (smb, smh, sml, sms), has_mask, mask_bool = _mask_layout(attn_mask, (batch, n_heads, seq_q, seq_k), q)
    wrap_triton(_rotary_cache_attention_kernel)[(batch * n_kv_heads, row_blocks, splits)](
        q, k, v, cos, sin, key_cache, value_cache, cache_position if cache_length is None else cache_length, mask,
        part_o, part_stats,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), cos_sb, cos_sl, sin_sb, sin_sl,
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2), smb, smh, sml, sms,
        n_kv_heads, group, seq_q, seq_k, head_dim, head_dim // 2, split_len, splits, scale,
        HAS_MASK=has_mask, MASK_BOOL=mask_bool, BLOCK_M=block_m, BLOCK_S=block_s, BLOCK_D=block_d,
        BLOCK_L=max(2, next_power_of_2(seq_q)), COUNTER=cache_length is not None,
        COMPUTE_DTYPE=compute_dtype(q.dtype), **dot_options(q.dtype), num_warps=num_warps, **launch_options(q),
    )
    # always a combine, even over one split: it runs after every program has read the cache length
    combine_splits(part_o, part_stats, out, stats, splits, block_d, cache_length=cache_length, advance=seq_q)
    return out


def _fake(q, k, v, cos, sin, key_cache, value_cache, cache_position, cache_length, attn_mask, scale):
    return q.new_empty(q.shape)  # contiguous, as the kernel's output


# Opaque to Inductor: the kernels launch as programmatic dependents (_dependent_launch), which Inductor's launcher
# of user kernels does not do; a decode step runs as a CUDA graph, where the op's dispatch costs nothing.
_op = define_op(
    "rotary_cache_attention", _impl, fake=_fake, mutates_args=("key_cache", "value_cache", "cache_length"),
    inline_kernels=False,
    reference=lambda *args: _reference(*args),  # defined below
)


def rotary_cache_attention(q: Tensor, k: Tensor, v: Tensor, cos: Tensor, sin: Tensor, key_cache: Tensor,
                           value_cache: Tensor, attn_mask: Tensor | None = None, scale: float | None = None, *,
                           cache_position: Tensor | None = None, cache_length: Tensor | None = None) -> Tensor:
    """Rotate ``q`` and ``k`` (transformers' ``apply_rotary_pos_emb``), write the rotated ``k`` and ``v`` into the
    caches' rows ``cache_position`` (or ``cache_length, ..., cache_length + L - 1``, then add L to ``cache_length``),
    and return the grouped-query attention of the rotated ``q`` over the caches
    (:func:`~twinkle_triton.gqa_attention`), in two launches.

    Args:
        q (`torch.Tensor`): ``[B, Hq, L, D]``, any strides with unit-stride head dims; D even, at most 256.
        k (`torch.Tensor`): ``[B, Hkv, L, D]``, q's dtype, ``Hq % Hkv == 0``.
        v (`torch.Tensor`): k's shape and dtype.
        cos (`torch.Tensor`): ``[B or 1, L, D]`` (or anything that broadcasts to q after ``unsqueeze(1)``).
        sin (`torch.Tensor`): as ``cos``.
        key_cache (`torch.Tensor`): ``[B, Hkv, S_max, D]``, q's dtype and device, unit-stride rows; written.
        value_cache (`torch.Tensor`): as ``key_cache``; written.
        attn_mask (`torch.Tensor`, *optional*): as :func:`~twinkle_triton.gqa_attention`'s, over the ``S_max``
            cache rows (a static cache's attention mask excludes the rows not yet written).
        scale (`float`, *optional*): factor on ``q @ k^T``; defaults to ``1 / sqrt(D)``.
        cache_position (`torch.Tensor`, *optional*): ``[L]`` integer rows of the caches, each distinct.
        cache_length (`torch.Tensor`, *optional*): instead of ``cache_position``, a 0-dim integer tensor: the number
            of cache rows in use (a ``StaticCache`` layer's ``cumulative_length``). The new rows follow it, and L is
            added to it. Rows past the cache's end are not written.

    Returns:
        `torch.Tensor`: contiguous ``[B, Hq, L, D]`` in q's dtype.

    Raises:
        TypeError: an argument is not a tensor of the kind it needs (the error names it).
        ValueError: shapes, dtypes or devices that do not fit together (the error names them), not exactly one of
            ``cache_position`` and ``cache_length``, or q, k or v requiring grad under grad mode.

    Example:
        ```python
        layer = cache.layers[i]  # a StaticCache's layer
        out = rotary_cache_attention(q, k, v, cos, sin, layer.keys, layer.values, mask,
                                     cache_length=layer.cumulative_length)
        ```
    """
    op = "rotary_cache_attention"
    check_cache_write(op, q, k, v, cos, sin, key_cache, value_cache)
    _check(q, key_cache, value_cache, attn_mask)
    if q.shape[-1] % 2:
        raise ValueError(f"{op}: head_dim {q.shape[-1]} is odd; rotate_half pairs column i with i + D/2.")
    if (cache_position is None) == (cache_length is None):
        raise ValueError(f"{op}: pass one of cache_position (the cache rows of the new positions) and cache_length "
                         "(the rows in use, which the new positions follow).")
    rows, name, shape = ((cache_position, "cache_position", (q.shape[2],)) if cache_length is None
                         else (cache_length, "cache_length", ()))
    if not isinstance(rows, Tensor) or tuple(rows.shape) != shape or rows.dtype not in (torch.int32, torch.int64) \
            or rows.device != q.device:
        got = f"{tuple(rows.shape)} {rows.dtype} on {rows.device}" if isinstance(rows, Tensor) else type(rows).__name__
        raise ValueError(f"{op}: {name} is {got}; pass {list(shape)} int64 (or int32) on q's device.")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return _op(q, k, v, cos, sin, key_cache, value_cache, cache_position, cache_length, attn_mask, scale)


def rotary_cache_attention_reference(q: Tensor, k: Tensor, v: Tensor, cos: Tensor, sin: Tensor, key_cache: Tensor,
                                     value_cache: Tensor, attn_mask: Tensor | None = None, scale: float | None = None,
                                     *, cache_position: Tensor | None = None,
                                     cache_length: Tensor | None = None) -> Tensor:
    """Plain PyTorch ``rotary_cache_attention``."""
    return _reference(q, k, v, cos, sin, key_cache, value_cache, cache_position, cache_length, attn_mask, scale)


def _reference(q, k, v, cos, sin, key_cache, value_cache, cache_position, cache_length, attn_mask, scale):
    if cache_length is not None:
        cache_position = cache_length + torch.arange(q.shape[2], device=cache_length.device)
        cache_length.add_(q.shape[2])
    q = apply_rotary_pos_emb_to_cache_reference(q, k, v, cos, sin, key_cache, value_cache, cache_position)
    return gqa_attention_reference(q, key_cache, value_cache, attn_mask, scale)
