"""The tiled strategy of :func:`~.fused_linear_cross_entropy.fused_linear_cross_entropy`
(``strategy="tiled"``, and the default with ``filter_eps`` or ``fp32_accumulation``): the logits only
ever exist as one ``BLOCK_M x BLOCK_N`` tile in registers.

The forward kernel is a matmul over token tiles x vocab tiles whose epilogue keeps each row's running
max / sum of exp (and the target logit), so it writes 16 bytes a token and never a logit. The
backward kernel recomputes each logits tile, turns it into d(loss)/d(logits) in registers, and adds
``tile @ W[tile cols]`` into grad_x and ``tile^T @ x[tile rows]`` into grad_W. Tokens whose label is
``ignore_index`` are sorted out first and cost nothing. The extra memory is the gradients themselves
(grad_W is the weight's size, grad_x the input's) plus a few hundred KiB. With ``filter_eps``
(``"auto"``: 2^-12 for bf16, Cut Cross-Entropy's default) a tile whose gradient entries are all
smaller than ``filter_eps`` (before the incoming gradient is applied) adds nothing: with a 150k
vocabulary most tiles hold only probabilities around 1e-5, so the two backward matmuls run for a
fraction of the tiles; but where the softmax is flat (a model at initialisation) those small entries
are most of the gradient, and dropping them is far from exact. ``filter_eps=None`` is exact, and slow
on this strategy (every tile adds under a lock: 37 ms on the shape of the measurements in
:mod:`.fused_linear_cross_entropy`). Gradients are added under a per-tile lock in the gradient's
dtype, or with fp32 atomics into fp32 buffers with ``fp32_accumulation=True`` (one more weight-sized
fp32 buffer, 2x the weight's bytes for bf16). Accumulation order varies between runs (not bitwise
deterministic). Most of the filtered backward's gain comes from the forward's per-tile logit maximum:
the backward skips a tile without computing it when no entry can reach ``filter_eps`` (see the kernel).

The vocab-chunked strategy (:mod:`.fused_linear_cross_entropy_vocab_chunked`) computes its forward
with this one's; every strategy allocates its gradients with :func:`~._flce_autograd.gradient_buffers`
and is checked against :func:`row_loss_reference`.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._flce_autograd import backward_fake, input_gradients, keep_for_backward
from ._float_args import fp32
from ._launch import accumulation_dtype, compute_dtype, dot_options, interpreting, multiprocessor_count
from ._library import define_op

# Tile sizes (BLOCK_M tokens x BLOCK_N vocab, BLOCK_K hidden per matmul step; BLOCK_D hidden per
# gradient add), warps and pipeline stages; SPLITS_PER_SM: vocab ranges per token tile so that
# (token tiles x ranges) ~ SPLITS_PER_SM x SMs programs run. Chosen by tools/flce_sweep.py on an
# H100 at the shape measured in fused_linear_cross_entropy.py: forward 128x256x64, 8 warps, 3 stages,
# 2.6-2.9 ms (128x128 4 warps: 3.9); backward 64x128, 4 warps: 4.7 ms fwd+bwd, vs 5.3-6.6 for 128-row
# or 256-column tiles; 64x64 was faster (4.1) but filters finer, 2.02e-2 from fp32 instead of 1.99e-2.
# Module-level so the sweep and the tests can set them.
TILED_FORWARD = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3, "SPLITS_PER_SM": 1}
TILED_BACKWARD = {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "BLOCK_D": 64, "num_warps": 4, "num_stages": 3}


@triton.jit
def stable_tanh(u):
    # 1 - 2 / (exp(2u) + 1): saturates to +-1 without inf / inf (tl has no tanh under the interpreter)
    return 1.0 - 2.0 / (tl.exp(2.0 * u) + 1.0)


@triton.jit
def _valid_rows(order_ptr, n_valid, pid_m, BLOCK_M: tl.constexpr):
    """Rows of token tile ``pid_m``: the non-ignored tokens come first in ``order``."""
    idx = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask = idx < n_valid
    rows = tl.load(order_ptr + idx, mask=mask, other=0).to(tl.int64)
    return rows, mask


@triton.jit
def _logits_tile(
    x_ptr, w_ptr, bias_ptr, rows, row_mask, cols, col_mask, D, stride_xn, stride_xd, stride_wv, stride_wd, softcap,
    HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, ACC_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    DOT_UPCAST: tl.constexpr, ACC_IN_DOT: tl.constexpr,
):
    """(logits tile [BLOCK_M, BLOCK_N] after bias and soft-capping, tanh of the cap or None)."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), ACC_DTYPE)
    ks = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + rows[:, None] * stride_xn + ks[None, :] * stride_xd
    w_ptrs = w_ptr + cols[None, :] * stride_wv + ks[:, None] * stride_wd
    for k in range(0, tl.cdiv(D, BLOCK_K)):
        if EVEN_K:
            a = tl.load(x_ptrs, mask=row_mask[:, None], other=0.0)
            b = tl.load(w_ptrs, mask=col_mask[None, :], other=0.0)
        else:
            k_mask = ks < D - k * BLOCK_K
            a = tl.load(x_ptrs, mask=row_mask[:, None] & k_mask[None, :], other=0.0)
            b = tl.load(w_ptrs, mask=col_mask[None, :] & k_mask[:, None], other=0.0)
        if DOT_UPCAST:
            acc += tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision=DOT_PRECISION)
        elif ACC_IN_DOT:
            acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        else:
            # fp32 / fp64 inputs: triton 3.6 rejects their accumulator operand on an H100 (a
            # CompilationError in tl.dot's accumulator check); a separate add is equivalent
            acc += tl.dot(a, b, input_precision=DOT_PRECISION)
        x_ptrs += BLOCK_K * stride_xd
        w_ptrs += BLOCK_K * stride_wd
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=col_mask, other=0.0).to(ACC_DTYPE)[None, :]
    cap = acc
    if HAS_SOFTCAP:
        cap = stable_tanh(acc / softcap)
        acc = softcap * cap
    return acc, cap


@triton.jit
def _flce_tiled_fwd_kernel(
    x_ptr, w_ptr, bias_ptr, target_ptr, order_ptr, n_valid_ptr, part_ptr, tile_max_ptr,
    N, V, D, stride_xn, stride_xd, stride_wv, stride_wd, tiles_per_split, n_v_tiles, softcap,
    HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_SMOOTHING: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
    ACC_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr, ACC_IN_DOT: tl.constexpr,
):
    """Per (token tile, vocab range): each row's max, sum of exp(logit - max), target logit and
    (label smoothing) sum of logits over the range, into part[range, 0..3, row]; and each tile's
    largest logit into tile_max[token tile, vocab tile] (the backward's bound for skipping tiles)."""
    softcap = fp32(softcap)
    pid_m = tl.program_id(0)
    pid_s = tl.program_id(1)
    n_valid = tl.load(n_valid_ptr)
    if pid_m * BLOCK_M >= n_valid:
        return
    rows, row_mask = _valid_rows(order_ptr, n_valid, pid_m, BLOCK_M)
    target = tl.load(target_ptr + rows, mask=row_mask, other=-1).to(tl.int64)
    m_i = tl.full([BLOCK_M], float("-inf"), ACC_DTYPE)
    s_i = tl.zeros([BLOCK_M], ACC_DTYPE)
    target_logit = tl.zeros([BLOCK_M], ACC_DTYPE)
    logit_sum = tl.zeros([BLOCK_M], ACC_DTYPE)
    first = pid_s * tiles_per_split
    last = tl.minimum(first + tiles_per_split, tl.cdiv(V, BLOCK_N))
    for tile in range(first, last):
        cols = (tile * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
        col_mask = cols < V
        z, _cap = _logits_tile(
            x_ptr, w_ptr, bias_ptr, rows, row_mask, cols, col_mask, D, stride_xn, stride_xd, stride_wv, stride_wd,
            softcap, HAS_BIAS, HAS_SOFTCAP, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, ACC_DTYPE, DOT_PRECISION, DOT_UPCAST,
            ACC_IN_DOT,
        )
        target_logit += tl.sum(tl.where(cols[None, :] == target[:, None], z, 0.0), axis=1)
        if HAS_SMOOTHING:
            logit_sum += tl.sum(tl.where(col_mask[None, :], z, 0.0), axis=1)
        z = tl.where(col_mask[None, :], z, float("-inf"))
        tile_max = tl.max(tl.max(tl.where(row_mask[:, None], z, float("-inf")), axis=1), axis=0)
        tl.store(tile_max_ptr + pid_m * n_v_tiles + tile, tile_max)
        m_new = tl.maximum(m_i, tl.max(z, axis=1))  # every tile has a real column: finite
        s_i = s_i * tl.exp(m_i - m_new) + tl.sum(tl.exp(z - m_new[:, None]), axis=1)
        m_i = m_new
    out = part_ptr + pid_s * 4 * N + rows
    tl.store(out, m_i, mask=row_mask)
    tl.store(out + N, s_i, mask=row_mask)
    tl.store(out + 2 * N, target_logit, mask=row_mask)
    tl.store(out + 3 * N, logit_sum, mask=row_mask)


@triton.jit
def _add_product(
    a, b_rows, b_mask, stride_bd, out_rows, out_mask, locks, D,
    BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr, ATOMIC: tl.constexpr, DOT_PRECISION: tl.constexpr,
    DOT_UPCAST: tl.constexpr,
):
    """out[rows, :] += a @ b[rows_b, :], BLOCK_D columns at a time: fp32 atomics (ATOMIC), else a
    read-add-write of the column block under its lock (works for every dtype)."""
    ds = tl.arange(0, BLOCK_D)
    for d in range(0, tl.cdiv(D, BLOCK_D)):
        cols = d * BLOCK_D + ds
        if EVEN_D:
            b_mask2 = b_mask[:, None]
            o_mask = out_mask[:, None]
        else:
            b_mask2 = b_mask[:, None] & (cols < D)[None, :]
            o_mask = out_mask[:, None] & (cols < D)[None, :]
        b = tl.load(b_rows + cols[None, :] * stride_bd, mask=b_mask2, other=0.0)
        if DOT_UPCAST:
            part = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision=DOT_PRECISION)
        else:
            part = tl.dot(a, b, input_precision=DOT_PRECISION)
        o_ptrs = out_rows + cols[None, :]
        if ATOMIC:
            tl.atomic_add(o_ptrs, part, mask=o_mask)
        else:
            lock = locks + d
            while tl.atomic_cas(lock, 0, 1) == 1:
                pass
            # .cg: read from L2, where the previous holder of the lock wrote, never a stale L1 line
            current = tl.load(o_ptrs, mask=o_mask, other=0.0, cache_modifier=".cg")
            tl.store(o_ptrs, (current.to(part.dtype) + part).to(o_ptrs.dtype.element_ty), mask=o_mask)
            tl.debug_barrier()
            tl.atomic_xchg(lock, 0)


@triton.jit
def _flce_tiled_bwd_kernel(
    x_ptr, w_ptr, bias_ptr, target_ptr, order_ptr, n_valid_ptr, lse_ptr, dloss_ptr, tile_max_ptr,
    dx_ptr, dw_ptr, db_ptr, locks_ptr,
    N, V, D, stride_xn, stride_xd, stride_wv, stride_wd,
    softcap, smoothing, z_loss, filter_eps, n_m_tiles, fwd_block_m, fwd_block_n, fwd_n_v_tiles,
    HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, COMPUTE_DX: tl.constexpr, COMPUTE_DW: tl.constexpr,
    COMPUTE_DB: tl.constexpr, FILTER: tl.constexpr, SKIP_BY_BOUND: tl.constexpr, ATOMIC: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
    EVEN_K: tl.constexpr, EVEN_D: tl.constexpr, ACC_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    DOT_UPCAST: tl.constexpr, ACC_IN_DOT: tl.constexpr,
):
    """One (token tile, vocab tile): recompute the logits, form d(loss)/d(logits), add its products
    into grad_x, grad_W (and grad_bias)."""
    softcap, smoothing, z_loss, filter_eps = fp32(softcap), fp32(smoothing), fp32(z_loss), fp32(filter_eps)
    pid = tl.program_id(0)
    # token tiles vary fastest: the programs running together share one W tile (read once from
    # HBM) and x (a few MiB) stays in L2
    pid_m = pid % n_m_tiles
    pid_v = pid // n_m_tiles
    n_valid = tl.load(n_valid_ptr)
    if pid_m * BLOCK_M >= n_valid:
        return
    rows, row_mask = _valid_rows(order_ptr, n_valid, pid_m, BLOCK_M)
    target = tl.load(target_ptr + rows, mask=row_mask, other=-1).to(tl.int64)
    lse = tl.load(lse_ptr + rows, mask=row_mask, other=0.0).to(ACC_DTYPE)
    if SKIP_BY_BOUND:
        # Skip the tile before computing it when no entry can pass the filter: no target in it and
        # softmax <= exp(largest logit of the covering forward tile - smallest lse of the rows).
        # With a 150k vocabulary that is nearly every tile, so the backward matmuls run for few.
        first_col = pid_v * BLOCK_N
        has_target = tl.max(((target >= first_col) & (target < first_col + BLOCK_N)).to(tl.int32), axis=0)
        if has_target == 0:
            lse_min = tl.min(tl.where(row_mask, lse, float("inf")), axis=0)
            lse_abs = tl.max(tl.where(row_mask, tl.abs(lse), 0.0), axis=0)
            tile_max = tl.load(tile_max_ptr + (pid_m * BLOCK_M // fwd_block_m) * fwd_n_v_tiles + first_col // fwd_block_n)
            if tl.exp(tile_max - lse_min) * (1.0 + 2.0 * z_loss * lse_abs) < filter_eps:
                return
    cols = (pid_v * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    col_mask = cols < V
    z, cap = _logits_tile(
        x_ptr, w_ptr, bias_ptr, rows, row_mask, cols, col_mask, D, stride_xn, stride_xd, stride_wv, stride_wd,
        softcap, HAS_BIAS, HAS_SOFTCAP, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, ACC_DTYPE, DOT_PRECISION, DOT_UPCAST,
            ACC_IN_DOT,
    )
    # d loss / d z = softmax * (1 + 2 z_loss lse) - (1 - smoothing) onehot - smoothing / V
    g = tl.exp(z - lse[:, None]) * (1.0 + 2.0 * z_loss * lse)[:, None]
    g = g - tl.where(cols[None, :] == target[:, None], 1.0 - smoothing, 0.0) - smoothing / V
    g = tl.where(row_mask[:, None] & col_mask[None, :], g, 0.0)
    if FILTER:
        if tl.max(tl.max(tl.abs(g), axis=1), axis=0) < filter_eps:
            return
    g = g * tl.load(dloss_ptr + rows, mask=row_mask, other=0.0).to(ACC_DTYPE)[:, None]
    if HAS_SOFTCAP:
        g = g * (1.0 - cap * cap)
    if COMPUTE_DB:
        tl.atomic_add(db_ptr + cols, tl.sum(g, axis=0).to(db_ptr.dtype.element_ty), mask=col_mask)
    gq = g.to(x_ptr.dtype.element_ty)
    n_d = tl.cdiv(D, BLOCK_D)
    if COMPUTE_DX:
        _add_product(gq, w_ptr + cols[:, None] * stride_wv, col_mask, stride_wd, dx_ptr + rows[:, None] * D,
                     row_mask, locks_ptr + pid_m * n_d, D, BLOCK_D, EVEN_D, ATOMIC, DOT_PRECISION, DOT_UPCAST)
    if COMPUTE_DW:
        _add_product(tl.trans(gq), x_ptr + rows[:, None] * stride_xn, row_mask, stride_xd, dw_ptr + cols[:, None] * D,
                     col_mask, locks_ptr + (n_m_tiles + pid_v) * n_d, D, BLOCK_D, EVEN_D, ATOMIC, DOT_PRECISION, DOT_UPCAST)


def _fit(block: int, size: int) -> int:
    """``block``, or less for small sizes (at least 16, tl.dot's minimum)."""
    return max(16, min(block, triton.next_power_of_2(max(size, 1))))


def _valid_order(target: Tensor, ignore_index: int) -> tuple[Tensor, Tensor]:
    """(row indices with the non-ignored rows first, number of non-ignored rows as a device tensor)."""
    ignored = target == ignore_index
    order = torch.argsort(ignored.to(torch.int8), stable=True).to(torch.int32)
    return order, (~ignored).sum(dtype=torch.int32).reshape(1)


def tiled_forward(
    x: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None, ignore_index: int, label_smoothing: float,
    z_loss: float, softcap: float, filter_eps: float, fp32_accumulation: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """(loss per row, logsumexp per row, largest logit per tile) of x [N, D]; ignored rows get 0."""
    n, d = x.shape
    v = weight.shape[0]
    loss_dtype = accumulation_dtype(x.dtype)
    order, n_valid = _valid_order(target, ignore_index)
    cfg = TILED_FORWARD
    (block_m, block_n), block_k = _forward_tiles(v), _fit(cfg["BLOCK_K"], d)
    n_m_tiles, n_v_tiles = triton.cdiv(max(n, 1), block_m), triton.cdiv(v, block_n)
    # +inf (never skip) where no forward tile wrote: rows that are all ignored
    tile_max = torch.full((triton.cdiv(n, block_m), n_v_tiles), float("inf"), dtype=torch.float32, device=x.device)
    if x.device.type == "cuda" and not interpreting():
        programs = cfg["SPLITS_PER_SM"] * multiprocessor_count(x.device)
        splits = max(1, min(n_v_tiles, programs // n_m_tiles))
    else:
        splits = min(n_v_tiles, 2)  # still several ranges, so the interpreter tests the merge
    tiles_per_split = triton.cdiv(n_v_tiles, splits)
    splits = triton.cdiv(n_v_tiles, tiles_per_split)
    part = torch.zeros((splits, 4, n), dtype=loss_dtype, device=x.device)
    if n:
        _flce_tiled_fwd_kernel[(n_m_tiles, splits)](
            x, weight, bias, target, order, n_valid, part, tile_max, n, v, d, x.stride(0), x.stride(1),
            weight.stride(0), weight.stride(1), tiles_per_split, n_v_tiles, softcap,
            HAS_BIAS=bias is not None, HAS_SOFTCAP=softcap > 0, HAS_SMOOTHING=label_smoothing > 0,
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, EVEN_K=d % block_k == 0,
            ACC_DTYPE=compute_dtype(x.dtype), **dot_options(x.dtype, fp32_like_matmul=True),
            ACC_IN_DOT=x.dtype in (torch.bfloat16, torch.float16),
            num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        )
    valid = target != ignore_index
    row_max, row_sum, target_logit, logit_sum = part.unbind(1)
    lse = torch.logsumexp(row_max + torch.log(row_sum), dim=0)
    lse = torch.where(valid, lse, 0.0)
    loss = lse - (1.0 - label_smoothing) * target_logit.sum(0) - label_smoothing / v * logit_sum.sum(0)
    if z_loss:
        loss = loss + z_loss * lse * lse
    return torch.where(valid, loss, 0.0), lse, tile_max


def _forward_tiles(vocab: int) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N) of the forward: the tile_max grid, which the backward reads."""
    return TILED_FORWARD["BLOCK_M"], _fit(TILED_FORWARD["BLOCK_N"], vocab)


def _flce_tiled_fake(x, weight, target, bias, ignore_index, label_smoothing, z_loss, softcap, filter_eps,
                     fp32_accumulation):
    dtype = accumulation_dtype(x.dtype)
    block_m, block_n = _forward_tiles(weight.shape[0])
    tiles = ((x.shape[0] + block_m - 1) // block_m, (weight.shape[0] + block_n - 1) // block_n)
    return (x.new_empty(x.shape[0], dtype=dtype), x.new_empty(x.shape[0], dtype=dtype),
            x.new_empty(tiles, dtype=torch.float32))


def _flce_tiled_backward_impl(
    x: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None, lse: Tensor, grad_loss: Tensor, tile_max: Tensor,
    fwd_block_m: int, fwd_block_n: int, ignore_index: int, label_smoothing: float, z_loss: float, softcap: float,
    filter_eps: float, fp32_accumulation: bool, compute_grad_x: bool, compute_grad_weight: bool,
    compute_grad_bias: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """(grad_x, grad_weight, grad_bias) for d(sum of grad_loss * loss per row); [0]-sized where not asked."""
    n, d = x.shape
    v = weight.shape[0]
    atomic = fp32_accumulation or x.dtype in (torch.float32, torch.float64)
    acc_dtype = accumulation_dtype(x.dtype) if atomic else x.dtype
    grad_x = torch.zeros((n, d), dtype=acc_dtype, device=x.device) if compute_grad_x else x.new_empty(0)
    grad_w = torch.zeros((v, d), dtype=acc_dtype, device=x.device) if compute_grad_weight else x.new_empty(0)
    grad_b = torch.zeros(v, dtype=accumulation_dtype(x.dtype), device=x.device) if compute_grad_bias else x.new_empty(0)
    cfg = TILED_BACKWARD
    block_m, block_n = cfg["BLOCK_M"], _fit(cfg["BLOCK_N"], v)
    block_k, block_d = _fit(cfg["BLOCK_K"], d), _fit(cfg["BLOCK_D"], d)
    n_m_tiles, n_v_tiles = triton.cdiv(max(n, 1), block_m), triton.cdiv(v, block_n)
    if n and (compute_grad_x or compute_grad_weight or compute_grad_bias):
        order, n_valid = _valid_order(target, ignore_index)
        locks = torch.zeros((n_m_tiles + n_v_tiles) * triton.cdiv(d, block_d), dtype=torch.int32, device=x.device)
        _flce_tiled_bwd_kernel[(n_m_tiles * n_v_tiles,)](
            x, weight, bias, target, order, n_valid, lse, grad_loss, tile_max, grad_x, grad_w, grad_b, locks,
            n, v, d, x.stride(0), x.stride(1), weight.stride(0), weight.stride(1),
            softcap, label_smoothing, z_loss, filter_eps, n_m_tiles, fwd_block_m, fwd_block_n, tile_max.shape[1],
            HAS_BIAS=bias is not None, HAS_SOFTCAP=softcap > 0, COMPUTE_DX=compute_grad_x,
            COMPUTE_DW=compute_grad_weight, COMPUTE_DB=compute_grad_bias, FILTER=filter_eps > 0,
            # the bound needs each backward tile inside one forward tile (powers of two: not smaller), and is
            # useless when label smoothing alone puts every entry above filter_eps
            SKIP_BY_BOUND=(filter_eps > 0 and fwd_block_m >= block_m and fwd_block_n >= block_n
                           and label_smoothing / v < filter_eps),
            ATOMIC=atomic,
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, BLOCK_D=block_d,
            EVEN_K=d % block_k == 0, EVEN_D=d % block_d == 0, ACC_DTYPE=compute_dtype(x.dtype),
            **dot_options(x.dtype, fp32_like_matmul=True),
            ACC_IN_DOT=x.dtype in (torch.bfloat16, torch.float16),
            num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        )
    if atomic and acc_dtype != x.dtype:
        grad_x, grad_w = grad_x.to(x.dtype), grad_w.to(x.dtype)
    return grad_x, grad_w, (grad_b.to(x.dtype) if compute_grad_bias else grad_b)


_flce_tiled_backward_op = define_op(
    "fused_linear_cross_entropy_tiled_backward", _flce_tiled_backward_impl, fake=backward_fake,
    inline_kernels=False,
)


def _flce_tiled_setup_context(ctx, inputs, output):
    # the backward op reads tile_max on the forward's tile grid
    keep_for_backward(ctx, inputs, output, *_forward_tiles(inputs[1].shape[0]))


def _flce_tiled_backward(ctx, grad_loss, _grad_lse, _grad_tile_max):
    return input_gradients(_flce_tiled_backward_op, ctx, grad_loss)


# A custom op (opaque to Inductor): the kernels use locks and atomics, and a traced impl would gain
# nothing, the op being two launches per step. Autograd wired by hand (define_op), not declared with
# define_differentiable_op: the backward op is told which gradients autograd needs (needs_input_grad),
# so it skips the weight-sized products nobody asked for.
tiled_op = define_op(
    "fused_linear_cross_entropy_tiled", tiled_forward, fake=_flce_tiled_fake, backward=_flce_tiled_backward,
    setup_context=_flce_tiled_setup_context, inline_kernels=False,
    reference=lambda *args: (row_loss_reference(*args[:8]), None, None),  # defined below
)


def row_loss_reference(x: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None, ignore_index: int,
                       label_smoothing: float, z_loss: float, softcap: float | None) -> Tensor:
    """The loss of each token, flattened (``x [..., D]``, ``target`` shaped ``x.shape[:-1]``; softcap 0 or
    None for none), in plain PyTorch: the reference of the tiled and vocab-chunked ops, and of
    ``fused_linear_cross_entropy`` before its reduction. Ignored tokens get 0."""
    logits = torch.nn.functional.linear(x, weight, bias).to(accumulation_dtype(x.dtype))
    if softcap:
        logits = softcap * torch.tanh(logits / softcap)
    logits, target1 = logits.reshape(-1, logits.shape[-1]), target.reshape(-1)
    loss = torch.nn.functional.cross_entropy(logits, target1, ignore_index=ignore_index, reduction="none",
                                             label_smoothing=label_smoothing)
    if z_loss:
        loss = loss + z_loss * torch.logsumexp(logits, dim=-1).square() * (target1 != ignore_index)
    return loss
