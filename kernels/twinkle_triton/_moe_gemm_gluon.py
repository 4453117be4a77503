"""The experts' weight gradients over the padded rows as a warp-specialized Gluon kernel for Hopper."""

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
def _mma_partition(a_bufs, b_bufs, c_smem, ready, empty, out_desc, offsets_ptr, padded_ptr, num_experts, M, m_blocks,
                   n_blocks, PADDED_A: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr):
    """The product warps: each item's blocks as they arrive, a stage released once the product after it is issued,
    and the tile stored without waiting for it: the wait comes before the next tile is written to the buffer."""
    BLOCK_K: gl.constexpr = a_bufs.shape[1]
    BLOCK_M: gl.constexpr = a_bufs.shape[2]
    BLOCK_N: gl.constexpr = b_bufs.shape[2]
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, BLOCK_N, 16])
    items = _item(0, offsets_ptr, padded_ptr, num_experts, m_blocks, n_blocks, PADDED_A, BLOCK_M, BLOCK_N,
                  BLOCK_K)[0]
    used = 0
    for j in range(items):
        _, expert, m0, n0, _, _, steps = _item(j, offsets_ptr, padded_ptr, num_experts, m_blocks, n_blocks, PADDED_A,
                                               BLOCK_M, BLOCK_N, BLOCK_K)
        acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, acc_layout)
        for k in range(steps):
            stage = used % STAGES
            mbarrier.wait(ready.index(stage), used // STAGES & 1)
            acc = warpgroup_mma(a_bufs.index(stage).permute((1, 0)), b_bufs.index(stage), acc, is_async=True)
            acc = warpgroup_mma_wait(1, deps=[acc])
            # every warp group's product before this one is done: its stage goes back to the loading warp
            _warps_barrier()
            mbarrier.arrive(empty.index((used + STAGES - 1) % STAGES), pred=k > 0)
            used += 1
        acc = warpgroup_mma_wait(0, deps=[acc])
        _warps_barrier()
        mbarrier.arrive(empty.index((used + STAGES - 1) % STAGES), pred=steps > 0)
        tma.store_wait(pendings=0)  # the previous tile has left the buffer
        c_smem.store(acc.to(c_smem.dtype))
        fence_async_shared()
        _tma_store(out_desc, [expert * M + m0, n0], c_smem)
    tma.store_wait(pendings=0)


@gluon.jit(do_not_specialize=["num_experts", "M", "m_blocks", "n_blocks"])
def _padded_weight_grad_gluon_kernel(a_desc, b_desc, out_desc, offsets_ptr, padded_ptr, num_experts, M, m_blocks,
                                     n_blocks, PADDED_A: gl.constexpr, STAGES: gl.constexpr,
                                     num_warps: gl.constexpr):
    """``out[e] = a[rows of e]^T @ b[rows of e]`` as ``_padded_weight_grad_kernel`` computes it (its docstring has
    the operands' two row orders and the items), ``out_desc`` over ``[E * M, N]``, one program an SM: a loading
    warp runs up to STAGES blocks ahead of the product warps across items, and a tile's store drains while the next
    item's products run (Triton's own warp specialization waits for each store at once)."""
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[1]
    dtype: gl.constexpr = a_desc.dtype
    a_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_K, BLOCK_M], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_K, BLOCK_N], b_desc.layout)
    c_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, BLOCK_N], out_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    gl.warp_specialize([
        (_mma_partition, (a_bufs, b_bufs, c_smem, ready, empty, out_desc, offsets_ptr, padded_ptr, num_experts, M,
                          m_blocks, n_blocks, PADDED_A, STAGES, num_warps)),
        (_load_partition, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, offsets_ptr, padded_ptr, num_experts,
                           m_blocks, n_blocks, PADDED_A, STAGES)),
    ], [1], [24])
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))
        mbarrier.invalidate(empty.index(i))
