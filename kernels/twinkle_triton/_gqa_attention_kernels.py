"""The Triton kernels of :mod:`.gqa_attention` (which says what they compute and how they split the
work): the forward over one (batch, KV head, row block, key split), the combine of the splits, and
the backward's dQ and dK/dV kernels, with the ``triton.jit`` helpers they share.

Only :mod:`.gqa_attention` launches them, so their names stay private (profiles show them as before).
"""

import triton
import triton.language as tl

from ._dependent_launch import wait_for_inputs
from ._float_args import fp32

# The kernels compute exp(x) as exp2(x * 1.4426950408889634), log2(e) (one MUFU.EX2 on NVIDIA GPUs).


@triton.jit
def _dot(a, b, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    if UPCAST:
        result = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        result = tl.dot(a, b, input_precision=PRECISION)
    return result


@triton.jit
def _batch_and_kv_head(pid_bh, n_kv_heads):
    """(batch, KV head) of a program over batch x KV heads, as int64 (offsets of large caches)."""
    return (pid_bh // n_kv_heads).to(tl.int64), (pid_bh % n_kv_heads).to(tl.int64)


@triton.jit
def _group_rows(pid_m, hk, group, seq_q, BLOCK_M: tl.constexpr):
    """(valid, head, position) of a program's block of its KV group's ``G * L`` query rows: row r of the group is
    query head hk * G + r // L at position r % L."""
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    return rows < group * seq_q, hk * group + rows // seq_q, rows % seq_q


@triton.jit
def _load_mask_block(mask_ptr, mask_row, s, valid, MASK_BOOL: tl.constexpr, sms):
    """(valid, additive bias) of a [rows, keys] block: a bool mask narrows ``valid``; a float mask
    is returned as fp32 bias and its -inf entries leave ``valid``."""
    m = tl.load(mask_ptr + mask_row[:, None] + s[None, :] * sms, mask=valid, other=0)
    if MASK_BOOL:
        valid = valid & (m != 0)
        bias = tl.zeros(m.shape, tl.float32)
    else:
        bias = m.to(tl.float32)
        valid = valid & (bias > float("-inf"))
    return valid, bias


@triton.jit
def _attend_keys(
    q, k_base, v_base, mask_ptr, mask_row, row_ok, d, d_ok, s_begin, s_end, sks, skd, svs, svd, sms, scale,
    new_rows, k_new, v_new,
    HAS_MASK: tl.constexpr, MASK_BOOL: tl.constexpr, BLOCK_S: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr, BLOCK_L: tl.constexpr,
):
    """(row max, row sum, unnormalised output) of the online softmax of ``q``'s rows over keys
    ``[s_begin, s_end)``, in blocks of ``BLOCK_S``. With ``BLOCK_L`` > 0, key row ``new_rows[i]`` is ``k_new[i]``
    and value row ``new_rows[i]`` is ``v_new[i]`` whatever K and V hold there (rows this kernel writes: no program
    waits for another's write; -1 for none)."""
    m_i = tl.full([q.shape[0]], float("-inf"), tl.float32)
    l_i = tl.zeros([q.shape[0]], tl.float32)
    acc = tl.zeros(q.shape, tl.float32)
    for start in range(s_begin, s_end, BLOCK_S):
        s = start + tl.arange(0, BLOCK_S)
        s_ok = s < s_end
        valid = row_ok[:, None] & s_ok[None, :]
        bias = 0.0
        if HAS_MASK:
            valid, bias = _load_mask_block(mask_ptr, mask_row, s, valid, MASK_BOOL, sms)
        # Skip K and V of a block no row may attend to (a static cache's unwritten tail).
        if tl.max(valid.to(tl.int32)) > 0:
            # V's load is issued with K's, so both are in flight during the first dot.
            kt = tl.load(k_base + s[None, :] * sks + d[:, None] * skd, mask=s_ok[None, :] & d_ok[:, None], other=0.0)
            v = tl.load(v_base + s[:, None] * svs + d[None, :] * svd, mask=s_ok[:, None] & d_ok[None, :], other=0.0)
            for i in tl.static_range(BLOCK_L):
                pick = tl.arange(0, BLOCK_L) == i
                at = s == tl.sum(tl.where(pick, new_rows, 0))
                # one row of k_new / v_new (exact: the sum adds zeros)
                k_row = tl.sum(tl.where(pick[:, None], k_new.to(tl.float32), 0.0), 0).to(kt.dtype)
                v_row = tl.sum(tl.where(pick[:, None], v_new.to(tl.float32), 0.0), 0).to(v.dtype)
                kt = tl.where(at[None, :], k_row[:, None], kt)
                v = tl.where(at[:, None], v_row[None, :], v)
            scores = _dot(q, kt, DOT_PRECISION, DOT_UPCAST) * scale + bias
            scores = tl.where(valid, scores, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(scores, 1))
            # A row with no valid key so far keeps m = -inf; shift it by 0 (p = 0, no NaN).
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2((m_i - m_safe) * 1.4426950408889634)
            p = tl.exp2((scores - m_safe[:, None]) * 1.4426950408889634)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, DOT_PRECISION, DOT_UPCAST)
            m_i = m_new
    return m_i, l_i, acc


@triton.jit
def _store_split(part_o_ptr, part_stats_ptr, m_i, l_i, acc, row_index, row_ok, d, d_ok, pid_s, n_splits, head_dim):
    """One split's normalised output and statistics (row max, log row sum) for the combine kernel; a row with
    no valid key (l = 0) stores o = 0 and (0, -inf)."""
    empty = l_i == 0.0
    o = acc / tl.where(empty, 1.0, l_i)[:, None]
    part = row_index * n_splits + pid_s
    tl.store(part_o_ptr + part[:, None] * head_dim + d[None, :], o, mask=row_ok[:, None] & d_ok[None, :])
    tl.store(part_stats_ptr + part * 2, tl.where(empty, 0.0, m_i), mask=row_ok)
    tl.store(part_stats_ptr + part * 2 + 1, tl.where(empty, float("-inf"), tl.log(tl.where(empty, 1.0, l_i))),
             mask=row_ok)


@triton.jit
def _gqa_fwd_kernel(
    q_ptr, k_ptr, v_ptr, mask_ptr, out_ptr, stats_ptr, part_o_ptr, part_stats_ptr,
    sqb, sqh, sql, sqd, skb, skh, sks, skd, svb, svh, svs, svd, smb, smh, sml, sms,
    n_kv_heads, group, seq_q, seq_k, head_dim, split_len, n_splits, scale,
    HAS_MASK: tl.constexpr, MASK_BOOL: tl.constexpr, SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr, PDL: tl.constexpr,
):
    wait_for_inputs(PDL)  # a decode step's query and cache row come from the kernel just before
    scale = fp32(scale)
    pid_bh = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_s = tl.program_id(2)
    b, hk = _batch_and_kv_head(pid_bh, n_kv_heads)
    n_heads = n_kv_heads * group
    row_ok, h, pos = _group_rows(pid_m, hk, group, seq_q, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < head_dim
    q = tl.load(q_ptr + b * sqb + h[:, None] * sqh + pos[:, None] * sql + d[None, :] * sqd,
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    s_begin = pid_s * split_len
    m_i, l_i, acc = _attend_keys(
        q, k_ptr + b * skb + hk * skh, v_ptr + b * svb + hk * svh, mask_ptr, b * smb + h * smh + pos * sml,
        row_ok, d, d_ok, s_begin, tl.minimum(s_begin + split_len, seq_k), sks, skd, svs, svd, sms, scale,
        0, 0, 0, HAS_MASK, MASK_BOOL, BLOCK_S, DOT_PRECISION, DOT_UPCAST, 0,
    )
    row_index = (b * n_heads + h) * seq_q + pos
    if SPLIT:
        _store_split(part_o_ptr, part_stats_ptr, m_i, l_i, acc, row_index, row_ok, d, d_ok, pid_s, n_splits, head_dim)
    else:
        # Fully masked rows (l = 0) give o = 0 and statistics (0, 0) saved.
        empty = l_i == 0.0
        o = acc / tl.where(empty, 1.0, l_i)[:, None]
        tl.store(out_ptr + row_index[:, None] * head_dim + d[None, :], o.to(out_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & d_ok[None, :])
        tl.store(stats_ptr + row_index * 2, tl.where(empty, 0.0, m_i), mask=row_ok)
        tl.store(stats_ptr + row_index * 2 + 1, tl.log(tl.where(empty, 1.0, l_i)), mask=row_ok)


@triton.jit
def _gqa_combine_kernel(
    part_o_ptr, part_stats_ptr, out_ptr, stats_ptr, length_ptr, n_splits, head_dim, advance,
    BLOCK_SPLITS: tl.constexpr, BLOCK_D: tl.constexpr, ADVANCE: tl.constexpr, PDL: tl.constexpr,
):
    # One program per query row: out = sum_j w_j o_j / sum_j w_j, w_j = l_j exp(m_j - m).
    # ADVANCE: program 0 adds ``advance`` to the cache length at ``length_ptr``, which every program of the
    # forward kernel read (it has finished: this kernel runs after it, or waits for it under PDL).
    wait_for_inputs(PDL)
    row = tl.program_id(0).to(tl.int64)
    if ADVANCE:
        if row == 0:
            tl.store(length_ptr, tl.load(length_ptr) + advance)
    j = tl.arange(0, BLOCK_SPLITS)
    j_ok = j < n_splits
    m_j = tl.load(part_stats_ptr + (row * n_splits + j) * 2, mask=j_ok, other=0.0)
    log_l_j = tl.load(part_stats_ptr + (row * n_splits + j) * 2 + 1, mask=j_ok, other=float("-inf"))
    m = tl.max(tl.where(log_l_j == float("-inf"), float("-inf"), m_j), 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    # (m_j - m) first: m_j may be huge (a float mask of finfo.min) while the difference is exact.
    w = tl.exp2(((m_j - m_safe) + log_l_j) * 1.4426950408889634)
    total = tl.sum(w, 0)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < head_dim
    o_j = tl.load(part_o_ptr + (row * n_splits + j)[:, None] * head_dim + d[None, :],
                  mask=j_ok[:, None] & d_ok[None, :], other=0.0)
    o = tl.sum(w[:, None] * o_j, 0) / tl.where(total == 0.0, 1.0, total)
    tl.store(out_ptr + row * head_dim + d, o.to(out_ptr.dtype.element_ty), mask=d_ok)
    tl.store(stats_ptr + row * 2, m_safe)
    tl.store(stats_ptr + row * 2 + 1, tl.log(tl.where(total == 0.0, 1.0, total)))


@triton.jit
def _gqa_bwd_dq_kernel(
    q_ptr, k_ptr, v_ptr, mask_ptr, do_ptr, out_ptr, stats_ptr, delta_ptr, dq_ptr,
    sqb, sqh, sql, sqd, skb, skh, sks, skd, svb, svh, svs, svd, smb, smh, sml, sms, sdb, sdh, sdl, sdd,
    n_kv_heads, group, seq_q, seq_k, head_dim, scale,
    HAS_MASK: tl.constexpr, MASK_BOOL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr,
):
    scale = fp32(scale)
    pid_bh = tl.program_id(0)
    pid_m = tl.program_id(1)
    b, hk = _batch_and_kv_head(pid_bh, n_kv_heads)
    n_heads = n_kv_heads * group
    row_ok, h, pos = _group_rows(pid_m, hk, group, seq_q, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < head_dim
    rd_ok = row_ok[:, None] & d_ok[None, :]
    q = tl.load(q_ptr + b * sqb + h[:, None] * sqh + pos[:, None] * sql + d[None, :] * sqd, mask=rd_ok, other=0.0)
    do = tl.load(do_ptr + b * sdb + h[:, None] * sdh + pos[:, None] * sdl + d[None, :] * sdd, mask=rd_ok, other=0.0)
    row_index = (b * n_heads + h) * seq_q + pos
    o = tl.load(out_ptr + row_index[:, None] * head_dim + d[None, :], mask=rd_ok, other=0.0)
    delta = tl.sum(do.to(tl.float32) * o.to(tl.float32), 1)
    tl.store(delta_ptr + row_index, delta, mask=row_ok)
    m_row = tl.load(stats_ptr + row_index * 2, mask=row_ok, other=0.0)
    log_l = tl.load(stats_ptr + row_index * 2 + 1, mask=row_ok, other=0.0)
    k_base = k_ptr + b * skb + hk * skh
    v_base = v_ptr + b * svb + hk * svh
    mask_row = b * smb + h * smh + pos * sml

    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start in range(0, seq_k, BLOCK_S):
        s = start + tl.arange(0, BLOCK_S)
        s_ok = s < seq_k
        valid = row_ok[:, None] & s_ok[None, :]
        bias = 0.0
        if HAS_MASK:
            valid, bias = _load_mask_block(mask_ptr, mask_row, s, valid, MASK_BOOL, sms)
        if tl.max(valid.to(tl.int32)) > 0:
            sd_ok = s_ok[None, :] & d_ok[:, None]
            kt = tl.load(k_base + s[None, :] * sks + d[:, None] * skd, mask=sd_ok, other=0.0)
            vt = tl.load(v_base + s[None, :] * svs + d[:, None] * svd, mask=sd_ok, other=0.0)
            scores = _dot(q, kt, DOT_PRECISION, DOT_UPCAST) * scale + bias
            scores = tl.where(valid, scores, float("-inf"))
            p = tl.exp2(((scores - m_row[:, None]) - log_l[:, None]) * 1.4426950408889634)
            dp = _dot(do, vt, DOT_PRECISION, DOT_UPCAST)
            ds = p * (dp - delta[:, None])
            dq += _dot(ds.to(kt.dtype), tl.trans(kt), DOT_PRECISION, DOT_UPCAST)
    tl.store(dq_ptr + row_index[:, None] * head_dim + d[None, :], (dq * scale).to(dq_ptr.dtype.element_ty),
             mask=rd_ok)


@triton.jit
def _gqa_bwd_dkdv_kernel(
    q_ptr, k_ptr, v_ptr, mask_ptr, do_ptr, stats_ptr, delta_ptr, dk_ptr, dv_ptr,
    sqb, sqh, sql, sqd, skb, skh, sks, skd, svb, svh, svs, svd, smb, smh, sml, sms, sdb, sdh, sdl, sdd,
    n_kv_heads, group, seq_q, seq_k, head_dim, scale,
    HAS_MASK: tl.constexpr, MASK_BOOL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr,
):
    scale = fp32(scale)
    pid_bh = tl.program_id(0)
    pid_s = tl.program_id(1)
    b, hk = _batch_and_kv_head(pid_bh, n_kv_heads)
    n_heads = n_kv_heads * group
    s = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)
    s_ok = s < seq_k
    d = tl.arange(0, BLOCK_D)
    d_ok = d < head_dim
    sd_ok = s_ok[:, None] & d_ok[None, :]
    k = tl.load(k_ptr + b * skb + hk * skh + s[:, None] * sks + d[None, :] * skd, mask=sd_ok, other=0.0)
    v = tl.load(v_ptr + b * svb + hk * svh + s[:, None] * svs + d[None, :] * svd, mask=sd_ok, other=0.0)
    dk = tl.zeros([BLOCK_S, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_S, BLOCK_D], tl.float32)
    for m0 in range(0, group * seq_q, BLOCK_M):
        rows = m0 + tl.arange(0, BLOCK_M)
        row_ok = rows < group * seq_q
        h = hk * group + rows // seq_q
        pos = rows % seq_q
        valid = row_ok[:, None] & s_ok[None, :]
        bias = 0.0
        if HAS_MASK:
            valid, bias = _load_mask_block(mask_ptr, b * smb + h * smh + pos * sml, s, valid, MASK_BOOL, sms)
        if tl.max(valid.to(tl.int32)) > 0:
            rd_ok = row_ok[:, None] & d_ok[None, :]
            q = tl.load(q_ptr + b * sqb + h[:, None] * sqh + pos[:, None] * sql + d[None, :] * sqd,
                        mask=rd_ok, other=0.0)
            do = tl.load(do_ptr + b * sdb + h[:, None] * sdh + pos[:, None] * sdl + d[None, :] * sdd,
                         mask=rd_ok, other=0.0)
            row_index = (b * n_heads + h) * seq_q + pos
            m_row = tl.load(stats_ptr + row_index * 2, mask=row_ok, other=0.0)
            log_l = tl.load(stats_ptr + row_index * 2 + 1, mask=row_ok, other=0.0)
            delta = tl.load(delta_ptr + row_index, mask=row_ok, other=0.0)
            scores = _dot(q, tl.trans(k), DOT_PRECISION, DOT_UPCAST) * scale + bias
            scores = tl.where(valid, scores, float("-inf"))
            p = tl.exp2(((scores - m_row[:, None]) - log_l[:, None]) * 1.4426950408889634)
            dv += _dot(tl.trans(p.to(do.dtype)), do, DOT_PRECISION, DOT_UPCAST)
            dp = _dot(do, tl.trans(v), DOT_PRECISION, DOT_UPCAST)
            ds = p * (dp - delta[:, None])
            dk += _dot(tl.trans(ds.to(q.dtype)), q, DOT_PRECISION, DOT_UPCAST)
    out_off = ((b * n_kv_heads + hk) * seq_k + s)[:, None] * head_dim + d[None, :]
    tl.store(dk_ptr + out_off, (dk * scale).to(dk_ptr.dtype.element_ty), mask=sd_ok)
    tl.store(dv_ptr + out_off, dv.to(dv_ptr.dtype.element_ty), mask=sd_ok)
