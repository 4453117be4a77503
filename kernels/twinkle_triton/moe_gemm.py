"""The experts of a mixture-of-experts layer as fused grouped GEMMs: ``moe_swiglu_experts``.

For T tokens each routed to ``k`` of E experts (transformers' ``*Experts`` layout: ``gate_up_proj``
``[E, 2I, H]`` with gate rows first, ``down_proj`` ``[E, H, I]``), token t's output is
``sum_j w[t, j] * down[e_j] @ (silu(gate[e_j] @ x[t]) * (up[e_j] @ x[t]))``. Four Triton kernels
(``_moe_gemm_kernels.py``) compute it and its gradients, the forward without a permuted copy of the
tokens (the weight gradients from copies in sorted order):

- **schedule.** The ``S = T * k`` (token, slot) pairs are sorted by expert (``torch.sort``, stable, on
  one-byte keys where E allows, once in the forward, whose order the backward reuses: :class:`_Routing`);
  ``order[r]`` is the pair of sorted row r. Each expert's rows are cut into M tiles of ``BLOCK_M``, and
  tables built on the device by one kernel (``_expert_tiles_kernel``, once per pass and tile height:
  :meth:`_Routing.tiles`) say which expert and rows a tile has, and how many tiles there are. The
  grid is fixed from shapes alone: a program for each (M tile, N tile) item of a bound on the M tiles,
  ``min(S, (S + E * (BLOCK_M - 1)) // BLOCK_M)`` (each expert adds at most one partial tile; each tile
  holds a row), or one program an SM (``PROGRAMS_PER_SM`` in :data:`CONFIGS`); each program loops over
  the items it is dealt up to the count the tables hold. Nothing reads a count on the host: no sync in
  forward or backward, so the ops run inside CUDA graphs and torch.compile. Items of one M tile are
  adjacent, and so run at once on neighbouring programs: its gathered A rows are reused from L2.
- **gate/up** (``_gate_up_kernel``): the A operand's load reads ``x[order[r] // k]`` (the gather is
  in the load), both halves of ``gate_up_proj[e]`` are B operands of one K loop, and the epilogue
  writes ``h = silu(gate) * up`` ``[S, I]`` in sorted order, plus, when a gradient will be asked for,
  the projections ``[S, 2I]`` (the SwiGLU derivative's input; a backward after a forward that kept
  none, ``save_for_backward=False``, recomputes them).
- **down** (``_rows_to_pairs_kernel``): ``h @ down_proj[e].T`` times the routing weight, each row
  stored at its pair's row of a ``[T, k, H]`` buffer; one more kernel sums the k slots (``_slot_sums``).
  Deterministic by construction: every buffer row is written by one program and the sum adds the
  slots in order, in fp32, rounded once: transformers' own reduction (``view(T, k, H).sum(1)``,
  chosen there over ``index_add_`` for determinism) in one pass over the buffer. An
  atomic scatter-add into ``[T, H]`` would save that buffer's write and read (S * H elements) but
  adds in an order that changes from run to run, and in fp32 needs an extra buffer and cast anyway.
  At top-1 the buffer is the output.
- **backward.** ``_gathered_gemm_kernel`` gathers ``grad[order[r] // k]`` as the A operand against
  ``down_proj[e]``: ``d``, the gradient of the unweighted expert output, ``[S, I]`` in sorted order.
  ``_swiglu_grad_kernel`` then gives the routing weight's gradient (``d . h`` over each row) and, times the
  weight, the SwiGLU derivative on the saved projections: ``d gate_up`` ``[S, 2I]`` in sorted order
  (:func:`_grad_act` says why the two are apart). ``_rows_to_pairs_kernel`` then multiplies
  it by ``gate_up_proj[e]`` into the ``[T, k, H]`` buffer, summed over k like the forward: the
  input's gradient. Each weight's gradient per expert, over the expert's rows of ``x`` and of the weighted
  ``grad`` copied by one kernel (:data:`WEIGHT_GRAD`): ``_padded_weight_grad_kernel`` over those rows in a padded
  order (each expert's from a multiple of the reduction step, zeros to the next: every block by TMA, the item loop
  warp-specialized; on Hopper its Gluon form, :data:`GLUON_TILES`), or ``torch._grouped_mm`` over them in sorted
  order, or ``_weight_grad_kernel``, whose programs loop over (expert, weight tile) items; each tile sums all the
  expert's rows in one fp32 accumulator: no atomics, no partial sums.

Precision: ``tl.dot`` with fp32 accumulation (fp32 inputs in IEEE fp32, not TF32); ``h``, the saved
projections, ``d gate_up`` and the ``[T, k, H]`` rows are rounded to the input dtype once each, as
transformers' grouped_mm path rounds its intermediates. Routing weights may have another float dtype
(transformers' routers give fp32 or the hidden dtype); they are read in fp32 and their gradient is
returned in their dtype.

Block sizes (:data:`CONFIGS`, per kernel): each kernel's from an H200 sweep of its own time;
``tools/moe_gemm_sweep.py`` times them against transformers' ``grouped_mm`` experts and sweeps them on the
GPU. Under the Triton interpreter each kernel takes few, large tiles (``_launch.loop_block``).
"""

import torch
import torch.nn.functional as F
from torch import Tensor

from . import _launch
from ._checks import ANY_DTYPE, check_tensors
from ._launch import (cdiv, dot_options, interpreting, loop_block, next_power_of_2, persistent_programs,
                      run_with_scratch)
from ._library import define_differentiable_op, define_op, wrap_triton
from ._moe_gemm_kernels import (_expert_tiles_kernel, _gate_up_kernel, _gather_token_rows_kernel, _gathered_gemm_kernel,
                                _padded_weight_grad_kernel, _rows_to_pairs_kernel, _slot_sums_kernel,
                                _swiglu_grad_kernel, _weight_grad_kernel)
from ._torch_internals import grouped_mm

__all__ = ["CONFIGS", "moe_swiglu_experts", "moe_swiglu_experts_reference"]

# Per kernel on the GPU: BLOCK_M (sorted rows a tile; for "weight_grad" the weight's rows), BLOCK_N,
# BLOCK_K (the reduction step; for "weight_grad" rows of the expert a step), num_warps, num_stages.
# gate_up holds two accumulators (gate and up): its 128 x 128 tiles take 8 warps. Each kernel tuned on its own
# profiled time (tools/moe_gemm_sweep.py --per-kernel, H200, bf16, 4096 tokens, every gradient checked per setting;
# docs/performance/moe-gemm-per-kernel-h200.json), ms at Qwen3-30B-A3B's layer / Mixtral-8x7B's, the earlier
# 64-row, 4-warp tiles -> these: down 0.296 -> 0.274 / 2.576 -> 1.713; grad_act 0.437 -> 0.417 / 3.421 -> 2.712;
# grad_input 0.525 -> 0.404 / 6.028 -> 2.883. One more pipeline stage took gate_up 0.543 -> 0.526 / 4.335 -> 4.262.
# (grad_act then held the SwiGLU derivative in its epilogue; alone, its GEMM takes down's tiles: _grad_act.)
# "TMA": whether the kernel loads its operands by TMA where they allow it (:func:`_tma_takes`): the weights' blocks,
# and the sorted rows of down's and grad_input's A operand (the gathered token rows of gate_up and grad_act have no TMA
# form on Hopper). Measured per kernel (tools/moe_gemm_sweep.py --per-kernel --tma 0,1, H200), ms at Qwen3-30B-A3B's
# layer / Mixtral-8x7B's, pointers -> TMA: gate_up 0.523 -> 0.468 / 4.098 -> 4.048; down 0.274 -> 0.271 / 1.695 ->
# 1.399; grad_input 0.398 -> 0.425 / 2.793 -> 2.799; grad_act's GEMM alone 0.220 -> 0.229 / 1.788 -> 1.844 (its
# gathered A loads, beside a TMA-fed B operand, compile to synchronous loads).
# "PROGRAMS_PER_SM": that many programs an SM, each looping over the kernel's (M tile, N tile) items
# (:func:`_tile_launch`; a program starts its next tile without a launch of its own), or 0 for a program an item.
# Measured per kernel (tools/moe_gemm_sweep.py --per-kernel --programs-per-sm 0,1, H200,
# docs/performance/moe-gemm-persistent-h200.json), ms at Qwen3-30B-A3B's layer / Mixtral-8x7B's / ERNIE-4.5-21B-A3B's,
# a program an item -> one an SM: gate_up 0.468 -> 0.447 / 4.236 -> 3.822 / 0.758 -> 0.742; down 0.278 -> 0.247 /
# 1.432 -> 1.425 / 0.382 -> 0.349; grad_act 0.212 -> 0.207 / 1.726 -> 1.634 / 0.343 -> 0.343; grad_input 0.414 ->
# 0.408 / 2.832 -> 2.889 / 0.647 -> 0.641, so it keeps a program an item. The two loops flattened into one
# (``tl.range(flatten=True)``) spilled registers: 1.1x-7x slower.
# "weight_grad" (tools/moe_gemm_sweep.py --per-kernel --weight-grad triton --kernels weight_grad,
# docs/performance/moe-weight-grad-tiles-h200.json), ms at Qwen3-30B-A3B's layer / Mixtral-8x7B's: 128 x 128 tiles, 32
# rows a step, two looping programs an SM 0.922 / 5.476; 128 x 256, 64 rows, one an SM 1.045 / 4.689; a program an
# item 1.20 / 6.07 at the first setting. Two programs an SM overlap one's first loads and epilogue with the other's
# products: a tile reduces only its expert's rows, about 256 at Qwen3's layer. Three an SM ran 1.145 ms with 4 warps
# and 1.183 with 8 at Qwen3's layer, against 0.918 and 0.921 with two (--warps 4,8 --programs-per-sm 2,3).
# "HALF_TILES" (_rows_to_pairs_kernel's down and grad_input): an expert's last tile computed 64 rows high where its rows
# fit (tools/moe_gemm_sweep.py --per-kernel --half-tiles 0,1, H200, every gradient checked;
# docs/performance/moe-half-tiles-h200.json), ms at Qwen3-30B-A3B's layer / ERNIE-4.5-21B-A3B's, off -> on: grad_input
# 0.411 -> 0.391 / 0.668 -> 0.635; down 0.244 -> 0.239 / 0.363 -> 0.371, which keeps full tiles. The same path in the
# looping gate_up and grad_act kernels cost 1-10% (gate_up 0.447 -> 0.453 / 0.734 -> 0.810; grad_act 0.206 -> 0.212 /
# 0.341 -> 0.361): compiled beside the full tile's, it slowed the loop; those kernels do not have it.
# "padded_weight_grad" (tools/moe_gemm_sweep.py --per-kernel --weight-grad padded --kernels padded_weight_grad, H200,
# docs/performance/moe-padded-weight-grad-tiles-h200.json), ms at Qwen3-30B-A3B's layer / ERNIE-4.5-21B-A3B's: 256 x 128
# tiles of 64-row steps in 3 stages 0.635 / 1.005; 128 x 256 0.645 / 1.029; 128 x 128 in 4 stages 0.685 / 1.103. Its
# BLOCK_K is also the padding of the rows it reads. "WARP_SPECIALIZE": the item loop split into a producer warp and two
# consumer groups of num_warps each (Triton's Hopper pass); every setting of 5 or more stages computed nan gradients.
CONFIGS = {
    "gate_up": {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8, "num_stages": 4, "TMA": True,
                "PROGRAMS_PER_SM": 1},
    "down": {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "num_warps": 8, "num_stages": 4, "TMA": True,
             "PROGRAMS_PER_SM": 1, "HALF_TILES": False},
    "grad_act": {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "num_warps": 8, "num_stages": 4, "TMA": False,
                 "PROGRAMS_PER_SM": 1},
    "grad_input": {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "num_warps": 8, "num_stages": 4, "TMA": False,
                   "HALF_TILES": True},
    "weight_grad": {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "num_warps": 8, "num_stages": 4, "TMA": True,
                    "PROGRAMS_PER_SM": 2},
    "padded_weight_grad": {"BLOCK_M": 256, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 4, "num_stages": 3, "TMA": True,
                           "PROGRAMS_PER_SM": 1, "WARP_SPECIALIZE": True, "GLUON": True},
}
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# How the backward computes the experts' weight gradients, each over the rows of ``x`` and of the routing-weighted
# ``grad`` copied by one kernel (:func:`_gather_token_rows`): "padded", ``_padded_weight_grad_kernel`` over those rows
# copied in the padded order (each expert's from a multiple of the reduction step, zeros to the next), so that every
# block of both operands comes by TMA and the item loop is warp-specialized, where :func:`_padded_takes` (bf16 or fp16
# on Hopper; the weights' rows a multiple of the tile's); else "grouped_mm", ``torch._grouped_mm`` (CUTLASS's grouped
# GEMM on a GPU) over the rows in sorted order, where that op takes the operands (bf16, rows a multiple of 16 bytes,
# Hopper or the CPU: :func:`_grouped_mm_takes`); else, or as "triton", ``_weight_grad_kernel`` over the sorted rows.
# ``tools/moe_gemm_sweep.py --weight-grad padded,grouped_mm,triton`` times them (H200, bf16, 4096 tokens,
# docs/performance/moe-weight-grad-h200.json), the op's forward + backward, padded / CUTLASS's / the looping kernel's:
# 2.388 / 2.529 / 2.623 ms at Qwen3-30B-A3B's layer, 3.676 / 3.794 / 3.922 at ERNIE-4.5-21B-A3B's, 16.048 / 16.233 /
# 16.720 at Mixtral-8x7B's.
WEIGHT_GRAD = "padded"
WEIGHT_GRADS = ("padded", "grouped_mm", "triton")
# The "padded" way's kernel on a Hopper GPU, where its CONFIGS entry has GLUON and the experts' reductions are short
# (at most GLUON_ROWS_PER_EXPERT rows an expert on average): ``_padded_weight_grad_gluon_kernel`` (two product warp
# groups on alternate items, so that one's epilogue overlaps the other's products; :mod:`._moe_gemm_gluon` says why),
# with these tiles, the reduction step the padding's; else ``_padded_weight_grad_kernel``, whose 256-row tiles read
# the operands from L2 3/4 as often: that wins once the items are long enough that their epilogues matter less.
# ``tools/moe_gemm_sweep.py --per-kernel --weight-grad padded --kernels padded_weight_grad --gluon 0,1`` (H200, bf16,
# 4096 tokens; docs/performance.md), both gradients' kernels, ms, Triton -> Gluon: 0.642 -> 0.593 at Qwen3-30B-A3B's
# layer (256 rows an expert), 1.017 -> 0.997 at ERNIE-4.5-21B-A3B's (384), 4.512 -> 4.753 at Mixtral-8x7B's (1024).
GLUON_TILES = {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 4, "num_stages": 5}
GLUON_ROWS_PER_EXPERT = 512


def _blocks(name: str, m: int, n: int, k: int, dtype: torch.dtype) -> dict:
    """The launch options of kernel ``name`` for tiles over ``m`` rows, ``n`` columns and a reduction
    over ``k`` of ``dtype`` operands: :data:`CONFIGS` on the GPU, few large tiles under the interpreter;
    every block at least 16 (``tl.dot``'s smallest) and at most ``_launch.BLOCK_LIMIT`` beyond that.
    CONFIGS were swept with 2-byte operands: 4-byte ones take half the reduction step, so that a pipeline
    stage holds as many bytes (a 128 x 256 fp32 tile 64 deep needs 288 KiB of shared memory in 3 stages)."""
    cfg = CONFIGS[name]
    block_m = cfg["BLOCK_M"] if not interpreting() else min(64, next_power_of_2(m))
    block_m = max(16, loop_block(block_m, block_m))
    block_k = cfg["BLOCK_K"] * 2 // max(2, dtype.itemsize)
    blocks = {"BLOCK_M": block_m, "BLOCK_N": max(16, loop_block(n, cfg["BLOCK_N"])),
              "BLOCK_K": max(16, loop_block(k, block_k)), "num_warps": cfg["num_warps"],
              "num_stages": cfg["num_stages"]}
    if "HALF_TILES" in cfg:  # _rows_to_pairs_kernel's; half a tile is at least tl.dot's 16 rows
        blocks["HALF_TILES"] = bool(cfg["HALF_TILES"]) and block_m >= 32
    return blocks


def _tma_takes(name: str, t: Tensor) -> bool:
    """Whether kernel ``name`` loads ``t`` (a weight ``[E, ., .]`` or rows ``[S, K]``) by TMA: its :data:`CONFIGS`
    entry asks for it, the device has TMA (compute capability 9.0 or later; the CPU is the interpreter's, or the
    sm_90 compile test's), one of the last two strides is 1 and every other stride and the first element's offset
    are multiples of 16 bytes (a TMA descriptor's rule; the allocators' storages start 256-byte aligned)."""
    if not CONFIGS[name].get("TMA"):
        return False
    if t.device.type == "cuda":
        if torch.cuda.get_device_capability(t.device)[0] < 9:
            return False
    elif t.device.type != "cpu":
        return False
    size, strides = t.element_size(), t.stride()
    inner = len(strides) - 1 if strides[-1] == 1 else len(strides) - 2 if strides[-2] == 1 else None
    return inner is not None and all(s * size % 16 == 0 for i, s in enumerate(strides) if i != inner) and \
        t.storage_offset() * size % 16 == 0


def _weight_operand(name: str, weight: Tensor, strides: tuple[int, int, int]) -> dict:
    """The B operand's launch flags: ``B_TMA`` (:func:`_tma_takes`) and ``K_MAJOR`` (the reduction's stride is
    ``strides[1]``, the weight read as [K, N] through (expert, K, N) strides)."""
    return {"B_TMA": _tma_takes(name, weight), "K_MAJOR": strides[1] == 1}


class _Routing:
    """The (token, slot) pairs sorted by expert, on the device, without a host sync: ``order[r]`` the pair of sorted row
    r (stable), ``offsets`` ``[E + 1]`` each expert's first sorted row (and the end); and per M tile height the tile
    tables of :meth:`tiles`, built once per forward or backward (the kernels of one pass mostly share a height)."""

    def __init__(self, order: Tensor, offsets: Tensor) -> None:
        self.order, self.offsets = order, offsets
        self._tables: dict[int, tuple[Tensor, Tensor, int]] = {}

    @classmethod
    def sort(cls, top_k_index: Tensor, num_experts: int) -> "_Routing":
        """The pairs of ``top_k_index`` sorted by expert. The sort's keys are the narrowest integers that hold every
        expert and E itself: a radix sort makes one pass a byte of key (8 for int64 keys, 1 for uint8)."""
        flat = top_k_index.reshape(-1)
        key = torch.uint8 if num_experts < 255 else torch.int16 if num_experts < 32767 else flat.dtype
        sorted_ids, order = torch.sort(flat.to(key), stable=True)
        bounds = torch.arange(num_experts + 1, device=flat.device, dtype=key)
        return cls(order, torch.searchsorted(sorted_ids, bounds).to(flat.dtype))

    def tiles(self, block_m: int) -> tuple[Tensor, Tensor, int]:
        """(tile_expert, tile_start, tiles) for M tiles of ``block_m`` sorted rows (``_expert_tiles_kernel``):
        ``tile_expert[t]`` the expert of tile t (unwritten past the last tile), ``tile_start[e]`` the expert's first
        tile and ``tile_start[E]`` the number of tiles, ``tiles`` a bound on it from shapes alone (each expert adds
        at most one partial tile, and each tile holds a row), which sizes ``tile_expert`` and the grids."""
        if block_m not in self._tables:
            num_experts, pairs = self.offsets.shape[0] - 1, self.order.shape[0]
            tiles = min(pairs, (pairs + num_experts * (block_m - 1)) // block_m)
            tile_expert = torch.empty(tiles, dtype=torch.int32, device=self.offsets.device)
            tile_start = torch.empty(num_experts + 1, dtype=torch.int32, device=self.offsets.device)
            wrap_triton(_expert_tiles_kernel)[(num_experts + 1,)](
                self.offsets, tile_expert, tile_start, num_experts, BLOCK_M=block_m,
                BLOCK_E=next_power_of_2(num_experts), BLOCK_T=loop_block(tiles, 256), num_warps=4,
            )
            self._tables[block_m] = tile_expert, tile_start, tiles
        return self._tables[block_m]


def _tile_launch(name: str, routing: _Routing, blocks: dict, n: int, device: torch.device
                 ) -> tuple[tuple[int], Tensor, Tensor, int]:
    """(grid, tile_expert, tile_start, n_blocks) of a tile kernel's launch over ``n`` columns, its items the (M tile,
    N tile) pairs of the bound on the M tiles (:func:`_item_grid`)."""
    tile_expert, tile_start, tiles = routing.tiles(blocks["BLOCK_M"])
    n_blocks = cdiv(n, blocks["BLOCK_N"])
    return _item_grid(name, tiles * n_blocks, device), tile_expert, tile_start, n_blocks


def _item_grid(name: str, items: int, device: torch.device) -> tuple[int]:
    """The grid of a kernel whose programs take work items p, p + P, ...: a program an item, or, with
    ``PROGRAMS_PER_SM`` in its :data:`CONFIGS` entry, that many an SM, each looping over items (a few under the
    interpreter, so that the loops run there too)."""
    per_sm = CONFIGS[name].get("PROGRAMS_PER_SM", 0)
    return (persistent_programs(items, device, per_sm=per_sm) if per_sm else items,)


def _rows_to_pairs(a: Tensor, weight: Tensor, n: int, strides: tuple[int, int, int], scale: Tensor | None,
                   top_k_index: Tensor, routing: _Routing, name: str) -> Tensor:
    """Per token, the sum over its slots of ``scale * a[r] @ B[e]``, ``B[e]`` the ``[K, N]`` operand read
    from ``weight`` through ``strides`` (expert, K, N), through the ``[T, k, N]`` buffer (module docstring)."""
    tokens, top_k = top_k_index.shape
    num_experts, k = weight.shape[0], a.shape[1]
    rows = a.new_empty((tokens, top_k, n))
    blocks = _blocks(name, cdiv(a.shape[0], num_experts), n, k, a.dtype)
    grid, tile_expert, tile_start, n_blocks = _tile_launch(name, routing, blocks, n, a.device)
    wrap_triton(_rows_to_pairs_kernel)[grid](
        a, weight, scale if scale is not None else a, rows, routing.order, tile_expert, tile_start, routing.offsets,
        num_experts, a.shape[0], n, k, n_blocks, a.stride(0), a.stride(1), *strides, n,
        HAS_SCALE=scale is not None, A_TMA=_tma_takes(name, a) and a.stride(1) == 1,
        **_weight_operand(name, weight, strides), **blocks, **_dot(a.dtype),
    )
    return rows[:, 0] if top_k == 1 else _slot_sums(rows)


# The sums' kernel: a program a (token, block of columns), all of a token's slots loaded at once. In the op's forward
# + backward (two sums) on an H200, bf16, 4096 tokens, kernel time from the profiler, torch's ``sum(1)`` -> this
# kernel: 113 -> 74 us at Qwen3-30B-A3B's layer (top-8, hidden 2048; 3.9 TB/s), 142 -> 69 at ERNIE-4.5-21B-A3B's
# (top-6, 2560), 114 -> 56 at Moonlight-16B-A3B's (top-6, 2048).
_SLOT_SUMS_BLOCK = 1024


def _slot_sums(rows: Tensor) -> Tensor:
    """``rows.sum(1)`` of a contiguous ``[T, k, N]`` buffer, in fp32 rounded once to its dtype, the slots added in
    order (deterministic, like torch's sum)."""
    tokens, top_k, n = rows.shape
    out = rows.new_empty((tokens, n))
    if out.numel():
        block = loop_block(n, _SLOT_SUMS_BLOCK)
        wrap_triton(_slot_sums_kernel)[(tokens, cdiv(n, block))](rows, out, n, TOP_K=top_k, BLOCK=block,
                                                                  num_warps=4)
    return out


def _dot(dtype: torch.dtype) -> dict:
    return {**dot_options(dtype), "ACC_IN_DOT": dtype in (torch.bfloat16, torch.float16)}


def _moe_swiglu_experts_impl(hidden_states: Tensor, gate_up_proj: Tensor, down_proj: Tensor, top_k_index: Tensor,
                             top_k_weights: Tensor, save_for_backward: bool
                             ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(output, the projections when ``save_for_backward`` (else no rows), ``h``, ``order``, ``offsets``): all
    but the output are the backward's inputs."""
    return run_with_scratch(hidden_states.device, _forward, hidden_states, gate_up_proj, down_proj, top_k_index,
                            top_k_weights, save_for_backward)


def _forward(hidden_states: Tensor, gate_up_proj: Tensor, down_proj: Tensor, top_k_index: Tensor,
             top_k_weights: Tensor, save_for_backward: bool) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    tokens, hidden = hidden_states.shape
    num_experts, inter = gate_up_proj.shape[0], down_proj.shape[2]
    pairs = top_k_index.numel()
    h = hidden_states.new_empty((pairs, inter))
    gate_up = hidden_states.new_empty((pairs if save_for_backward else 0, 2 * inter))
    routing = _Routing.sort(top_k_index, num_experts)
    order, offsets = routing.order, routing.offsets
    if pairs == 0:
        return hidden_states.new_zeros((tokens, hidden)), gate_up, h, order, offsets
    blocks = _blocks("gate_up", cdiv(pairs, num_experts), inter, hidden, hidden_states.dtype)
    grid, tile_expert, tile_start, n_blocks = _tile_launch("gate_up", routing, blocks, inter, hidden_states.device)
    wrap_triton(_gate_up_kernel)[grid](
        hidden_states, gate_up_proj, h, gate_up, order, tile_expert, tile_start, offsets,
        num_experts, top_k_index.shape[1], inter, hidden, n_blocks, *hidden_states.stride(), *gate_up_proj.stride(),
        h.stride(0), gate_up.stride(0), STORE_PREACT=save_for_backward,
        **_weight_operand("gate_up", gate_up_proj, (gate_up_proj.stride(0), gate_up_proj.stride(2),
                                                    gate_up_proj.stride(1))),
        **blocks, **_dot(hidden_states.dtype),
    )
    # h @ down_proj[e].T: down_proj[e] is [H, I], read as the [I, H] B operand through its strides
    weights = top_k_weights.reshape(-1)
    out = _rows_to_pairs(h, down_proj, hidden, (down_proj.stride(0), down_proj.stride(2), down_proj.stride(1)),
                         weights, top_k_index, routing, "down")
    return out, gate_up, h, order, offsets


def _moe_swiglu_experts_fake(hidden_states: Tensor, gate_up_proj: Tensor, down_proj: Tensor, top_k_index: Tensor,
                             top_k_weights: Tensor, save_for_backward: bool
                             ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    pairs, inter = top_k_index.numel(), down_proj.shape[2]
    return (hidden_states.new_empty(hidden_states.shape), hidden_states.new_empty((pairs if save_for_backward else 0,
                                                                                    2 * inter)),
            hidden_states.new_empty((pairs, inter)), top_k_index.new_empty((pairs,), dtype=torch.int64),
            top_k_index.new_empty((gate_up_proj.shape[0] + 1,)))


def _moe_swiglu_experts_backward_impl(
    grad: Tensor, hidden_states: Tensor, gate_up_proj: Tensor, down_proj: Tensor, top_k_index: Tensor,
    top_k_weights: Tensor, gate_up: Tensor, h: Tensor, order: Tensor, offsets: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return run_with_scratch(grad.device, _backward, grad, hidden_states, gate_up_proj, down_proj, top_k_index,
                            top_k_weights, gate_up, h, order, offsets)


def _backward(grad: Tensor, hidden_states: Tensor, gate_up_proj: Tensor, down_proj: Tensor, top_k_index: Tensor,
              top_k_weights: Tensor, gate_up: Tensor, h: Tensor, order: Tensor, offsets: Tensor,
              ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    tokens, top_k = top_k_index.shape
    pairs, (_, inter2, hidden) = top_k_index.numel(), gate_up_proj.shape
    inter = inter2 // 2
    if gate_up.shape[0] != pairs:  # a forward told to save nothing: recompute the projections
        _, gate_up, h, order, offsets = _forward(hidden_states, gate_up_proj, down_proj, top_k_index, top_k_weights,
                                                 True)
    if pairs == 0:
        return (torch.zeros_like(hidden_states), torch.zeros_like(gate_up_proj), torch.zeros_like(down_proj),
                torch.zeros_like(top_k_weights))
    weights = top_k_weights.reshape(-1)
    routing = _Routing(order, offsets)  # the forward's sort
    d_gate_up, grad_weights = _grad_act(grad, down_proj, gate_up, h, weights, routing, top_k)
    grad_weights = grad_weights.view(tokens, top_k).to(top_k_weights.dtype)
    # d_gate_up @ gate_up_proj[e]: [2I, H] as it lies, the [K=2I, N=H] B operand
    grad_x = _rows_to_pairs(d_gate_up, gate_up_proj, hidden, gate_up_proj.stride(), None, top_k_index, routing,
                            "grad_input")
    # per expert: d_gate_up^T @ x[tokens] -> [2I, H];  (w * grad[tokens])^T @ h -> [H, I]
    way = _weight_grads_way(hidden_states, inter)
    if way == "padded":
        grad_gate_up_proj, grad_down_proj = _weight_grads_padded(hidden_states, grad, weights, routing, top_k,
                                                                 d_gate_up, h)
    else:
        x_rows, scaled, _ = _gather_token_rows(hidden_states, grad, weights, routing, top_k)
        weight_grads = _weight_grads_grouped_mm if way == "grouped_mm" else _weight_grads_triton
        grad_gate_up_proj, grad_down_proj = weight_grads(d_gate_up, x_rows, scaled, h, offsets)
    return grad_x, grad_gate_up_proj, grad_down_proj, grad_weights


def _weight_grads_way(hidden_states: Tensor, inter: int) -> str:
    """The way of :data:`WEIGHT_GRADS` the backward takes: :data:`WEIGHT_GRAD` where it takes the operands, else the
    next of "padded", "grouped_mm" that does, else "triton" (which takes any)."""
    takes = {"padded": _padded_takes, "grouped_mm": _grouped_mm_takes}
    ways = WEIGHT_GRADS[WEIGHT_GRADS.index(WEIGHT_GRAD):]
    return next((way for way in ways if way == "triton" or takes[way](hidden_states, inter)), "triton")


def _grad_act(grad: Tensor, down_proj: Tensor, gate_up: Tensor, h: Tensor, weights: Tensor, routing: _Routing,
              top_k: int) -> tuple[Tensor, Tensor]:
    """(d gate_up, the routing weights' gradient ``[S]``) by ``_gathered_gemm_kernel`` (``d = grad[tokens] @
    down_proj[e]`` in sorted order, rounded to the input dtype as transformers' grouped GEMM rounds it) then
    ``_swiglu_grad_kernel`` (the SwiGLU derivative and each row's whole ``d . h``).

    The derivative once sat in the GEMM's epilogue, whose loads of the projections and ``h`` beside the accumulator
    held its tiles to 128 x 128 (wider ones spilled). Apart, the GEMM takes 128 x 256 tiles, and forward + backward
    ran 2.744 -> 2.678 ms at Qwen3-30B-A3B's layer and 17.450 -> 16.972 at Mixtral-8x7B's (H200, bf16, 4096 tokens):
    0.442 ms of kernel against 0.220 + 0.075, and 2.883 against 1.788 + 0.349."""
    (pairs, inter2), (num_experts, hidden, inter) = gate_up.shape, down_proj.shape
    cfg = _blocks("grad_act", cdiv(pairs, num_experts), inter, hidden, grad.dtype)
    grid, tile_expert, tile_start, n_blocks = _tile_launch("grad_act", routing, cfg, inter, grad.device)
    d = gate_up.new_empty((pairs, inter))
    wrap_triton(_gathered_gemm_kernel)[grid](
        grad, down_proj, d, routing.order, tile_expert, tile_start, routing.offsets, num_experts, top_k, inter,
        hidden, n_blocks, *grad.stride(), *down_proj.stride(), d.stride(0),
        **_weight_operand("grad_act", down_proj, down_proj.stride()), **cfg, **_dot(grad.dtype),
    )
    d_gate_up = gate_up.new_empty((pairs, inter2))
    d_weights = torch.empty(pairs, dtype=torch.float32, device=grad.device)
    block_r = 16 if not interpreting() else 64
    wrap_triton(_swiglu_grad_kernel)[(cdiv(pairs, block_r),)](
        d, gate_up, h, weights, d_gate_up, d_weights, routing.order, pairs, inter, d.stride(0), gate_up.stride(0),
        h.stride(0), d_gate_up.stride(0), BLOCK_R=block_r, BLOCK_N=loop_block(inter, 256), num_warps=4,
    )
    return d_gate_up, d_weights


def _weight_grads_triton(d_gate_up: Tensor, x_rows: Tensor, scaled: Tensor, h: Tensor,
                         offsets: Tensor) -> tuple[Tensor, Tensor]:
    """The weight gradients by ``_weight_grad_kernel``, each expert's rows of the sorted operands reduced by the
    tiles of its own weight: ``d_gate_up^T @ x_rows`` ``[E, 2I, H]`` and ``scaled^T @ h`` ``[E, H, I]``."""
    return _expert_weight_grad(d_gate_up, x_rows, offsets), _expert_weight_grad(scaled, h, offsets)


def _expert_weight_grad(a: Tensor, b: Tensor, offsets: Tensor) -> Tensor:
    """``out[e] = a[r]^T @ b[r]`` over expert e's sorted rows r (``offsets[e]`` to ``offsets[e + 1]``)."""
    a, b = _launch.rows(a), _launch.rows(b)
    num_experts, (num_rows, m), n = offsets.shape[0] - 1, a.shape, b.shape[1]
    out = a.new_empty((num_experts, m, n))
    cfg = _blocks("weight_grad", m, n, cdiv(num_rows, num_experts), a.dtype)
    m_blocks, n_blocks = cdiv(m, cfg["BLOCK_M"]), cdiv(n, cfg["BLOCK_N"])
    wrap_triton(_weight_grad_kernel)[_item_grid("weight_grad", num_experts * m_blocks * n_blocks, a.device)](
        a, b, out, offsets, num_experts, num_rows, m, n, m_blocks, n_blocks, a.stride(0), b.stride(0),
        out.stride(0), out.stride(1), TMA=_tma_takes("weight_grad", a) and _tma_takes("weight_grad", b),
        **cfg, **_dot(a.dtype),
    )
    return out


def _grouped_mm_takes(hidden_states: Tensor, inter: int) -> bool:
    """Whether ``torch._grouped_mm`` (:data:`._torch_internals.grouped_mm`) takes the weight gradients' operands:
    bf16, on a Hopper GPU (compute capability 9.x) or the CPU, every row of ``hidden`` and ``inter`` elements a
    multiple of 16 bytes. Not on Blackwell: there the gradient of an expert no token chose comes out nonzero
    (pytorch/pytorch#172439), where Hopper's and the CPU's are zero."""
    device = hidden_states.device
    if grouped_mm is None or hidden_states.dtype != torch.bfloat16:
        return False
    if device.type == "cuda" and torch.cuda.get_device_capability(device)[0] != 9:
        return False
    return device.type in ("cuda", "cpu") and hidden_states.shape[1] % 8 == 0 and inter % 8 == 0


def _weight_grads_grouped_mm(d_gate_up: Tensor, x_rows: Tensor, scaled: Tensor, h: Tensor,
                             offsets: Tensor) -> tuple[Tensor, Tensor]:
    """The weight gradients by ``torch._grouped_mm``, each expert's rows of the sorted operands a group of the
    reduction."""
    return _grouped_weight_grads_op(d_gate_up, x_rows, scaled, h, offsets[1:].to(torch.int32))


def _gather_token_rows(hidden_states: Tensor, grad: Tensor, weights: Tensor, routing: _Routing, top_k: int,
                       pad: int = 1) -> tuple[Tensor, Tensor, Tensor | None]:
    """(``hidden_states[order // top_k]``, ``(grad[order // top_k].float() * weights[order, None].float())`` rounded
    to ``grad``'s dtype), contiguous, in one pass, and None. As torch's two ``index_select``, casts and product they
    took 0.60 ms of the op's 3.37 ms forward + backward on an H200 at Qwen3-30B-A3B's layer (4096 tokens, bf16).

    ``pad`` > 1: the rows in the padded order instead (``_gather_token_rows_kernel``: each expert's from a multiple
    of ``pad``, zeros up to the next), in buffers of the most rows that order can take (each expert adds at most
    ``pad - 1``), and the experts' padded starts ``[E + 1]`` (int32, the last entry all the padded rows) third."""
    order, offsets = routing.order, routing.offsets
    pairs, hidden, num_experts = order.shape[0], hidden_states.shape[1], offsets.shape[0] - 1
    rows = pairs if pad == 1 else pairs + num_experts * (pad - 1)
    x_rows = hidden_states.new_empty((rows, hidden))
    scaled = grad.new_empty((rows, hidden))
    padded = torch.empty(num_experts + 1, dtype=torch.int32, device=order.device) if pad > 1 else None
    block_r = 32 if interpreting() else 8
    wrap_triton(_gather_token_rows_kernel)[(cdiv(rows, block_r),)](
        hidden_states, grad, weights, order, offsets, padded if padded is not None else offsets, x_rows, scaled, rows,
        num_experts, top_k, hidden, *hidden_states.stride(), *grad.stride(), x_rows.stride(0), scaled.stride(0),
        PAD=pad, BLOCK_E=next_power_of_2(num_experts) if pad > 1 else 1, BLOCK_R=block_r,
        BLOCK_H=loop_block(hidden, 512), num_warps=4,
    )
    return x_rows, scaled, padded


def _padded_blocks(m: int, n: int, rows_per_expert: int, dtype: torch.dtype) -> dict:
    """``_padded_weight_grad_kernel``'s launch options for an ``[E, m, n]`` gradient (:func:`_blocks`)."""
    return _blocks("padded_weight_grad", m, n, rows_per_expert, dtype)


def _padded_takes(hidden_states: Tensor, inter: int) -> bool:
    """Whether the "padded" weight gradients take these operands: 2-byte floats on a Hopper GPU (whose warp
    specialization was measured) or the CPU (the interpreter's, or the sm_90 compile test's), each weight's rows (2I
    and H) a multiple of the tile's (the gradient stored by TMA tiles over [E * M, N], which must not cross an
    expert's rows) and every row of H and I elements a multiple of 16 bytes (TMA's rule)."""
    device, dtype = hidden_states.device, hidden_states.dtype
    if dtype.itemsize != 2 or device.type not in ("cuda", "cpu"):
        return False
    if device.type == "cuda" and torch.cuda.get_device_capability(device)[0] != 9:
        return False
    hidden = hidden_states.shape[1]
    return (all(m % _padded_blocks(m, n, 1, dtype)["BLOCK_M"] == 0 for m, n in ((2 * inter, hidden), (hidden, inter)))
            and inter * dtype.itemsize % 16 == 0 and hidden * dtype.itemsize % 16 == 0)


def _weight_grads_padded(hidden_states: Tensor, grad: Tensor, weights: Tensor, routing: _Routing, top_k: int,
                         d_gate_up: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
    """The weight gradients by ``_padded_weight_grad_kernel``: the rows of ``x`` and of the weighted ``grad`` gathered
    in the padded order (:func:`_gather_token_rows`), against ``d_gate_up`` and ``h`` in the sorted order."""
    (pairs, inter2), hidden = d_gate_up.shape, hidden_states.shape[1]
    num_experts = routing.offsets.shape[0] - 1
    step = _padded_blocks(inter2, hidden, cdiv(pairs, num_experts), d_gate_up.dtype)["BLOCK_K"]
    x_rows, scaled, padded = _gather_token_rows(hidden_states, grad, weights, routing, top_k, pad=step)
    # d_gate_up^T @ x_rows -> [E, 2I, H];  scaled^T @ h -> [E, H, I]
    return (_padded_weight_grad(d_gate_up, x_rows, routing.offsets, padded, False, step),
            _padded_weight_grad(scaled, h, routing.offsets, padded, True, step))


def _padded_weight_grad(a: Tensor, b: Tensor, offsets: Tensor, padded: Tensor, padded_a: bool, step: int) -> Tensor:
    """``out[e] = a[rows of e]^T @ b[rows of e]``, ``a``'s rows in the padded order when ``padded_a``, else ``b``'s
    (``_padded_weight_grad_kernel``, or its Gluon form where :func:`_gluon_takes` and the reductions are short,
    :data:`GLUON_ROWS_PER_EXPERT`; the reduction step is the padding's ``step``). Both read as contiguous rows (the
    TMA descriptors' row strides are the rows' sizes, which :func:`_padded_takes` checked)."""
    a, b = a.contiguous(), b.contiguous()  # the backward's own buffers already are
    pairs, num_experts = min(a.shape[0], b.shape[0]), offsets.shape[0] - 1  # the sorted operand's rows: the fewer
    if _gluon_takes(a) and pairs <= GLUON_ROWS_PER_EXPERT * num_experts:
        return _padded_weight_grad_gluon(a, b, offsets, padded, padded_a, step)
    m, n = a.shape[1], b.shape[1]
    out = a.new_empty((num_experts, m, n))
    cfg = {**_padded_blocks(m, n, step, a.dtype), "BLOCK_K": step}
    m_blocks, n_blocks = cdiv(m, cfg["BLOCK_M"]), cdiv(n, cfg["BLOCK_N"])
    specialize = bool(CONFIGS["padded_weight_grad"]["WARP_SPECIALIZE"]) and not interpreting()
    wrap_triton(_padded_weight_grad_kernel)[_item_grid("padded_weight_grad", num_experts * m_blocks * n_blocks,
                                                       a.device)](
        a, b, out, offsets, padded, num_experts, a.shape[0], b.shape[0], m, n, m_blocks, n_blocks, a.stride(0),
        b.stride(0), PADDED_A=padded_a, WARP_SPECIALIZE=specialize, **cfg, **_dot(a.dtype),
    )
    return out


def _gluon_takes(a: Tensor) -> bool:
    """Whether :func:`_padded_weight_grad` runs the Gluon kernel: GLUON in its :data:`CONFIGS` entry, a Hopper GPU
    (compute capability 9.x: warpgroup MMA) and not the interpreter (every Triton the package takes, 3.6 on, has
    Gluon's Hopper API)."""
    if not CONFIGS["padded_weight_grad"].get("GLUON") or a.device.type != "cuda" or interpreting():
        return False
    return torch.cuda.get_device_capability(a.device)[0] == 9


def _padded_weight_grad_gluon(a: Tensor, b: Tensor, offsets: Tensor, padded: Tensor, padded_a: bool,
                              step: int) -> Tensor:
    """:func:`_padded_weight_grad` by ``_padded_weight_grad_gluon_kernel`` (:data:`GLUON_TILES`, one program an SM),
    through host TMA descriptors: ``a``'s blocks ``[step, BLOCK_M]``, ``b``'s ``[step, BLOCK_N]``, the gradient's
    tiles over ``[E * M, N]``. The descriptors hold the tensors' addresses: this runs inside the op's impl, which
    Inductor never traces (the op is opaque, below)."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from ._moe_gemm_gluon import _padded_weight_grad_gluon_kernel

    dtype = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}[a.dtype]
    num_experts, m, n = offsets.shape[0] - 1, a.shape[1], b.shape[1]
    out = a.new_empty((num_experts, m, n))
    block_m, block_n = GLUON_TILES["BLOCK_M"], GLUON_TILES["BLOCK_N"]

    def descriptor(t: Tensor, block: list[int]) -> TensorDescriptor:
        return TensorDescriptor.from_tensor(t, block, gl.NVMMASharedLayout.get_default_for(block, dtype))

    m_blocks, n_blocks = cdiv(m, block_m), cdiv(n, block_n)
    grid = (persistent_programs(num_experts * m_blocks * n_blocks, a.device, per_sm=1),)
    _padded_weight_grad_gluon_kernel[grid](
        descriptor(a, [step, block_m]), descriptor(b, [step, block_n]),
        descriptor(out.view(num_experts * m, n), [block_m, block_n]), offsets, padded, num_experts, m, m_blocks,
        n_blocks, PADDED_A=padded_a, STAGES=GLUON_TILES["num_stages"], num_warps=GLUON_TILES["num_warps"],
    )
    return out


def _grouped_weight_grads_impl(d_gate_up: Tensor, x_rows: Tensor, scaled: Tensor, h: Tensor,
                               ends: Tensor) -> tuple[Tensor, Tensor]:
    # The reduction runs down the rows of row-major operands: then CUDA takes groups of any size. Cut along a
    # contiguous dimension, it asks for groups of a multiple of 16 bytes (a device-side assert), which an expert's
    # row count, whatever the router chose, is not. Inductor, given these calls in its graph, met that assert: they
    # sit in an op of their own, which it runs as it is.
    d_gate_up, x_rows, scaled, h = (t.contiguous() for t in (d_gate_up, x_rows, scaled, h))
    return (grouped_mm(d_gate_up.t(), x_rows, offs=ends),  # [E, 2I, H]
            grouped_mm(scaled.t(), h, offs=ends))  # [E, H, I]


def _grouped_weight_grads_fake(d_gate_up: Tensor, x_rows: Tensor, scaled: Tensor, h: Tensor,
                               ends: Tensor) -> tuple[Tensor, Tensor]:
    experts = ends.shape[0]
    return (d_gate_up.new_empty((experts, d_gate_up.shape[1], x_rows.shape[1])),
            scaled.new_empty((experts, scaled.shape[1], h.shape[1])))


# Opaque to Inductor (a custom_op): it hands the operands over with the layouts above.
_grouped_weight_grads_op = define_op(
    "moe_grouped_weight_grads", _grouped_weight_grads_impl, fake=_grouped_weight_grads_fake, inline_kernels=False,
    reference=_grouped_weight_grads_impl,  # no Triton kernel in it: the same call on any device
)


def _moe_swiglu_experts_backward_fake(grad, hidden_states, gate_up_proj, down_proj, top_k_index, top_k_weights,
                                      gate_up, h, order, offsets):
    return (hidden_states.new_empty(hidden_states.shape), gate_up_proj.new_empty(gate_up_proj.shape),
            down_proj.new_empty(down_proj.shape), top_k_weights.new_empty(top_k_weights.shape))


_moe_swiglu_experts_op = define_differentiable_op(
    "moe_swiglu_experts", _moe_swiglu_experts_impl, fake=_moe_swiglu_experts_fake,
    backward=_moe_swiglu_experts_backward_impl, backward_fake=_moe_swiglu_experts_backward_fake,
    saved=("hidden_states", "gate_up_proj", "down_proj", "top_k_index", "top_k_weights", "output[1]", "output[2]",
           "output[3]", "output[4]"),
    # the projections, h and the sorted order with the experts' offsets: the backward's inputs
    non_differentiable=("output[1]", "output[2]", "output[3]", "output[4]"),
    gradients=lambda grads, _: (grads[0], grads[1], grads[2], None, grads[3], None),  # none for the indices
    # the saved intermediates are the kernels' own (for their backward): none without them
    reference=lambda *args: (moe_swiglu_experts_reference(*args[:5]), None, None, None, None),  # defined below
    # Opaque to Inductor: the kernels build TMA descriptors on the device, whose launches need a Triton allocator in
    # the launching thread (run_with_scratch). Launches torch recorded from a triton_op run without one where no
    # Inductor code sets it (aot_eager, opcheck, a backward in autograd's thread); the impl always runs here.
    inline_kernels=False,
)


def _check(hidden_states: Tensor, gate_up_proj: Tensor, down_proj: Tensor, top_k_index: Tensor,
           top_k_weights: Tensor) -> None:
    op = "moe_swiglu_experts"
    check_tensors(op, hidden_states=hidden_states, gate_up_proj=gate_up_proj, down_proj=down_proj,
                  top_k_weights=top_k_weights)
    check_tensors(op, dtypes=ANY_DTYPE, hidden_states=hidden_states, top_k_index=top_k_index)
    if top_k_index.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{op}: top_k_index has dtype {top_k_index.dtype}; pass int64 (or int32) expert indices.")
    if hidden_states.dim() != 2 or gate_up_proj.dim() != 3 or down_proj.dim() != 3:
        raise ValueError(f"{op}: hidden_states {tuple(hidden_states.shape)}, gate_up_proj {tuple(gate_up_proj.shape)}, "
                         f"down_proj {tuple(down_proj.shape)}; pass [T, H], [E, 2I, H] and [E, H, I] (transformers' "
                         "experts layout; flatten the tokens first).")
    (tokens, hidden), (experts, inter2, hidden_w) = hidden_states.shape, gate_up_proj.shape
    if hidden_w != hidden or inter2 % 2 or tuple(down_proj.shape) != (experts, hidden, inter2 // 2):
        raise ValueError(f"{op}: gate_up_proj is {tuple(gate_up_proj.shape)} and down_proj {tuple(down_proj.shape)} "
                         f"for hidden size {hidden}; pass gate_up_proj [E, 2I, {hidden}] (gate rows, then up rows) "
                         f"and down_proj [E, {hidden}, I].")
    if top_k_index.dim() != 2 or top_k_index.shape[0] != tokens or top_k_weights.shape != top_k_index.shape:
        raise ValueError(f"{op}: top_k_index is {tuple(top_k_index.shape)} and top_k_weights "
                         f"{tuple(top_k_weights.shape)} for {tokens} tokens; pass both [{tokens}, k].")
    for name, t in (("hidden_states", hidden_states), ("gate_up_proj", gate_up_proj), ("down_proj", down_proj)):
        if t.dtype not in _DTYPES or t.dtype != hidden_states.dtype:
            raise TypeError(f"{op}: {name} is {t.dtype} (hidden_states {hidden_states.dtype}); pass hidden_states "
                            "and both weights in one of float16, bfloat16, float32 (moe_swiglu_experts_reference "
                            "takes others).")
    if top_k_index.requires_grad:
        raise ValueError(f"{op}: top_k_index requires grad; expert indices have none: pass top_k_index.detach().")


def moe_swiglu_experts(hidden_states: Tensor, gate_up_proj: Tensor, down_proj: Tensor, top_k_index: Tensor,
                       top_k_weights: Tensor) -> Tensor:
    """A mixture-of-experts layer's SwiGLU experts, as transformers' ``*Experts.forward``: fused grouped
    GEMMs over the tokens sorted by expert (see the module docstring), forward and backward.

    Args:
        hidden_states (`torch.Tensor`): ``[T, H]`` tokens; float16, bfloat16 or float32; any strides.
        gate_up_proj (`torch.Tensor`): ``[E, 2I, H]``, each expert's gate rows then up rows; the dtype of
            ``hidden_states``; any strides.
        down_proj (`torch.Tensor`): ``[E, H, I]``, likewise.
        top_k_index (`torch.Tensor`): ``[T, k]`` int64 or int32 expert of each (token, slot), each in
            ``[0, E)`` (not checked: that would read the indices on the host).
        top_k_weights (`torch.Tensor`): ``[T, k]`` routing weights, any float dtype (zero weights allowed).

    Returns:
        `torch.Tensor`: ``[T, H]`` in the dtype of ``hidden_states``; the gradients of ``hidden_states``,
        both weights and ``top_k_weights`` come from the backward kernels.

    Raises:
        TypeError: a dtype outside those above, or weights of another dtype than ``hidden_states``.
        ValueError: shapes that do not form the layout above, tensors on two devices, or ``top_k_index``
            requiring grad (the error names the argument).

    Example:
        ```python
        out = moe_swiglu_experts(x, experts.gate_up_proj, experts.down_proj, top_k_index, top_k_weights)
        ```
    """
    _check(hidden_states, gate_up_proj, down_proj, top_k_index, top_k_weights)
    save = torch.is_grad_enabled() and any(t.requires_grad for t in (hidden_states, gate_up_proj, down_proj,
                                                                          top_k_weights))
    return _moe_swiglu_experts_op(hidden_states, gate_up_proj, down_proj, top_k_index, top_k_weights, save)[0]


def moe_swiglu_experts_reference(hidden_states: Tensor, gate_up_proj: Tensor, down_proj: Tensor,
                                 top_k_index: Tensor, top_k_weights: Tensor) -> Tensor:
    """Plain PyTorch ``moe_swiglu_experts``: transformers' grouped computation with one loop over the
    experts hit (it reads the per-expert counts on the host)."""
    tokens, top_k = top_k_index.shape
    flat = top_k_index.reshape(-1)
    order = torch.argsort(flat, stable=True)
    x = hidden_states[order // top_k]
    counts = torch.bincount(flat, minlength=gate_up_proj.shape[0]).tolist()
    parts, start = [], 0
    for e, n in enumerate(counts):
        if n:
            gate, up = F.linear(x[start:start + n], gate_up_proj[e]).chunk(2, dim=-1)
            parts.append(F.linear(F.silu(gate) * up, down_proj[e]))
            start += n
    y = torch.cat(parts) if parts else x.new_empty((0, hidden_states.shape[-1]))
    y = y * top_k_weights.reshape(-1)[order, None]
    per_pair = torch.zeros_like(y).index_copy(0, order, y)
    return per_pair.view(tokens, top_k, -1).sum(1).to(hidden_states.dtype)
