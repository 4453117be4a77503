"""The experts' weight gradients over the padded rows as a warp-specialized Gluon kernel, which :mod:`.moe_gemm`
launches on Hopper GPUs where the experts' reductions are short (``GLUON_ROWS_PER_EXPERT``); its Triton form,
``_padded_weight_grad_kernel``, runs elsewhere, and under the interpreter, which does not run Gluon.

Why Gluon: Triton 3.6's automatic warp specialization of the same loop has its consumer warps store each tile and
wait for the store at once (``async_tma_store_wait {pendings = 0}`` right after the store in the compiled TTGIR),
and both consumer groups share every tile, so the tensor cores idle through each epilogue. Here two product warp
groups take the items in turn (CUTLASS calls it ping-pong) and a store's wait is deferred to the buffer's next use.
docs/performance.md has the measurements."""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

# Triton 3.7 renamed the TMA copies (the old names raise)
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
_warps_barrier = getattr(gl, "thread_barrier", None) or gl.barrier  # renamed likewise


@gluon.jit
def _item(idx, offsets_ptr, padded_ptr, num_experts, m_blocks, n_blocks, PADDED_A: gl.constexpr,
          BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr):
    """This program's item ``idx`` (the grid's item ``pid + idx * nprog``): (items of the program, expert, first
    weight row, first weight column, ``a``'s first row, ``b``'s first row, reduction steps)."""
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    per_expert = m_blocks * n_blocks
    items = gl.cdiv(num_experts * per_expert - pid, nprog)
    item = pid + idx * nprog
    expert = item // per_expert
    m0 = item % per_expert // n_blocks * BLOCK_M
    n0 = item % n_blocks * BLOCK_N
    first = gl.load(offsets_ptr + expert).to(gl.int32)
    steps = gl.cdiv(gl.load(offsets_ptr + expert + 1).to(gl.int32) - first, BLOCK_K)
    padded = gl.load(padded_ptr + expert)
    if PADDED_A:
        a0, b0 = padded, first
    else:
        a0, b0 = first, padded
    return items, expert, m0, n0, a0, b0, steps


@gluon.jit
def _load_partition(a_desc, b_desc, a_bufs, b_bufs, ready, empty, offsets_ptr, padded_ptr, num_experts, m_blocks,
                    n_blocks, PADDED_A: gl.constexpr, STAGES: gl.constexpr):
    """The loading warp: every block pair of the program's items, in order, into the stage ring; a stage once the
    products have released it."""
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[1]
    items = _item(0, offsets_ptr, padded_ptr, num_experts, m_blocks, n_blocks, PADDED_A, BLOCK_M, BLOCK_N,
                  BLOCK_K)[0]
    load = 0
    for j in range(items):
        _, _, m0, n0, a0, b0, steps = _item(j, offsets_ptr, padded_ptr, num_experts, m_blocks, n_blocks, PADDED_A,
                                            BLOCK_M, BLOCK_N, BLOCK_K)
        for k in range(steps):
            stage = load % STAGES
            # the stage's previous blocks released (a fresh barrier passes the wait for the phase before its first)
            mbarrier.wait(empty.index(stage), (load // STAGES & 1) ^ 1)
            bar = ready.index(stage)
            mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            _tma_load(a_desc, [a0 + k * BLOCK_K, m0], bar, a_bufs.index(stage))
            _tma_load(b_desc, [b0 + k * BLOCK_K, n0], bar, b_bufs.index(stage))
            load += 1


@gluon.jit
def _product_partition(a_bufs, b_bufs, c_smem, ready, empty, turn, out_desc, offsets_ptr, padded_ptr, num_experts,
                        M, m_blocks, n_blocks, PADDED_A: gl.constexpr, STAGES: gl.constexpr, WHICH: gl.constexpr,
                        num_warps: gl.constexpr):
    """One of the two product warp groups, which take the program's items in turn (WHICH: the even ones or the
    odd; a group's own items' blocks in order, the other's skipped in the count): while one converts and stores its
    tile the other's products run. A stage goes back to the loading warp once the product after it is issued, and
    a tile is stored without waiting: the wait comes before the group's next tile is written to its buffer.

    A group waits for its turn (the other group has issued its item's last product) before its item's blocks: then
    every earlier fill of each stage is complete, and a wait for a stage's fill cannot be met by the parity of the
    fill two rounds before it (which a group running an item ahead would otherwise see)."""
    BLOCK_K: gl.constexpr = a_bufs.shape[1]
    BLOCK_M: gl.constexpr = a_bufs.shape[2]
    BLOCK_N: gl.constexpr = b_bufs.shape[2]
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, BLOCK_N, 16])
    items = _item(0, offsets_ptr, padded_ptr, num_experts, m_blocks, n_blocks, PADDED_A, BLOCK_M, BLOCK_N,
                  BLOCK_K)[0]
    used = 0
    mine = 0
    for j in range(items):
        _, expert, m0, n0, _, _, steps = _item(j, offsets_ptr, padded_ptr, num_experts, m_blocks, n_blocks, PADDED_A,
                                               BLOCK_M, BLOCK_N, BLOCK_K)
        if j % 2 == WHICH:
            # the other group's turn ends with its item's last product issued (the first item's wait passes)
            mbarrier.wait(turn.index(WHICH), (mine & 1) ^ (1 - WHICH))
            acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, acc_layout)
            for k in range(steps):
                stage = used % STAGES
                mbarrier.wait(ready.index(stage), used // STAGES & 1)
                acc = warpgroup_mma(a_bufs.index(stage).permute((1, 0)), b_bufs.index(stage), acc, is_async=True)
                acc = warpgroup_mma_wait(1, deps=[acc])
                _warps_barrier()
                mbarrier.arrive(empty.index((used + STAGES - 1) % STAGES), pred=k > 0)
                used += 1
            mbarrier.arrive(turn.index(1 - WHICH))
            acc = warpgroup_mma_wait(0, deps=[acc])
            _warps_barrier()
            mbarrier.arrive(empty.index((used + STAGES - 1) % STAGES), pred=steps > 0)
            tma.store_wait(pendings=0)  # this group's previous tile has left the buffer
            c_smem.store(acc.to(c_smem.dtype))
            fence_async_shared()
            _tma_store(out_desc, [expert * M + m0, n0], c_smem)
            mine += 1
        else:
            used += steps
    tma.store_wait(pendings=0)


@gluon.jit(do_not_specialize=["num_experts", "M", "m_blocks", "n_blocks"])
def _padded_weight_grad_gluon_kernel(a_desc, b_desc, out_desc, offsets_ptr, padded_ptr, num_experts, M, m_blocks,
                                     n_blocks, PADDED_A: gl.constexpr, STAGES: gl.constexpr,
                                     num_warps: gl.constexpr):
    """``out[e] = a[rows of e]^T @ b[rows of e]`` as ``_padded_weight_grad_kernel`` computes it (its docstring has
    the operands' two row orders and the items), ``out_desc`` over ``[E * M, N]``, one program an SM: a loading
    warp fills a ring of STAGES block pairs across items, and two product warp groups (``num_warps`` each) take the
    items in turn, so that one group's epilogue and store overlap the other's products."""
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[1]
    dtype: gl.constexpr = a_desc.dtype
    a_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_K, BLOCK_M], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_K, BLOCK_N], b_desc.layout)
    c_bufs = gl.allocate_shared_memory(dtype, [2, BLOCK_M, BLOCK_N], out_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    for i in gl.static_range(2):
        mbarrier.init(turn.index(i), count=1)
    gl.warp_specialize([
        (_product_partition, (a_bufs, b_bufs, c_bufs.index(0), ready, empty, turn, out_desc, offsets_ptr, padded_ptr,
                              num_experts, M, m_blocks, n_blocks, PADDED_A, STAGES, 0, num_warps)),
        (_product_partition, (a_bufs, b_bufs, c_bufs.index(1), ready, empty, turn, out_desc, offsets_ptr, padded_ptr,
                              num_experts, M, m_blocks, n_blocks, PADDED_A, STAGES, 1, num_warps)),
        (_load_partition, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, offsets_ptr, padded_ptr, num_experts,
                           m_blocks, n_blocks, PADDED_A, STAGES)),
    ], [num_warps, 1], [232, 24])  # registers a thread: the other product group's, the loading warp's
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))
        mbarrier.invalidate(empty.index(i))
    for i in gl.static_range(2):
        mbarrier.invalidate(turn.index(i))
