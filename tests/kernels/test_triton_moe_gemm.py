"""moe_swiglu_experts and FusedSwiGLUExperts: the MoE experts as fused grouped GEMMs, against the
PyTorch reference and transformers' own experts module, forward and every gradient (input, both
weights, routing weights)."""

import pytest
import torch
from kernel_test_utils import check_forward_backward

import twinkle_triton as tt
from twinkle_triton.layers import FusedSwiGLUExperts

# odd sizes: no block divides them
TOKENS, EXPERTS, HIDDEN, INTER = 37, 5, 40, 24
UNUSED = 3  # the expert no token is routed to


def _routing(tokens, experts, top_k, dtype=torch.float32):
    """(top_k_index, top_k_weights) as a softmax router picks them, expert UNUSED never chosen and
    some weights zero (a token may keep an expert whose weight is 0)."""
    logits = torch.randn(tokens, experts)
    logits[:, UNUSED % experts] = float("-inf")
    weights, index = logits.softmax(-1).topk(top_k, dim=-1)
    weights[::4, -1] = 0.0
    return index, weights.to(dtype)


def _inputs(dtype, top_k, tokens=TOKENS, experts=EXPERTS, hidden=HIDDEN, inter=INTER):
    x = torch.randn(tokens, hidden, dtype=dtype)
    gate_up = (torch.randn(experts, 2 * inter, hidden) / hidden**0.5).to(dtype)
    down = (torch.randn(experts, hidden, inter) / inter**0.5).to(dtype)
    index, weights = _routing(tokens, experts, top_k, dtype)
    return x, gate_up, down, index, weights


def _check(x, gate_up, down, index, weights, dtype, what):
    check_forward_backward(lambda x, w1, w2, w: tt.moe_swiglu_experts(x, w1, w2, index, w),
                           lambda x, w1, w2, w: tt.moe_swiglu_experts_reference(x, w1, w2, index, w),
                           (x, gate_up, down, weights), dtype, what, roundings=2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("top_k", [2, 3])
def test_matches_reference(top_k, dtype):
    x, gate_up, down, index, weights = _inputs(dtype, top_k)
    assert not (index == UNUSED).any() and (weights == 0).any()
    _check(x, gate_up, down, index, weights, dtype, f"moe_swiglu_experts top-{top_k}")


# the "padded" weight gradients store tiles of a weight's rows (256 on the GPU, 64 under the interpreter): 2I and H
# multiples of them
PADDED_HIDDEN, PADDED_INTER = 256, 128


@pytest.mark.parametrize("weight_grad", ["grouped_mm", "triton"])
@pytest.mark.parametrize("top_k", [1, 3])
def test_weight_gradients_either_way(top_k, weight_grad, monkeypatch):
    """The weight gradients over the rows copied in sorted order, by torch._grouped_mm and by the Triton kernel (an
    expert with no rows among the groups): every gradient as the reference's, and the path taken."""
    from twinkle_triton import moe_gemm

    calls = []
    path = {"grouped_mm": "_weight_grads_grouped_mm", "triton": "_weight_grads_triton"}[weight_grad]
    taken = getattr(moe_gemm, path)
    monkeypatch.setattr(moe_gemm, "WEIGHT_GRAD", weight_grad)
    monkeypatch.setattr(moe_gemm, path, lambda *args: calls.append(1) or taken(*args))
    x, gate_up, down, index, weights = _inputs(torch.bfloat16, top_k)
    _check(x, gate_up, down, index, weights, torch.bfloat16, f"moe_swiglu_experts top-{top_k}, {weight_grad}")
    assert calls
    # where the op cannot take the operands (fp32; rows not a multiple of 16 bytes) the Triton kernel runs
    assert not moe_gemm._grouped_mm_takes(x.float(), INTER) and not moe_gemm._grouped_mm_takes(x, INTER + 4)


# the "padded" weight gradients store tiles of a weight's rows (256 on the GPU, 64 under the interpreter): 2I and H
# multiples of them
PADDED_HIDDEN, PADDED_INTER = 256, 128


@pytest.mark.parametrize("top_k", [1, 3])
def test_padded_weight_gradients_are_the_sorted_order_kernels(top_k, monkeypatch):
    """At sizes the padded way takes, the op's output and every gradient as with the looping kernel over rows in
    sorted order (which the test above checks against the reference), the weight gradients within one rounding
    (their fp32 sums run in another order), an expert with no rows among the groups; the padded way taken.
    (Against the reference directly, at these sizes some gradient elements cancel enough that the intermediates'
    roundings, the same in both ways, pass an element's tolerance.)"""
    from twinkle_triton import moe_gemm

    calls, taken = [], moe_gemm._weight_grads_padded
    monkeypatch.setattr(moe_gemm, "_weight_grads_padded", lambda *args: calls.append(1) or taken(*args))
    x, gate_up, down, index, weights = _inputs(torch.bfloat16, top_k, hidden=PADDED_HIDDEN, inter=PADDED_INTER)
    grad = torch.randn_like(x)
    results = {}
    for way in ("padded", "triton"):
        monkeypatch.setattr(moe_gemm, "WEIGHT_GRAD", way)
        params = [t.detach().requires_grad_() for t in (x, gate_up, down, weights)]
        out = tt.moe_swiglu_experts(params[0], params[1], params[2], index, params[3])
        results[way] = (out, *torch.autograd.grad(out, params, grad))
    assert len(calls) == 1
    padded, triton = results["padded"], results["triton"]
    for i, what in ((0, "output"), (1, "grad x"), (4, "grad routing weights")):
        assert torch.equal(padded[i], triton[i]), what
    for i, what in ((2, "grad gate_up_proj"), (3, "grad down_proj")):
        torch.testing.assert_close(padded[i], triton[i], rtol=2**-7, atol=1e-6, msg=lambda m: f"{what}: {m}")
        assert not padded[i][UNUSED].any(), f"{what} of the expert without rows"


def test_the_padded_weight_gradients_where_they_take_the_operands():
    """2-byte floats, both weights' rows (2I and H) multiples of the stored tile's, rows of 16-byte multiples; the
    default way where they take them, the next way that does where not."""
    from twinkle_triton import moe_gemm

    x = torch.randn(4, PADDED_HIDDEN, dtype=torch.bfloat16)
    assert moe_gemm._padded_takes(x, PADDED_INTER) and moe_gemm._padded_takes(x.half(), PADDED_INTER)
    assert moe_gemm.WEIGHT_GRAD == "padded" and moe_gemm._weight_grads_way(x, PADDED_INTER) == "padded"
    assert not moe_gemm._padded_takes(x.float(), PADDED_INTER)  # fp32: the looping kernel
    assert moe_gemm._weight_grads_way(x.float(), PADDED_INTER) == "triton"
    assert not moe_gemm._padded_takes(x, PADDED_INTER + 8)  # 2I not a multiple of the tile's rows: CUTLASS's
    assert moe_gemm._weight_grads_way(x, PADDED_INTER + 8) == "grouped_mm"
    assert not moe_gemm._padded_takes(torch.randn(4, PADDED_HIDDEN + 8, dtype=torch.bfloat16), PADDED_INTER)


@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.bfloat16])
def test_rows_gathered_for_the_weight_gradients_are_torchs_bits(weight_dtype):
    """The weight gradients' operands, gathered and scaled by one kernel: the bits of torch's index_select and fp32
    product rounded once (on a GPU; the interpreter rounds to bf16 by truncation: within one bf16 step there),
    from strided tokens and gradients, routing weights in either dtype."""
    from twinkle_triton import _launch, moe_gemm

    top_k = 3
    x = torch.full((TOKENS, 2 * HIDDEN), float("nan"), dtype=torch.bfloat16)[:, ::2].copy_(torch.randn(TOKENS, HIDDEN))
    grad = torch.randn(HIDDEN, TOKENS, dtype=torch.bfloat16).t()
    weights = torch.rand(TOKENS * top_k, dtype=weight_dtype)
    order = torch.randperm(TOKENS * top_k)
    one_expert = moe_gemm._Routing(order, torch.tensor([0, order.numel()]))
    x_rows, scaled, padded = moe_gemm._gather_token_rows(x, grad, weights, one_expert, top_k)
    assert padded is None
    tokens = order // top_k
    assert torch.equal(x_rows, x[tokens]) and x_rows.is_contiguous()
    product = grad[tokens].float() * weights[order].float()[:, None]
    if _launch.interpreting():
        torch.testing.assert_close(scaled.float(), product, rtol=2**-7, atol=0)
    else:
        assert torch.equal(scaled, product.to(torch.bfloat16))


def test_rows_gathered_in_the_padded_order():
    """With a padding of 16 rows: each expert's rows from a multiple of 16 (experts without rows, with fewer than 16,
    exactly 16, one past, several and a part), the sorted order's rows there, zeros up to the next expert's, nothing
    written past the last; the padded starts and their total."""
    from twinkle_triton import moe_gemm

    top_k, counts = 2, torch.tensor([0, 15, 16, 17, 37, 0, 3])
    index = torch.repeat_interleave(torch.arange(len(counts)), counts)[torch.randperm(int(counts.sum()))]
    index = index.view(-1, top_k)
    routing = moe_gemm._Routing.sort(index, len(counts))
    x, grad = torch.randn(index.shape[0], HIDDEN, dtype=torch.bfloat16), torch.randn(index.shape[0], HIDDEN)
    weights = torch.rand(index.numel())
    rows, scaled, _ = moe_gemm._gather_token_rows(x, grad, weights, routing, top_k)
    padded_rows, padded_scaled, padded = moe_gemm._gather_token_rows(x, grad, weights, routing, top_k, pad=16)
    starts = torch.tensor([0, 0, 16, 32, 64, 112, 112, 128], dtype=torch.int32)
    assert torch.equal(padded, starts) and padded_rows.shape[0] == index.numel() + len(counts) * 15
    offsets = routing.offsets.tolist()
    for e, count in enumerate(counts.tolist()):
        mine, theirs = slice(int(starts[e]), int(starts[e]) + count), slice(offsets[e], offsets[e + 1])
        assert torch.equal(padded_rows[mine], rows[theirs]) and torch.equal(padded_scaled[mine], scaled[theirs])
        pad = slice(int(starts[e]) + count, int(starts[e + 1]))
        assert not padded_rows[pad].any() and not padded_scaled[pad].any(), f"expert {e}'s padding"


@pytest.mark.parametrize("padded_a", [False, True])
def test_padded_weight_gradient_tiles_reduce_their_experts_rows_only(padded_a, monkeypatch):
    """The padded-order kernel, 16 rows a step, one operand gathered in the padded order and the other in the sorted
    order: experts with no rows (zeros), fewer than a step, exactly one, one row past it, several steps and a part.
    The sorted operand's last block of an expert reads the next expert's rows (and past the tensor's end, TMA's
    zeros) against the padding's zeros: each gradient its own expert's. Programs loop over several tiles each."""
    from twinkle_triton import moe_gemm
    from twinkle_triton._launch import run_with_scratch

    monkeypatch.setattr(moe_gemm, "persistent_programs", lambda items, device, per_sm: max(1, items // 3))
    counts = torch.tensor([0, 15, 16, 17, 37, 3])
    index = torch.repeat_interleave(torch.arange(len(counts)), counts)[:, None]  # top-1, tokens in expert order
    routing = moe_gemm._Routing.sort(index, len(counts))
    x = torch.randn(index.shape[0], PADDED_HIDDEN, dtype=torch.bfloat16)
    x_rows, _, padded = moe_gemm._gather_token_rows(x, x, torch.ones(index.shape[0]), routing, 1, pad=16)
    other = torch.randn(index.shape[0], PADDED_HIDDEN, dtype=torch.bfloat16)  # sorted order (the identity here)
    a, b = (x_rows, other) if padded_a else (other, x_rows)
    out = run_with_scratch(a.device, moe_gemm._padded_weight_grad, a, b, routing.offsets, padded, padded_a, 16)
    assert out.shape == (len(counts), PADDED_HIDDEN, PADDED_HIDDEN) and out.dtype == torch.bfloat16
    offsets = routing.offsets.tolist()
    for e in range(len(counts)):
        xs, others = x[offsets[e]:offsets[e + 1]].double(), other[offsets[e]:offsets[e + 1]].double()
        expected = (xs.T @ others if padded_a else others.T @ xs).to(torch.bfloat16)
        torch.testing.assert_close(out[e], expected, rtol=2e-2, atol=1e-1,
                                   msg=lambda m: f"expert {e} ({int(counts[e])} rows): {m}")


@pytest.mark.parametrize("padded_a", [False, True])
def test_the_gluon_weight_gradient_kernel_sums_as_the_triton_kernel(padded_a, monkeypatch):
    """On a Hopper GPU the padded weight gradients run a Gluon kernel (a loading warp, two product warp groups on
    alternate items): each tile the Triton kernel's bits, its rows' blocks summed in the same order. Experts with no
    rows, fewer than a step, exactly one, one row past it, several steps and a part; programs looping over items."""
    from twinkle_triton import moe_gemm
    from twinkle_triton._launch import run_with_scratch

    probe = torch.empty(1, dtype=torch.bfloat16)
    if not moe_gemm._gluon_takes(probe):
        pytest.skip("the Gluon kernel runs on Hopper GPUs (and not under the interpreter)")
    monkeypatch.setattr(moe_gemm, "persistent_programs", lambda items, device, per_sm: max(1, items // 3))
    counts = torch.tensor([0, 63, 64, 65, 200, 3])
    index = torch.repeat_interleave(torch.arange(len(counts)), counts)[:, None]
    routing = moe_gemm._Routing.sort(index, len(counts))
    x = torch.randn(index.shape[0], PADDED_HIDDEN, dtype=torch.bfloat16)
    x_rows, _, padded = moe_gemm._gather_token_rows(x, x, torch.ones(index.shape[0]), routing, 1, pad=64)
    other = torch.randn(index.shape[0], PADDED_HIDDEN, dtype=torch.bfloat16)
    a, b = (x_rows, other) if padded_a else (other, x_rows)
    calls, gluon_kernel = [], moe_gemm._padded_weight_grad_gluon
    monkeypatch.setattr(moe_gemm, "_padded_weight_grad_gluon", lambda *args: calls.append(1) or gluon_kernel(*args))

    def weight_grad():
        return run_with_scratch(a.device, moe_gemm._padded_weight_grad, a, b, routing.offsets, padded, padded_a, 64)

    by_gluon = weight_grad()
    assert len(calls) == 1
    monkeypatch.setitem(moe_gemm.CONFIGS["padded_weight_grad"], "GLUON", False)
    assert torch.equal(by_gluon, weight_grad()) and len(calls) == 1
    assert not by_gluon[0].any()  # the expert without rows
    # longer reductions than GLUON_ROWS_PER_EXPERT an expert keep the Triton kernel
    monkeypatch.setitem(moe_gemm.CONFIGS["padded_weight_grad"], "GLUON", True)
    monkeypatch.setattr(moe_gemm, "GLUON_ROWS_PER_EXPERT", 64)
    assert torch.equal(by_gluon, weight_grad()) and len(calls) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_matches_reference_in_small_tiles(dtype, small_blocks):
    # 16-row tiles, 16-column blocks, 16-wide K steps: several M tiles per expert, a partial last tile,
    # K loops and N tiles whose routing-weight partial sums are added, on the CPU as on the GPU
    x, gate_up, down, index, weights = _inputs(dtype, 3)
    _check(x, gate_up, down, index, weights, dtype, "moe_swiglu_experts small tiles")


@pytest.mark.parametrize("layout", ["rows", "columns", "unaligned"])
def test_operands_by_tma_and_by_pointers(layout, monkeypatch):
    """Every GEMM kernel asked for TMA loads (the weights' blocks, down's and grad_input's sorted rows) takes it where
    the operand allows it: weights stored with the reduction contiguous or the columns, and a row stride of 16-byte
    multiples; sizes of 36 and 22 bf16 (72- and 44-byte rows) keep them on pointers. Either way, the reference's
    numbers."""
    from twinkle_triton import moe_gemm

    for name in ("gate_up", "down", "grad_act", "grad_input"):
        monkeypatch.setitem(moe_gemm.CONFIGS, name, {**moe_gemm.CONFIGS[name], "TMA": True})
    taken, takes = [], moe_gemm._tma_takes
    monkeypatch.setattr(moe_gemm, "_tma_takes", lambda name, t: taken.append(takes(name, t)) or taken[-1])
    unaligned = layout == "unaligned"
    x, gate_up, down, index, weights = _inputs(torch.bfloat16, 2, hidden=36 if unaligned else HIDDEN,
                                               inter=22 if unaligned else INTER)
    if layout == "columns":
        gate_up = gate_up.transpose(1, 2).contiguous().transpose(1, 2)
        down = down.transpose(1, 2).contiguous().transpose(1, 2)
    _check(x, gate_up, down, index, weights, torch.bfloat16, f"moe_swiglu_experts, {layout}")
    assert len(taken) >= 6 and all(taken) == any(taken) == (not unaligned)


def test_programs_that_loop_over_the_tiles(small_blocks, monkeypatch):
    """Each GEMM kernel launched as fewer programs than its (M tile, N tile) items, every program looping over
    several: the reference's numbers."""
    from twinkle_triton import moe_gemm

    for name in ("gate_up", "down", "grad_act", "grad_input"):
        monkeypatch.setitem(moe_gemm.CONFIGS, name, {**moe_gemm.CONFIGS[name], "PROGRAMS_PER_SM": 1})
    launches, launch = [], moe_gemm._tile_launch

    def recording(name, routing, blocks, n, device):
        grid, tile_expert, tile_start, n_blocks = launch(name, routing, blocks, n, device)
        launches.append((name, grid[0], int(tile_start[-1]) * n_blocks))
        return grid, tile_expert, tile_start, n_blocks

    monkeypatch.setattr(moe_gemm, "_tile_launch", recording)
    # a third of the items' programs, on the GPU too (where the grid's bound is the SMs, more than these items)
    monkeypatch.setattr(moe_gemm, "persistent_programs", lambda items, device, per_sm: max(1, items // 3))
    x, gate_up, down, index, weights = _inputs(torch.bfloat16, 3)
    _check(x, gate_up, down, index, weights, torch.bfloat16, "moe_swiglu_experts, looping programs")
    assert {name for name, *_ in launches} == {"gate_up", "down", "grad_act", "grad_input"}
    assert all(2 * programs < items for _, programs, items in launches), launches


@pytest.mark.parametrize("half_tiles", [True, False])
def test_an_experts_short_last_tile_computed_half_as_high(half_tiles, monkeypatch):
    """Experts whose last M tile holds at most half a tile of rows (5 rows; 40 and 35 rows past a whole tile on the
    CPU's 32-row tiles, all three on the GPU's 128) beside an expert without rows: with the down projection's and
    the input gradient's half-height path and without, the reference's output and gradients (TMA-fed operands).
    fp32: which rows a tile computes and stores shows in any dtype, and these gradients cancel enough that the
    rounding of a 2-byte one (bf16 by truncation under the interpreter) can pass an element's tolerance."""
    from twinkle_triton import moe_gemm

    for name in ("gate_up", "down", "grad_act", "grad_input"):
        monkeypatch.setitem(moe_gemm.CONFIGS, name, {**moe_gemm.CONFIGS[name], "TMA": True})
    for name in ("down", "grad_input"):  # the kernel with the half-height path
        monkeypatch.setitem(moe_gemm.CONFIGS, name, {**moe_gemm.CONFIGS[name], "HALF_TILES": half_tiles})
    dtype, tokens, experts, top_k = torch.float32, 40, 4, 2
    # expert 1 in every token, expert 0 in the first 5 and expert 3 in the other 35: rows 5, 40, 0, 35
    index = torch.tensor([[1, 0 if t < 5 else 3] for t in range(tokens)])
    counts = torch.bincount(index.reshape(-1), minlength=experts).tolist()
    blocks = moe_gemm._blocks("down", tokens * top_k // experts, HIDDEN, INTER, dtype)
    assert counts == [5, 40, 0, 35] and blocks["HALF_TILES"] == half_tiles
    assert all(0 < c % blocks["BLOCK_M"] <= blocks["BLOCK_M"] // 2 for c in counts if c), (counts, blocks)
    x, gate_up, down, _, _ = _inputs(dtype, top_k, tokens=tokens, experts=experts)
    weights = torch.randn(tokens, top_k).softmax(-1).to(dtype)  # as a router's top-k renormalized
    _check(x, gate_up, down, index, weights, dtype, f"moe_swiglu_experts, half tiles {half_tiles}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_weight_gradient_tiles_reduce_their_experts_rows_only(dtype, small_blocks, monkeypatch):
    """The weight-gradient kernel over rows in sorted order, reduced 16 rows a step: experts with no rows, fewer than
    a step, exactly one step, one row past it and several steps and a part; rows past an expert's (the next expert's,
    the buffer's last rows) are infinite and reach no other expert's gradient, whether a step comes by TMA (bf16 and
    fp32 rows here are multiples of 16 bytes) or through pointers. Programs loop over several tiles each."""
    from twinkle_triton import moe_gemm
    from twinkle_triton._launch import run_with_scratch

    monkeypatch.setattr(moe_gemm, "persistent_programs", lambda items, device, per_sm: max(1, items // 3))
    monkeypatch.setitem(moe_gemm.CONFIGS, "weight_grad", {**moe_gemm.CONFIGS["weight_grad"], "PROGRAMS_PER_SM": 1})
    counts = [0, 15, 16, 17, 37, 3]
    offsets = torch.tensor([0, *counts]).cumsum(0)
    a, b = torch.randn(offsets[-1] + 8, 40, dtype=dtype), torch.randn(offsets[-1] + 8, 24, dtype=dtype)
    poisoned = [int(offsets[4]), *range(int(offsets[-1]), a.shape[0])]  # expert 4's first row; past the last
    a[poisoned], b[poisoned] = float("inf"), float("inf")
    for tma in (True, False):
        monkeypatch.setitem(moe_gemm.CONFIGS, "weight_grad", {**moe_gemm.CONFIGS["weight_grad"], "TMA": tma})
        out = run_with_scratch(a.device, moe_gemm._expert_weight_grad, a, b, offsets)  # a TMA descriptor's memory
        assert out.shape == (len(counts), 40, 24) and out.dtype == dtype
        for e, (first, end) in enumerate(zip(offsets[:-1].tolist(), offsets[1:].tolist())):
            expected = (a[first:end].double().T @ b[first:end].double()).to(dtype)
            if e == 4:
                assert not out[e].isfinite().all(), "the poisoned expert's own gradient"
                continue
            torch.testing.assert_close(out[e], expected, rtol=2e-2 if dtype == torch.bfloat16 else 1e-5, atol=1e-2,
                                       msg=lambda m: f"expert {e} ({end - first} rows), TMA {tma}: {m}")


@pytest.mark.parametrize("experts", [5, 300])  # one-byte sort keys; two
@pytest.mark.parametrize("block_m", [16, 64])
def test_routing_and_tile_tables(experts, block_m):
    """The pairs sorted by expert as torch.sort of the int64 indices sorts them (stable), each expert's offset, and
    the tile tables: every tile of every expert once, in order; experts without rows take none; the last entry of
    tile_start counts the tiles."""
    from twinkle_triton import moe_gemm

    top_k, tokens = 3, 101
    index = torch.stack([torch.randperm(experts)[:top_k] for _ in range(tokens)])
    index[index == 1] = 0  # expert 1 gets no rows
    routing = moe_gemm._Routing.sort(index, experts)
    flat = index.reshape(-1)
    assert torch.equal(routing.order, torch.sort(flat, stable=True)[1])
    counts = torch.bincount(flat, minlength=experts)
    assert torch.equal(routing.offsets, torch.cat([counts.new_zeros(1), counts.cumsum(0)]))
    tile_expert, tile_start, tiles = routing.tiles(block_m)
    assert routing.tiles(block_m)[0] is tile_expert  # built once a pass
    per_expert = (counts + block_m - 1) // block_m
    want = torch.repeat_interleave(torch.arange(experts), per_expert)
    assert tiles >= want.numel() and tile_expert.dtype == tile_start.dtype == torch.int32
    assert torch.equal(tile_expert[:want.numel()].long(), want)
    assert torch.equal(tile_start.long(), torch.cat([per_expert.new_zeros(1), per_expert.cumsum(0)]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("top_k", [2, 3, 8])
def test_slot_sums_add_each_tokens_slots_in_order_in_fp32(top_k, dtype):
    """The kernel that sums each token's k rows of the [T, k, N] buffer: the slots added one after the other in
    fp32 and rounded once, bit for bit (on a GPU; the interpreter rounds to bf16 by truncation: within one bf16
    step there), at a width no block divides and at one wider than a GPU block."""
    from twinkle_triton import _launch, moe_gemm

    for n in (37, moe_gemm._SLOT_SUMS_BLOCK + 5):
        rows = torch.randn(5, top_k, n).to(dtype)
        want = rows[:, 0].float()
        for j in range(1, top_k):
            want = want + rows[:, j].float()
        got = moe_gemm._slot_sums(rows)
        assert got.dtype == dtype and got.shape == (5, n)
        if dtype == torch.bfloat16 and _launch.interpreting():
            torch.testing.assert_close(got.float(), want, rtol=2**-7, atol=0)
        else:
            assert torch.equal(got, want.to(dtype)), f"top-{top_k}, {n} columns"


def test_top_1_and_a_routing_weight_dtype_of_its_own():
    x, gate_up, down, _, _ = _inputs(torch.bfloat16, 1, tokens=9)
    index, weights = _routing(9, EXPERTS, 1)  # fp32 weights beside bf16 activations, as routers give
    out = tt.moe_swiglu_experts(x, gate_up, down, index, weights.requires_grad_())
    assert out.dtype == torch.bfloat16
    (grad,) = torch.autograd.grad(out.float().sum(), weights)
    assert grad.dtype == torch.float32
    _check(x.float(), gate_up.float(), down.float(), index, weights.detach(), torch.float32, "top-1")


def test_non_contiguous_inputs():
    x, gate_up, down, index, weights = _inputs(torch.float32, 2)
    x = torch.full((TOKENS, 2 * HIDDEN), float("nan"))[:, ::2].copy_(x)  # rows of 40 at column stride 2
    gate_up = gate_up.transpose(1, 2).contiguous().transpose(1, 2)  # [E, 2I, H] with H the slow dim
    down = down.permute(2, 1, 0).contiguous().permute(2, 1, 0)
    wide = torch.zeros(TOKENS, 4, dtype=index.dtype)
    wide[:, 1::2] = index
    _check(x, gate_up, down, wide[:, 1::2], torch.stack([weights, weights]).transpose(0, 1)[:, 0], torch.float32,
           "moe_swiglu_experts strided")


def test_no_tokens():
    x, gate_up, down, index, weights = _inputs(torch.float32, 2, tokens=0)
    x.requires_grad_()
    out = tt.moe_swiglu_experts(x, gate_up.requires_grad_(), down, index, weights)
    assert out.shape == (0, HIDDEN)
    (grad,) = torch.autograd.grad(out.sum(), gate_up)
    assert torch.equal(grad, torch.zeros_like(gate_up))


def test_repeats_bit_for_bit_with_and_without_grad():
    x, gate_up, down, index, weights = _inputs(torch.bfloat16, 3)
    leaves = [t.requires_grad_() for t in (x, gate_up, down, weights)]

    def run():
        out = tt.moe_swiglu_experts(x, gate_up, down, index, weights)
        return (out, *torch.autograd.grad(out, leaves, torch.ones_like(out)))

    first = run()
    assert all(torch.equal(a, b) for a, b in zip(first, run()))
    with torch.no_grad():  # keeps no projections for a backward; the same kernels otherwise
        assert torch.equal(tt.moe_swiglu_experts(x, gate_up, down, index, weights), first[0])


def _qwen3_moe_experts(dtype, implementation, top_k=3):
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    config = Qwen3MoeConfig(hidden_size=HIDDEN, moe_intermediate_size=INTER, num_experts=EXPERTS,
                            num_experts_per_tok=top_k)
    config._experts_implementation = implementation
    experts = Qwen3MoeExperts(config).to(dtype)
    with torch.no_grad():
        experts.gate_up_proj.normal_(0, HIDDEN**-0.5)
        experts.down_proj.normal_(0, INTER**-0.5)
    return experts


@pytest.mark.parametrize("dtype,implementation", [(torch.float32, "eager"), (torch.bfloat16, "grouped_mm")])
def test_matches_transformers_experts_module(dtype, implementation):
    experts = _qwen3_moe_experts(dtype, implementation)
    assert FusedSwiGLUExperts.forward.applies_to(experts) is None
    x = torch.randn(TOKENS, HIDDEN, dtype=dtype)
    index, weights = _routing(TOKENS, EXPERTS, 3, dtype)

    def ours(x, gate_up, down, w):
        return FusedSwiGLUExperts.forward(_Swapped(gate_up, down), x, index, w)

    def theirs(x, gate_up, down, w):
        return torch.func.functional_call(experts, {"gate_up_proj": gate_up, "down_proj": down}, (x, index, w))

    # transformers' module is the reference; the truth is the reference function in fp64 (the module's
    # grouped_mm path does not run in fp64)
    check_forward_backward(ours, theirs, (x, experts.gate_up_proj.detach(), experts.down_proj.detach(), weights),
                           dtype, f"FusedSwiGLUExperts vs {implementation}", roundings=2,
                           truth_fn=lambda x, w1, w2, w: tt.moe_swiglu_experts_reference(x, w1, w2, index, w))


class _Swapped:
    """What FusedSwiGLUExperts.forward reads of the module, with these weights."""

    def __init__(self, gate_up_proj, down_proj):
        self.gate_up_proj, self.down_proj = gate_up_proj, down_proj


def test_refuses_modules_it_does_not_compute():
    experts = _qwen3_moe_experts(torch.float32, "grouped_mm")
    applies_to = FusedSwiGLUExperts.forward.applies_to
    experts.has_bias = True
    assert "has_bias=True" in applies_to(experts)
    experts.has_bias = False
    experts.act_fn = torch.nn.GELU()
    assert "act_fn is GELU" in applies_to(experts)
    experts.act_fn = torch.nn.SiLU()
    experts.down_proj = torch.nn.Parameter(experts.down_proj[:, :, :-1].detach())
    assert "not [E, 2I, H] / [E, H, I]" in applies_to(experts)
    del experts.down_proj
    assert applies_to(experts) == "it has no down_proj"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # bf16: the weight gradients by torch._grouped_mm
def test_opcheck(dtype):
    x, gate_up, down, index, weights = _inputs(dtype, 2, tokens=6, experts=3, hidden=16, inter=16)
    args = [t.requires_grad_() for t in (x, gate_up, down)] + [index, weights.requires_grad_()]
    for save in (True, False):
        torch.library.opcheck(torch.ops.twinkle.moe_swiglu_experts.default, (*args, save))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="Inductor compiles the op's kernels itself on a GPU only")
def test_inductor_compiles_the_grouped_mm_weight_gradients():
    """Inductor's code calls the op and its backward, whose torch._grouped_mm calls sit in an op of their own, and
    gets eager's gradients (with those calls inline in Inductor's graph, CUDA asserted that each expert's row count be
    a multiple of 8, which the router does not give)."""
    x, gate_up, down, index, weights = _inputs(torch.bfloat16, 2, tokens=64, experts=4, hidden=64, inter=48)

    def grads(fn):
        leaves = [t.detach().clone().requires_grad_() for t in (x, gate_up, down, weights)]
        out = fn(*leaves)
        return (out, *torch.autograd.grad(out, leaves, torch.ones_like(out)))

    def fn(x, gate_up, down, weights):
        return tt.moe_swiglu_experts(x, gate_up, down, index, weights)

    for got, want in zip(grads(torch.compile(fn, fullgraph=True)), grads(fn)):
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


def test_compiles_with_aot_eager():
    x, gate_up, down, index, weights = _inputs(torch.float32, 2, tokens=6, experts=3, hidden=16, inter=16)
    leaves = [t.requires_grad_() for t in (x, gate_up, down, weights)]

    def fn(x, gate_up, down, weights):
        return tt.moe_swiglu_experts(x, gate_up, down, index, weights)

    got = torch.compile(fn, backend="aot_eager", fullgraph=True)(*leaves)
    want = fn(*leaves)
    torch.testing.assert_close(got, want)
    grads = [torch.autograd.grad(out, leaves, torch.ones_like(out)) for out in (got, want)]
    for g, w in zip(*grads):
        torch.testing.assert_close(g, w)


def test_rejects_bad_inputs_with_a_useful_message():
    x, gate_up, down, index, weights = _inputs(torch.float32, 2, tokens=4)
    with pytest.raises(ValueError, match=r"\[T, H\]"):
        tt.moe_swiglu_experts(x[None], gate_up, down, index, weights)
    with pytest.raises(ValueError, match="down_proj"):
        tt.moe_swiglu_experts(x, gate_up, down[:, :, :-1], index, weights)
    with pytest.raises(ValueError, match="top_k_weights"):
        tt.moe_swiglu_experts(x, gate_up, down, index, weights[:, :1])
    with pytest.raises(TypeError, match="gate_up_proj is torch.bfloat16"):
        tt.moe_swiglu_experts(x, gate_up.bfloat16(), down, index, weights)
    with pytest.raises(TypeError, match="top_k_index has dtype torch.float32"):
        tt.moe_swiglu_experts(x, gate_up, down, index.float(), weights)


def test_the_sweep_tool_knows_the_launch_order(monkeypatch):
    # tools/moe_gemm_sweep.py --per-kernel tells launches apart by their order in a forward + backward: that order
    # must be the op's, or the tool charges one kernel's time to another's setting
    import importlib.util
    from pathlib import Path

    moe_gemm = importlib.import_module("twinkle_triton.moe_gemm")
    path = Path(__file__).resolve().parents[2] / "tools" / "moe_gemm_sweep.py"
    spec = importlib.util.spec_from_file_location("moe_gemm_sweep", path)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    launched, wrap = [], moe_gemm.wrap_triton

    def recording(kernel):
        launched.append(kernel.fn.__name__ if hasattr(kernel, "fn") else kernel.__name__)
        return wrap(kernel)

    monkeypatch.setattr(moe_gemm, "wrap_triton", recording)
    # the padded way's Gluon form (Hopper) launches outside wrap_triton; the tool counts it as the Triton kernel
    monkeypatch.setitem(moe_gemm.CONFIGS["padded_weight_grad"], "GLUON", False)
    for way, launches in tool.LAUNCHES.items():
        launched.clear()
        monkeypatch.setattr(moe_gemm, "WEIGHT_GRAD", way)  # as --per-kernel sets it
        sizes = {"hidden": PADDED_HIDDEN, "inter": PADDED_INTER} if way == "padded" else {}
        x, gate_up, down, index, weights = _inputs(torch.bfloat16, 2, **sizes)
        params = [t.requires_grad_() for t in (x, gate_up, down, weights)]
        torch.autograd.grad(tt.moe_swiglu_experts(x, gate_up, down, index, weights), params, torch.randn_like(x))
        # the tool times these, not the tables', the derivative's, the copies', the slots' sums
        gemms = {name for name, _ in launches}
        assert [name for name in launched if name in gemms] == [name for name, _ in launches], way
        assert set(launched) - gemms == {"_expert_tiles_kernel", "_swiglu_grad_kernel", "_gather_token_rows_kernel",
                                         "_slot_sums_kernel"}, way
    assert {entry for launches in tool.LAUNCHES.values() for _, entry in launches} == set(moe_gemm.CONFIGS)
