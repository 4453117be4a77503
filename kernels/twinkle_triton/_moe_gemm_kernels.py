"""The Triton kernels of :mod:`.moe_gemm` (which says what they compute, how the work is scheduled
and why the reductions are deterministic): the gate/up grouped GEMM with the SwiGLU epilogue, the
grouped GEMM whose rows go to (token, slot) rows, the backward's gathered GEMM and the SwiGLU
derivative after it, the per-expert weight gradient (two ways), the sums over each token's slots and the tile tables,
with the ``triton.jit`` helpers they share.

Every GEMM kernel but the weight gradients' two works through (M tile of one expert, N tile) items, item
``i`` the N tile ``i % n_blocks`` of M tile ``i // n_blocks``, program p taking items p, p + P, ... of
a grid of P programs: one program an item, or a few an SM that loop (persistent). The tile table
(``tile_expert``, ``tile_start``, whose last entry counts the M tiles) and the expert's rows in the
sorted order (``offsets``) are built on the device by ``_expert_tiles_kernel`` below.
Only :mod:`.moe_gemm` launches these kernels.
"""

import triton
import triton.language as tl

from ._gated import SILU, _act_terms

_SILU = tl.constexpr(SILU)  # a global a jit function reads must be a constexpr


@triton.jit
def _mma(acc, a, b, PRECISION: tl.constexpr, UPCAST: tl.constexpr, ACC_IN_DOT: tl.constexpr):
    """``acc + a @ b`` in fp32 (see ``_launch.dot_options`` for PRECISION and UPCAST)."""
    if UPCAST:
        acc += tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    elif ACC_IN_DOT:
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    else:
        # fp32 operands: triton 3.6 rejects their accumulator operand on an H100; a separate add is equivalent
        acc += tl.dot(a, b, input_precision=PRECISION)
    return acc


@triton.jit
def _tile(row0, end, pid_n, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The M tile of sorted rows ``row0 .. row0 + BLOCK_M`` (those before ``end``, its expert's last row, valid) and
    N tile ``pid_n``: (rows, their mask, columns, their mask).

    The caller loads the tables ``row0`` and ``end`` come from (and the rows' pairs where they address a store):
    torch's mutation analysis of a launch (``identify_mutated_tensors``) follows a stored-to pointer back through the
    arguments of any call it was computed from, stopping only at loads in the kernel's own body. Had a helper loaded
    them, the tables it read would count as written, and AOTAutograd would copy them before each launch and treat
    the saved routing order as changed by the backward."""
    rows = (row0 + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    return rows, rows < end, cols, cols < N


@triton.jit
def _weight_desc(w_ptr, num_experts, n_rows, K, swe, swk, swn, K_MAJOR: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr):
    """A TMA descriptor over the experts' weights, each ``w[e]`` the [K, n_rows] B operand read through the
    strides (expert, K, N), one of swk and swn 1: as [E, n_rows, K] when K_MAJOR (swk 1), else [E, K, n_rows].
    A block past an expert's rows or columns reads zeros, never the next expert's weights."""
    if K_MAJOR:
        desc = tl.make_tensor_descriptor(w_ptr, shape=[num_experts, n_rows, K], strides=[swe, swn, 1],
                                         block_shape=[1, BLOCK_N, BLOCK_K])
    else:
        desc = tl.make_tensor_descriptor(w_ptr, shape=[num_experts, K, n_rows], strides=[swe, swk, 1],
                                         block_shape=[1, BLOCK_K, BLOCK_N])
    return desc


@triton.jit
def _weight_block(desc, expert, n0, k0, K_MAJOR: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """``w[expert][k0:k0 + BLOCK_K, n0:n0 + BLOCK_N]`` as the [BLOCK_K, BLOCK_N] B operand, through ``desc``
    (:func:`_weight_desc`)."""
    e = expert.to(tl.int32)  # a descriptor's coordinates are 32-bit
    if K_MAJOR:
        b = tl.trans(desc.load([e, n0, k0]).reshape(BLOCK_N, BLOCK_K))
    else:
        b = desc.load([e, k0, n0]).reshape(BLOCK_K, BLOCK_N)
    return b


@triton.jit
def _items(tile_start_ptr, num_experts, n_blocks):
    """The launch's work items: the experts' M tiles (``tile_start[E]``) times the N tiles."""
    return tl.load(tile_start_ptr + num_experts) * n_blocks


@triton.jit
def _operands(a_ptr, num_rows, K, sar, w_ptr, num_experts, N, swe, swk, swn, A_TMA: tl.constexpr,
              B_TMA: tl.constexpr, K_MAJOR: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr):
    """What :func:`_gemm_tile` reads its operands through, once a program: with A_TMA a TMA descriptor over the
    [num_rows, K] ``a`` (unit column stride; rows past ``num_rows`` and columns past K read zeros), with B_TMA one
    over the weights (:func:`_weight_desc`); otherwise the pointer itself."""
    if A_TMA:
        a = tl.make_tensor_descriptor(a_ptr, shape=[num_rows, K], strides=[sar, 1], block_shape=[BLOCK_M, BLOCK_K])
    else:
        a = a_ptr
    if B_TMA:
        w = _weight_desc(w_ptr, num_experts, N, K, swe, swk, swn, K_MAJOR, BLOCK_N, BLOCK_K)
    else:
        w = w_ptr
    return a, w


@triton.jit
def _gemm_tile(a, a_rows, row_mask, sar, sak, a_row0, w, expert, swe, swk, swn, cols, col_mask, n0, K,
               A_TMA: tl.constexpr, B_TMA: tl.constexpr, K_MAJOR: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr, ACC_IN_DOT: tl.constexpr):
    """``a[a_rows, :K] @ w[expert][:K, cols]`` in fp32, ``w[expert]`` read as [K, N] through its strides; ``a`` and
    ``w`` as :func:`_operands` gives them. A_TMA: ``a_rows`` are the consecutive rows from ``a_row0``, loaded by
    TMA. Otherwise each operand through its pointers and masks."""
    ks = tl.arange(0, BLOCK_K)
    if not A_TMA:
        a_ptrs = a + a_rows[:, None] * sar + ks[None, :] * sak
    if not B_TMA:
        b_ptrs = w + expert.to(tl.int64) * swe + cols[None, :] * swn + ks[:, None] * swk
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_mask = ks < K - k0
        if A_TMA:
            a_block = a.load([a_row0, k0])
        else:
            a_block = tl.load(a_ptrs, mask=row_mask[:, None] & k_mask[None, :], other=0.0)
            a_ptrs += BLOCK_K * sak
        if B_TMA:
            b = _weight_block(w, expert, n0, k0, K_MAJOR, BLOCK_N, BLOCK_K)
        else:
            b = tl.load(b_ptrs, mask=k_mask[:, None] & col_mask[None, :], other=0.0)
            b_ptrs += BLOCK_K * swk
        acc = _mma(acc, a_block, b, DOT_PRECISION, DOT_UPCAST, ACC_IN_DOT)
    return acc


@triton.jit
def _gate_up_kernel(
    x_ptr, w_ptr, h_ptr, gu_ptr, order_ptr, tile_expert_ptr, tile_start_ptr, offsets_ptr,
    num_experts, top_k, N, K, n_blocks, sxt, sxk, swe, swn, swk, shr, sgr,
    STORE_PREACT: tl.constexpr, B_TMA: tl.constexpr, K_MAJOR: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr, ACC_IN_DOT: tl.constexpr,
):
    """``h[r, n] = silu(x[t] . w[e, n]) * (x[t] . w[e, N + n])`` for sorted rows r of expert e, t the
    token of r (the gather is the A operand's load); ``gu[r]`` the two projections when STORE_PREACT.
    B_TMA: both halves of ``w[e]`` by TMA (:func:`_weight_desc` over its 2N rows: a gate block past N
    reads up rows, whose columns are not stored)."""
    ks = tl.arange(0, BLOCK_K)
    if B_TMA:
        w_desc = _weight_desc(w_ptr, num_experts, 2 * N, K, swe, swk, swn, K_MAJOR, BLOCK_N, BLOCK_K)
    for item in tl.range(tl.program_id(0), _items(tile_start_ptr, num_experts, n_blocks), tl.num_programs(0)):
        pid_m, pid_n = item // n_blocks, item % n_blocks
        expert = tl.load(tile_expert_ptr + pid_m)
        end = tl.load(offsets_ptr + expert + 1)
        row0 = tl.load(offsets_ptr + expert) + (pid_m - tl.load(tile_start_ptr + expert)) * BLOCK_M
        rows, row_mask, cols, col_mask = _tile(row0, end, pid_n, N, BLOCK_M, BLOCK_N)
        token = tl.load(order_ptr + rows, mask=row_mask, other=0) // top_k
        a_ptrs = x_ptr + token[:, None] * sxt + ks[None, :] * sxk
        n0 = pid_n * BLOCK_N
        if not B_TMA:
            g_ptrs = w_ptr + expert.to(tl.int64) * swe + cols[None, :] * swn + ks[:, None] * swk
            u_ptrs = g_ptrs + N * swn
        gate = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        up = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k_mask = ks < K - k0
            a = tl.load(a_ptrs, mask=row_mask[:, None] & k_mask[None, :], other=0.0)
            if B_TMA:
                g = _weight_block(w_desc, expert, n0, k0, K_MAJOR, BLOCK_N, BLOCK_K)
                u = _weight_block(w_desc, expert, N + n0, k0, K_MAJOR, BLOCK_N, BLOCK_K)
            else:
                b_mask = k_mask[:, None] & col_mask[None, :]
                g = tl.load(g_ptrs, mask=b_mask, other=0.0)
                u = tl.load(u_ptrs, mask=b_mask, other=0.0)
                g_ptrs += BLOCK_K * swk
                u_ptrs += BLOCK_K * swk
            gate = _mma(gate, a, g, DOT_PRECISION, DOT_UPCAST, ACC_IN_DOT)
            up = _mma(up, a, u, DOT_PRECISION, DOT_UPCAST, ACC_IN_DOT)
            a_ptrs += BLOCK_K * sxk
        mask = row_mask[:, None] & col_mask[None, :]
        h = gate * tl.sigmoid(gate) * up
        tl.store(h_ptr + rows[:, None] * shr + cols[None, :], h.to(h_ptr.dtype.element_ty), mask=mask)
        if STORE_PREACT:
            gu = gu_ptr + rows[:, None] * sgr + cols[None, :]
            tl.store(gu, gate.to(gu_ptr.dtype.element_ty), mask=mask)
            tl.store(gu + N, up.to(gu_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _pairs_epilogue(acc, out_ptr, scale_ptr, pair, row_mask, cols, col_mask, sor, HAS_SCALE: tl.constexpr):
    """``out[pair] = scale[pair] * acc`` (HAS_SCALE) or ``acc``, the tile's rows' pairs loaded by the kernel itself
    (:func:`_tile`)."""
    if HAS_SCALE:
        acc *= tl.load(scale_ptr + pair, mask=row_mask, other=0.0).to(tl.float32)[:, None]
    tl.store(out_ptr + pair[:, None] * sor + cols[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=row_mask[:, None] & col_mask[None, :])


@triton.jit
def _rows_to_pairs_kernel(
    a_ptr, w_ptr, scale_ptr, out_ptr, order_ptr, tile_expert_ptr, tile_start_ptr, offsets_ptr,
    num_experts, num_rows, N, K, n_blocks, sar, sak, swe, swk, swn, sor,
    HAS_SCALE: tl.constexpr, A_TMA: tl.constexpr, B_TMA: tl.constexpr, K_MAJOR: tl.constexpr,
    HALF_TILES: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr, ACC_IN_DOT: tl.constexpr,
):
    """``out[p, n] = scale[p] * sum_k a[r, k] * w[e, k, n]`` for sorted rows r of expert e, p = order[r]
    its (token, slot) pair: each pair's row is written once (no atomics), the caller sums the slots.
    A_TMA: the tile's rows of ``a`` (``num_rows`` in all) by TMA, the next expert's first rows with them
    when the tile is the expert's last (computed, never stored). HALF_TILES: an expert's last tile whose rows fill
    at most half of it is computed BLOCK_M // 2 rows high (the rows past the expert's are work a full tile computes
    and never stores). The test sits in the kernel's own body, where ``HALF_TILES and ...`` folds to a constexpr
    False when HALF_TILES is off and the half-height path is not compiled (a jit helper's result is a runtime
    value: both paths would be)."""
    a, w = _operands(a_ptr, num_rows, K, sar, w_ptr, num_experts, N, swe, swk, swn, A_TMA, B_TMA, K_MAJOR, BLOCK_M,
                     BLOCK_N, BLOCK_K)
    if HALF_TILES and A_TMA:
        a_half = tl.make_tensor_descriptor(a_ptr, shape=[num_rows, K], strides=[sar, 1],
                                           block_shape=[BLOCK_M // 2, BLOCK_K])
    else:
        a_half = a
    for item in tl.range(tl.program_id(0), _items(tile_start_ptr, num_experts, n_blocks), tl.num_programs(0)):
        pid_m, pid_n = item // n_blocks, item % n_blocks
        expert = tl.load(tile_expert_ptr + pid_m)
        end = tl.load(offsets_ptr + expert + 1)
        row0 = tl.load(offsets_ptr + expert) + (pid_m - tl.load(tile_start_ptr + expert)) * BLOCK_M
        # each branch names its own tiles: names both branches assign must have one type (shape) in Triton
        if HALF_TILES and end - row0 <= BLOCK_M // 2:
            half_rows, half_mask, half_cols, half_col_mask = _tile(row0, end, pid_n, N, BLOCK_M // 2, BLOCK_N)
            half_pair = tl.load(order_ptr + half_rows, mask=half_mask, other=0)
            half_acc = _gemm_tile(a_half, half_rows, half_mask, sar, sak, row0.to(tl.int32), w, expert, swe, swk, swn,
                                  half_cols, half_col_mask, pid_n * BLOCK_N, K, A_TMA, B_TMA, K_MAJOR, BLOCK_M // 2,
                                  BLOCK_N, BLOCK_K, DOT_PRECISION, DOT_UPCAST, ACC_IN_DOT)
            _pairs_epilogue(half_acc, out_ptr, scale_ptr, half_pair, half_mask, half_cols, half_col_mask, sor,
                            HAS_SCALE)
        else:
            rows, row_mask, cols, col_mask = _tile(row0, end, pid_n, N, BLOCK_M, BLOCK_N)
            pair = tl.load(order_ptr + rows, mask=row_mask, other=0)
            acc = _gemm_tile(a, rows, row_mask, sar, sak, row0.to(tl.int32), w, expert, swe, swk, swn, cols, col_mask,
                             pid_n * BLOCK_N, K, A_TMA, B_TMA, K_MAJOR, BLOCK_M, BLOCK_N, BLOCK_K, DOT_PRECISION,
                             DOT_UPCAST, ACC_IN_DOT)
            _pairs_epilogue(acc, out_ptr, scale_ptr, pair, row_mask, cols, col_mask, sor, HAS_SCALE)


@triton.jit
def _row_blocks(a_ptr, b_ptr, r0, end, sar, sbr, ms, ns, M, N, BLOCK_K: tl.constexpr):
    """Rows ``r0 .. r0 + BLOCK_K`` of ``a`` (columns ``ms``) and ``b`` (columns ``ns``) through pointers, zeros
    at and past row ``end`` and past the last columns: [BLOCK_K, BLOCK_M] and [BLOCK_K, BLOCK_N]."""
    rows = (r0 + tl.arange(0, BLOCK_K)).to(tl.int64)
    r_mask = rows < end
    a = tl.load(a_ptr + rows[:, None] * sar + ms[None, :], mask=r_mask[:, None] & (ms < M)[None, :], other=0.0)
    b = tl.load(b_ptr + rows[:, None] * sbr + ns[None, :], mask=r_mask[:, None] & (ns < N)[None, :], other=0.0)
    return a, b


@triton.jit
def _weight_grad_kernel(
    a_ptr, b_ptr, out_ptr, offsets_ptr, num_experts, num_rows, M, N, m_blocks, n_blocks, sar, sbr, soe, som,
    TMA: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr, ACC_IN_DOT: tl.constexpr,
):
    """``out[e] = a[r]^T @ b[r]`` over the sorted rows r of expert e (``offsets[e]`` to ``offsets[e + 1]``): ``a``
    [num_rows, M] and ``b`` [num_rows, N] with unit column strides, ``out`` [E, M, N] with a unit column stride.
    Work items are (expert, M tile, N tile), item i of expert ``i // (m_blocks * n_blocks)``, program p taking
    items p, p + P, ...: a tile's whole reduction, all of its expert's rows, in one fp32 accumulator, so every
    weight element is written once (no atomics, no partial sums; an expert without rows gets zeros).
    TMA: the blocks of rows that lie wholly in the expert come by TMA through one descriptor per operand; the
    last, partial block (whose rows past the expert's are the next expert's) through masked pointers."""
    if TMA:
        a_desc = tl.make_tensor_descriptor(a_ptr, shape=[num_rows, M], strides=[sar, 1],
                                           block_shape=[BLOCK_K, BLOCK_M])
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[num_rows, N], strides=[sbr, 1],
                                           block_shape=[BLOCK_K, BLOCK_N])
    per_expert = m_blocks * n_blocks
    for item in tl.range(tl.program_id(0), num_experts * per_expert, tl.num_programs(0)):
        expert = item // per_expert
        pid_m = item % per_expert // n_blocks
        pid_n = item % n_blocks
        first = tl.load(offsets_ptr + expert).to(tl.int32)
        end = tl.load(offsets_ptr + expert + 1).to(tl.int32)
        m0, n0 = pid_m * BLOCK_M, pid_n * BLOCK_N
        ms = m0 + tl.arange(0, BLOCK_M)
        ns = n0 + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        if TMA:
            whole = first + (end - first) // BLOCK_K * BLOCK_K
            for r0 in range(first, whole, BLOCK_K):
                acc = _mma(acc, tl.trans(a_desc.load([r0, m0])), b_desc.load([r0, n0]), DOT_PRECISION, DOT_UPCAST,
                           ACC_IN_DOT)
            if whole < end:
                a, b = _row_blocks(a_ptr, b_ptr, whole, end, sar, sbr, ms, ns, M, N, BLOCK_K)
                acc = _mma(acc, tl.trans(a), b, DOT_PRECISION, DOT_UPCAST, ACC_IN_DOT)
        else:
            for r0 in range(first, end, BLOCK_K):
                a, b = _row_blocks(a_ptr, b_ptr, r0, end, sar, sbr, ms, ns, M, N, BLOCK_K)
                acc = _mma(acc, tl.trans(a), b, DOT_PRECISION, DOT_UPCAST, ACC_IN_DOT)
        tl.store(out_ptr + expert.to(tl.int64) * soe + ms[:, None].to(tl.int64) * som + ns[None, :],
                 acc.to(out_ptr.dtype.element_ty), mask=(ms < M)[:, None] & (ns < N)[None, :])


# Triton specializes an integer argument of 1 into a constant: with one M tile and one N tile an expert (m_blocks
# and n_blocks 1) the warp-specialized kernel so compiled stored the second consumer group's rows wrong (Triton 3.6,
# H200: rows 128-255 of a 256-row tile); the counts stay runtime values
@triton.jit(do_not_specialize=["num_experts", "m_blocks", "n_blocks"])
def _padded_weight_grad_kernel(
    a_ptr, b_ptr, out_ptr, offsets_ptr, padded_ptr, num_experts, a_rows, b_rows, M, N, m_blocks, n_blocks, sar, sbr,
    PADDED_A: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr, DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr, ACC_IN_DOT: tl.constexpr,
):
    """``out[e] = a[rows of e]^T @ b[rows of e]``, ``out`` [E, M, N] contiguous with M a multiple of BLOCK_M, one
    operand's rows in the sorted order (expert e's from ``offsets[e]``), the other's in the padded order that
    ``_gather_token_rows_kernel`` writes with PAD = BLOCK_K (expert e's from ``padded[e]``, a multiple of BLOCK_K, its
    rows past the expert's count zero): ``a`` when PADDED_A, else ``b``.

    Every block of BLOCK_K rows comes by TMA: the padded operand's blocks start at its expert's rows and end in its
    zeros, so the rows the sorted operand's last block reads past its expert's (the next expert's, or zeros past
    the tensor) add nothing. (A product of zero and an infinity is nan: an infinity in the sorted operand's rows of
    the next expert, itself a non-finite gradient, reaches this expert's too.) With every load by TMA the item loop
    can be warp-specialized (WARP_SPECIALIZE, Triton's Hopper pass): a producer warp loads ahead across items while
    the consumer warp groups compute and store, so the next item's loads are in flight during this item's last
    products and store. An expert's reduction is short (about 256 rows an expert at Qwen3-30B-A3B's layer):
    without that overlap each item waits for its first blocks. Items (expert, M tile, N tile) as in
    ``_weight_grad_kernel``; an expert without rows gets zeros."""
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[a_rows, M], strides=[sar, 1], block_shape=[BLOCK_K, BLOCK_M])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[b_rows, N], strides=[sbr, 1], block_shape=[BLOCK_K, BLOCK_N])
    # [E * M, N]: a tile never crosses experts (M a multiple of BLOCK_M); the columns past N are clipped
    out_desc = tl.make_tensor_descriptor(out_ptr, shape=[num_experts * M, N], strides=[N, 1],
                                         block_shape=[BLOCK_M, BLOCK_N])
    per_expert = m_blocks * n_blocks
    for item in tl.range(tl.program_id(0), num_experts * per_expert, tl.num_programs(0),
                         warp_specialize=WARP_SPECIALIZE):
        expert = item // per_expert
        m0 = item % per_expert // n_blocks * BLOCK_M
        n0 = item % n_blocks * BLOCK_N
        first = tl.load(offsets_ptr + expert).to(tl.int32)
        steps = tl.cdiv(tl.load(offsets_ptr + expert + 1).to(tl.int32) - first, BLOCK_K)
        padded = tl.load(padded_ptr + expert)
        if PADDED_A:
            a0, b0 = padded, first
        else:
            a0, b0 = first, padded
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        for step in range(steps):
            r = step * BLOCK_K
            acc = _mma(acc, tl.trans(a_desc.load([a0 + r, m0])), b_desc.load([b0 + r, n0]), DOT_PRECISION,
                       DOT_UPCAST, ACC_IN_DOT)
        out_desc.store([expert * M + m0, n0], acc.to(out_ptr.dtype.element_ty))


@triton.jit
def _gather_token_rows_kernel(
    x_ptr, g_ptr, scale_ptr, order_ptr, offsets_ptr, padded_ptr, x_out_ptr, g_out_ptr, rows, num_experts, top_k, H,
    sxt, sxk, sgt, sgk, sxo, sgo, PAD: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """For sorted rows r (p = order[r] its pair, t = p // top_k its token): ``x_out[r] = x[t]`` and
    ``g_out[r] = g[t] * scale[p]``, the product in fp32 rounded once to ``g_out``'s dtype.

    PAD > 1: the output rows in the padded order instead, each expert's rows from a multiple of PAD rows (the
    experts' padded starts, in order, their counts rounded up to PAD), the rows up to the next start zero; every
    program computes the starts from ``offsets``, program 0 writes them to ``padded`` [E + 1] (the last entry
    all the padded rows). ``rows`` then bounds the padded rows (the programs past their end write nothing)."""
    pid = tl.program_id(0)
    q = (pid * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    if PAD == 1:
        q_mask = q < rows
        r = q
        r_mask = q_mask
    else:
        experts = tl.arange(0, BLOCK_E)
        known = experts < num_experts
        first = tl.load(offsets_ptr + experts, mask=known, other=0)
        count = tl.load(offsets_ptr + experts + 1, mask=known, other=0) - first
        padded_count = (count + PAD - 1) // PAD * PAD
        padded_end = tl.cumsum(padded_count, axis=0)
        padded_start = padded_end - padded_count
        if pid == 0:
            tl.store(padded_ptr + experts, padded_start.to(tl.int32), mask=known)
            tl.store(padded_ptr + num_experts, tl.sum(padded_count, axis=0).to(tl.int32))
        q_mask = q < tl.sum(padded_count, axis=0)
        # q's expert: the experts that end at or before it (those without rows included) are before it
        expert = tl.sum(((padded_end[None, :] <= q[:, None]) & known[None, :]).to(tl.int32), axis=1)
        mine = experts[None, :] == expert[:, None]
        j = q - tl.sum(tl.where(mine, padded_start[None, :], 0), axis=1)
        r = tl.sum(tl.where(mine, first[None, :], 0), axis=1) + j
        r_mask = q_mask & (j < tl.sum(tl.where(mine, count[None, :], 0), axis=1))
    pair = tl.load(order_ptr + r, mask=r_mask, other=0)
    token = pair // top_k
    scale = tl.load(scale_ptr + pair, mask=r_mask, other=0).to(tl.float32)
    cols = tl.arange(0, BLOCK_H)
    for h0 in range(0, H, BLOCK_H):
        c = h0 + cols
        mask = q_mask[:, None] & (c < H)[None, :]
        read = r_mask[:, None] & (c < H)[None, :]
        x = tl.load(x_ptr + token[:, None] * sxt + c[None, :] * sxk, mask=read, other=0)
        tl.store(x_out_ptr + q[:, None] * sxo + c[None, :], x, mask=mask)
        g = tl.load(g_ptr + token[:, None] * sgt + c[None, :] * sgk, mask=read, other=0).to(tl.float32)
        tl.store(g_out_ptr + q[:, None] * sgo + c[None, :], (g * scale[:, None]).to(g_out_ptr.dtype.element_ty),
                 mask=mask)


@triton.jit
def _slot_sums_kernel(rows_ptr, out_ptr, N, TOP_K: tl.constexpr, BLOCK: tl.constexpr):
    """``out[t] = sum_j rows[t, j]`` over a contiguous ``[T, TOP_K, N]`` buffer: the slots added in order in fp32,
    rounded once to ``out``'s dtype. The slots unrolled (``TOP_K`` a constexpr): their loads are in flight at once."""
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    row = rows_ptr + t * TOP_K * N + cols
    acc = tl.load(row, mask=mask, other=0.0).to(tl.float32)
    for j in tl.static_range(1, TOP_K):
        acc += tl.load(row + j * N, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * N + cols, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _expert_tiles_kernel(offsets_ptr, tile_expert_ptr, tile_start_ptr, num_experts,
                         BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_T: tl.constexpr):
    """The tile tables of M tiles of BLOCK_M sorted rows: program e <= E writes ``tile_start[e]``, the tiles of the
    experts before it (``tile_start[E]`` all of them, the GEMM kernels' loop bound), and program e < E writes
    ``tile_expert[t] = e`` for its own tiles. Every program sums the experts' tile counts itself."""
    e = tl.program_id(0)
    experts = tl.arange(0, BLOCK_E)
    known = experts < num_experts
    counts = tl.load(offsets_ptr + experts + 1, mask=known, other=0) - tl.load(offsets_ptr + experts, mask=known,
                                                                                other=0)
    per_expert = ((counts + BLOCK_M - 1) // BLOCK_M).to(tl.int32)
    start = tl.sum(tl.where(experts < e, per_expert, 0), axis=0)
    end = start + tl.sum(tl.where(experts == e, per_expert, 0), axis=0)  # program E: no tiles of its own
    tl.store(tile_start_ptr + e, start)
    lanes = tl.arange(0, BLOCK_T)
    for t0 in range(start, end, BLOCK_T):
        t = t0 + lanes
        tl.store(tile_expert_ptr + t, e, mask=t < end)


@triton.jit
def _gathered_gemm_kernel(
    a_ptr, w_ptr, out_ptr, order_ptr, tile_expert_ptr, tile_start_ptr, offsets_ptr,
    num_experts, top_k, N, K, n_blocks, sat, sak, swe, swk, swn, sor,
    B_TMA: tl.constexpr, K_MAJOR: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr, ACC_IN_DOT: tl.constexpr,
):
    """``out[r, n] = sum_k a[t, k] * w[e, k, n]`` for sorted rows r of expert e, t = order[r] // top_k the token of
    r (the gather is the A operand's load), stored in sorted order."""
    a, w = _operands(a_ptr, 0, K, sat, w_ptr, num_experts, N, swe, swk, swn, False, B_TMA, K_MAJOR, BLOCK_M, BLOCK_N,
                     BLOCK_K)
    for item in tl.range(tl.program_id(0), _items(tile_start_ptr, num_experts, n_blocks), tl.num_programs(0)):
        pid_m, pid_n = item // n_blocks, item % n_blocks
        expert = tl.load(tile_expert_ptr + pid_m)
        end = tl.load(offsets_ptr + expert + 1)
        row0 = tl.load(offsets_ptr + expert) + (pid_m - tl.load(tile_start_ptr + expert)) * BLOCK_M
        rows, row_mask, cols, col_mask = _tile(row0, end, pid_n, N, BLOCK_M, BLOCK_N)
        token = tl.load(order_ptr + rows, mask=row_mask, other=0) // top_k
        acc = _gemm_tile(a, token, row_mask, sat, sak, 0, w, expert, swe, swk, swn, cols, col_mask, pid_n * BLOCK_N,
                         K, False, B_TMA, K_MAJOR, BLOCK_M, BLOCK_N, BLOCK_K, DOT_PRECISION, DOT_UPCAST, ACC_IN_DOT)
        tl.store(out_ptr + rows[:, None] * sor + cols[None, :], acc.to(out_ptr.dtype.element_ty),
                 mask=row_mask[:, None] & col_mask[None, :])


@triton.jit
def _swiglu_grad_kernel(
    d_ptr, gu_ptr, h_ptr, scale_ptr, dgu_ptr, dscale_ptr, order_ptr, rows, N, sdr, sgr, shr, sdgr,
    BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """For sorted rows r, p = order[r] their pairs, in fp32: ``dscale[p] = d[r] . h[r]`` (the routing weight's
    gradient) and ``dgu[r] = (d * scale[p] * u * silu'(g), d * scale[p] * silu(g))`` (the SwiGLU's, ``g`` and ``u``
    the saved projections ``gu[r]``), each row's N columns a loop of BLOCK_N."""
    pid = tl.program_id(0)
    r = (pid * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    r_mask = r < rows
    pair = tl.load(order_ptr + r, mask=r_mask, other=0)
    scale = tl.load(scale_ptr + pair, mask=r_mask, other=0.0).to(tl.float32)[:, None]
    dot = tl.zeros([BLOCK_R], tl.float32)
    cols = tl.arange(0, BLOCK_N)
    for n0 in range(0, N, BLOCK_N):
        c = n0 + cols
        mask = r_mask[:, None] & (c < N)[None, :]
        d = tl.load(d_ptr + r[:, None] * sdr + c[None, :], mask=mask, other=0.0).to(tl.float32)
        h = tl.load(h_ptr + r[:, None] * shr + c[None, :], mask=mask, other=0.0).to(tl.float32)
        gu = gu_ptr + r[:, None] * sgr + c[None, :]
        gate = tl.load(gu, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(gu + N, mask=mask, other=0.0).to(tl.float32)
        dot += tl.sum(d * h, axis=1)
        dh = d * scale
        silu, slope = _act_terms(gate, 0.0, 0.0, _SILU)  # silu(g), silu'(g), as the gated activations' backward
        dgu = dgu_ptr + r[:, None] * sdgr + c[None, :]
        tl.store(dgu, (dh * up * slope).to(dgu_ptr.dtype.element_ty), mask=mask)
        tl.store(dgu + N, (dh * silu).to(dgu_ptr.dtype.element_ty), mask=mask)
    tl.store(dscale_ptr + pair, dot, mask=r_mask)
