"""fused_linear_cross_entropy == F.cross_entropy(F.linear(x, W, b).float(), target), both strategies."""

import importlib.util
import sys

import pytest
import torch
from device_under_test import INTERPRETED
from kernel_test_utils import DTYPES, assert_close, check_forward_backward

import twinkle_triton as tt
from twinkle_triton import fused_linear_cross_entropy_tiled as tiled
from twinkle_triton import fused_linear_cross_entropy_vocab_chunked as vocab_chunked
from twinkle_triton.fused_linear_cross_entropy import default_chunk_size

flce = sys.modules["twinkle_triton.fused_linear_cross_entropy"]

VOCAB = 123  # not a multiple of any block size
# 16-wide tiles: the small test shapes then span several token tiles, vocab tiles, vocab ranges
# and gradient column blocks (partial ones included), so the merge of ranges and the locked adds run.
SMALL_TILES = ({"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "num_warps": 4, "num_stages": 2, "SPLITS_PER_SM": 2},
               {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "BLOCK_D": 16, "num_warps": 4, "num_stages": 2})


@pytest.fixture
def small_tiles(monkeypatch):
    monkeypatch.setattr(tiled, "TILED_FORWARD", SMALL_TILES[0])
    monkeypatch.setattr(tiled, "TILED_BACKWARD", SMALL_TILES[1])


def _inputs(lead, hidden, dtype, bias, ignore_every=3):
    x = torch.randn(*lead, hidden, dtype=dtype)
    weight = (torch.randn(VOCAB, hidden) / hidden**0.5).to(dtype)
    target = torch.randint(0, VOCAB, lead)
    target.view(-1)[ignore_every - 1 :: ignore_every] = -100
    return x, weight, target, (torch.randn(VOCAB, dtype=dtype) if bias else None)


def _check(x, weight, target, bias, dtype, reduction="mean", chunk_size=4, what="flce", **options):
    """chunk_size=None: the tiled strategy (with ``options``), unless ``options`` names another."""
    if chunk_size is None:
        options.setdefault("strategy", "tiled")
    roundings = 1
    if options.get("strategy") == "tiled" and not options.get("fp32_accumulation"):
        # the tiled strategy adds each vocabulary tile's share of grad_x (and each token tile's of grad_W)
        # in the input dtype: a rounding per tile, 16 columns or rows each (SMALL_TILES)
        roundings = -(-max(weight.shape[0], x.numel() // x.shape[-1]) // SMALL_TILES[1]["BLOCK_N"])

    def ours(x, weight, bias):
        return tt.fused_linear_cross_entropy(x, weight, target, bias, reduction=reduction, chunk_size=chunk_size,
                                             **options)

    def reference(x, weight, bias):
        return tt.fused_linear_cross_entropy_reference(x, weight, target, bias, reduction=reduction, **options)

    check_forward_backward(ours, lambda x, w, b: reference(x, w, b).to(ours(x, w, b).dtype), (x, weight, bias),
                           dtype, what, roundings=roundings)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("lead", [(5,), (1,), (3, 7)])
def test_matches_reference(lead, reduction, dtype):
    x, weight, target, _ = _inputs(lead, 32, dtype, bias=False)
    _check(x, weight, target, None, dtype, reduction, what=f"flce {reduction}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_tiled_matches_reference(reduction, dtype, small_tiles):
    x, weight, target, bias = _inputs((3, 13), 40, dtype, bias=True)  # hidden 40: a partial 16-column block
    _check(x, weight, target, bias, dtype, reduction, chunk_size=None, what=f"tiled {reduction}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("options", [{"label_smoothing": 0.1}, {"z_loss": 1e-2}, {"softcap": 2.0},
                                     {"label_smoothing": 0.2, "z_loss": 1e-3, "softcap": 5.0}],
                         ids=["smoothing", "z_loss", "softcap", "all"])
def test_tiled_options_match_reference(options, dtype, small_tiles):
    x, weight, target, bias = _inputs((29,), 24, dtype, bias=True)
    _check(x, weight, target, bias, dtype, "mean", chunk_size=None, what=f"tiled {options}", **options)
    _check(x, weight, target, None, dtype, "none", chunk_size=None, what=f"tiled none {options}", **options)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tiled_exact_and_fp32_accumulation_match_reference(dtype, small_tiles):
    x, weight, target, bias = _inputs((37,), 40, dtype, bias=True)
    _check(x, weight, target, bias, dtype, chunk_size=None, what="exact", filter_eps=None)
    _check(x, weight, target, bias, dtype, chunk_size=None, what="fp32 accumulation", fp32_accumulation=True)


def test_tiled_filter_skips_only_tiles_without_large_gradients(small_tiles):
    """filter_eps drops a tile's gradient products only when every entry is below it: with a
    threshold between the tiny softmax entries and the -1 of the targets, exactly the vocab tiles
    that hold no target get no weight gradient; the loss never changes."""
    x = torch.randn(32, 16)
    weight = torch.randn(256, 16) * 1e-3  # near-uniform softmax: entries ~1/256 = 0.004
    target = torch.randint(0, 64, (32,))  # targets in the first 4 of 16 vocab tiles
    x.requires_grad_()
    weight.requires_grad_()
    loss = tt.fused_linear_cross_entropy(x, weight, target, filter_eps=0.5)
    loss.backward()
    torch.testing.assert_close(loss, tt.fused_linear_cross_entropy_reference(x, weight, target))
    assert not weight.grad[64:].any() and weight.grad[:64].abs().sum(1).gt(0).all()
    exact = torch.autograd.grad(tt.fused_linear_cross_entropy(x, weight, target, filter_eps=None), weight)[0]
    assert exact[64:].abs().sum(1).gt(0).all()


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_tiled_all_targets_ignored_behaves_like_torch(reduction, small_tiles):
    x, weight, target, bias = _inputs((6,), 16, torch.float32, bias=True, ignore_every=1)
    args = [t.requires_grad_() for t in (x, weight, bias)]
    loss = tt.fused_linear_cross_entropy(x, weight, target, bias, reduction=reduction, strategy="tiled")
    want = tt.fused_linear_cross_entropy_reference(x, weight, target, bias, reduction=reduction)
    torch.testing.assert_close(loss, want, equal_nan=True)
    grads = torch.autograd.grad(loss.sum(), args)
    assert not any(g.any() for g in grads)


@pytest.mark.skipif(INTERPRETED, reason="cut-cross-entropy (pip install -e '.[bench]') installs on the CPU, but "
                    "its Triton kernels fail under the Triton interpreter: this cross-check runs on a GPU")
@pytest.mark.skipif(importlib.util.find_spec("cut_cross_entropy") is None,
                    reason="cut-cross-entropy is not installed: pip install -e '.[bench]' (the bench extra has it)")
def test_tiled_agrees_with_cut_cross_entropy():
    """Same loss and gradients as Apple's Cut Cross-Entropy (``linear_cross_entropy``, its default
    filtering) at an LLM-like shape in bf16, within bf16 tolerance of each other and of fp32."""
    from cut_cross_entropy import linear_cross_entropy

    x = torch.randn(512, 256).bfloat16().requires_grad_()
    weight = (torch.randn(32000, 256) * 0.02).bfloat16().requires_grad_()
    target = torch.randint(0, 32000, (512,))
    target[::7] = -100
    ours = tt.fused_linear_cross_entropy(x, weight, target)
    cce = linear_cross_entropy(x, weight, target)
    torch.testing.assert_close(ours, cce.float(), rtol=1e-3, atol=1e-3)
    for g_ours, g_cce in zip(torch.autograd.grad(ours, (x, weight)), torch.autograd.grad(cce, (x, weight))):
        rel = (g_ours.float() - g_cce.float()).norm() / g_cce.float().norm()
        assert rel < 2e-2, rel


@pytest.mark.parametrize("chunk_size", [1, 5, 64])
def test_bias_and_chunk_sizes(chunk_size):
    x, weight, target, bias = _inputs((3, 7), 16, torch.float32, bias=True)
    _check(x, weight, target, bias, torch.float32, chunk_size=chunk_size, what=f"flce bias chunk={chunk_size}")


@pytest.mark.parametrize("launch", [
    {"block": 32, "warps": 4, "reverse": False, "programs_per_sm": 0},  # a program a row, blocks in order
    {"block": 32, "warps": 4, "reverse": True, "programs_per_sm": 0},  # the gradient pass from the row's end
    {"block": 32, "warps": 4, "reverse": True, "programs_per_sm": 1},  # fewer programs than rows, each loops
])
@pytest.mark.parametrize("one_pass", [False, True])
def test_row_kernel_settings_agree(launch, one_pass, monkeypatch):
    """Every layout of the row kernel's work gives the reference: a program a row or programs looping over rows,
    one pass over the vocabulary or two, the second forwards or backwards (blocks of 32 here: 123 columns make a
    partial last block, which the reversed pass meets first)."""
    monkeypatch.setattr(flce, "ROW_KERNEL", {"one_pass": launch if one_pass else None, "two_passes": launch})
    monkeypatch.setattr(flce, "loop_block", lambda n, gpu_block: gpu_block)
    x, weight, target, bias = _inputs((3, 7), 16, torch.float32, bias=False)
    _check(x, weight, target, bias, torch.float32, chunk_size=8, what=f"flce {launch} one_pass={one_pass}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_pass_rows_whose_logits_climb_past_the_shift(dtype, monkeypatch):
    """The one-pass kernel stores exp(x - s) with s the first block's largest logit; rows whose later blocks reach
    more than SHIFT_SPREAD above it move s and are redone, rows whose first blocks are -inf (a frozen bias masking
    entries) start s at the first finite block. Blocks of 32 over 123 entries: the first block's logits near 0, the
    third's spread +-40 (most rows move s there), the first 40 entries masked in the biased case."""
    monkeypatch.setattr(flce, "loop_block", lambda n, gpu_block: gpu_block)
    one_pass = {**flce.ROW_KERNEL["one_pass"], "block": 32}
    monkeypatch.setattr(flce, "ROW_KERNEL", {**flce.ROW_KERNEL, "one_pass": one_pass})
    x, weight, target, _ = _inputs((5, 7), 16, torch.float32, bias=False, ignore_every=4)
    weight[:32] *= 0.01
    weight[64:96] *= 40.0
    masked = torch.zeros(VOCAB)
    masked[:40] = float("-inf")
    target = torch.where((target >= 0) & (target < 40), target + 40, target)  # no target is a masked entry
    for bias in (None, masked):  # the bias frozen: its gradient is not asked for

        def ours(x, weight, bias=bias):
            bias = None if bias is None else bias.to(x.dtype)
            return tt.fused_linear_cross_entropy(x, weight, target, bias, chunk_size=16)

        def reference(x, weight, bias=bias):
            bias = None if bias is None else bias.to(x.dtype)
            return tt.fused_linear_cross_entropy_reference(x, weight, target, bias).to(ours(x, weight).dtype)

        check_forward_backward(ours, reference, (x.to(dtype), weight.to(dtype)), dtype,
                               f"flce climbing logits, bias {bias is not None}")


def test_fp16_logits_spread_past_its_range(monkeypatch):
    """fp16 overflows at exp(11), so its gradients keep two passes: rows whose logits climb 10-30 above the first
    block's largest (no shift move at SHIFT_SPREAD=32) would store exp(x - s) as inf in one pass."""
    monkeypatch.setattr(flce, "loop_block", lambda n, gpu_block: gpu_block)
    launch = {"block": 32, "warps": 4, "programs_per_sm": 1}
    monkeypatch.setattr(flce, "ROW_KERNEL", {"one_pass": launch, "two_passes": {**launch, "reverse": True}})
    x, weight, target, _ = _inputs((5, 7), 16, torch.float32, bias=False)
    weight[:32] *= 0.01
    weight[64:96] *= 6.0
    _check(x.half(), weight.half(), target, None, torch.float16, chunk_size=16, what="flce fp16 wide logits")


def test_non_contiguous_x_and_weight():
    x = torch.randn(16, 10).t()  # [10, 16], transposed
    weight = torch.randn(16, 2 * VOCAB).t()[::2]  # [123, 16], strided rows
    target = torch.randint(0, VOCAB, (10,))
    _check(x, weight, target, None, torch.float32, what="flce strided")


def test_empty_batch():
    x, weight, target, _ = _inputs((0,), 16, torch.float32, bias=False)
    x.requires_grad_()
    weight.requires_grad_()
    loss = tt.fused_linear_cross_entropy(x, weight, target, reduction="sum")
    loss.backward()
    assert loss.item() == 0.0 and x.grad.shape == (0, 16) and not weight.grad.any()


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_all_targets_ignored_behaves_like_torch(reduction):
    """mean over zero targets is nan (0/0) like F.cross_entropy, sum is 0; gradients are zero."""
    x, weight, target, _ = _inputs((6,), 16, torch.float32, bias=False, ignore_every=1)
    x.requires_grad_()
    weight.requires_grad_()
    loss = tt.fused_linear_cross_entropy(x, weight, target, reduction=reduction, chunk_size=4)
    want = tt.fused_linear_cross_entropy_reference(x, weight, target, reduction=reduction)
    torch.testing.assert_close(loss, want, equal_nan=True)
    loss.backward()
    assert not x.grad.any() and not weight.grad.any()


def test_frozen_weight_gets_no_gradient_and_costs_none():
    x, weight, target, _ = _inputs((5,), 16, torch.float32, bias=False)
    x.requires_grad_()
    out = torch.ops.twinkle.fused_linear_cross_entropy.default(x, weight, target, None, -100, "mean", 4, True, False, False)
    assert out[2].numel() == 0  # no grad_weight buffer
    tt.fused_linear_cross_entropy(x, weight, target, chunk_size=4).backward()
    assert weight.grad is None and x.grad is not None


def test_no_grad_computes_loss_only():
    x, weight, target, bias = _inputs((5,), 16, torch.float32, bias=True)
    with torch.no_grad():
        loss = tt.fused_linear_cross_entropy(x, weight.requires_grad_(), target, bias, chunk_size=2)
    assert_close(loss, tt.fused_linear_cross_entropy_reference(x, weight, target, bias).detach(), torch.float32, "loss")


def test_backward_twice_through_one_graph_rescales_the_saved_gradients():
    x, weight, target, _ = _inputs((5,), 16, torch.float32, bias=False)
    x.requires_grad_()
    loss = tt.fused_linear_cross_entropy(x, weight, target)
    want = torch.autograd.grad(tt.fused_linear_cross_entropy_reference(x, weight, target), x)[0]
    for scale in (2.0, -0.5, 1.0):
        got = torch.autograd.grad(loss, x, torch.tensor(scale), retain_graph=True)[0]
        assert_close(got, want * scale, torch.float32, f"grad at scale {scale}")


def test_default_chunk_size_fits_the_reference_workload_budget():
    # 4096 tokens x 896 hidden -> 151936 vocab, bf16: three chunks of 1366 rows, a 396 MiB logits chunk; with the
    # 0.254 GiB grad_W and 7 MiB grad_x the extra memory (0.65 GiB measured on an H200) stays far under 0.3x the
    # unfused reference's 6.96 GiB.
    assert default_chunk_size(151936, torch.bfloat16) == 1536
    chunk = default_chunk_size(151936, torch.bfloat16, 4096)
    assert chunk == 1366
    extra = chunk * 151936 * 2 + 151936 * 896 * 2 + 4096 * 896 * 2
    assert extra < 0.7 * 2**30 < 0.3 * 6.96 * 2**30
    # Small vocabularies get more rows (whole 256-row GEMM tiles), tiny ones at least 16.
    assert default_chunk_size(32000, torch.bfloat16) % 256 == 0
    assert default_chunk_size(10**9, torch.float32) == 16


@pytest.mark.parametrize("rows", (4096, 5000, 8191, 2100, 100_000))
def test_default_chunks_split_the_rows_evenly_within_the_budget(rows):
    """Llama's 128256 entries allow 2048 rows a chunk: 5000 rows become three chunks of 1667, not two of 2048 and
    a third of 904; no chunk is larger than the budget's, none far smaller than the others."""
    budget = default_chunk_size(128256, torch.bfloat16)
    chunk = default_chunk_size(128256, torch.bfloat16, rows)
    assert chunk <= budget
    chunks = -(-rows // chunk)
    assert chunks == -(-rows // budget)  # no more chunks than the budget needs
    assert rows - (chunks - 1) * chunk >= chunk - chunks  # the last chunk is as large as the others, within a row each
    assert default_chunk_size(128256, torch.bfloat16, 5000) == 1667
    assert default_chunk_size(128256, torch.bfloat16, 600) == budget  # one chunk: the budget's size


def test_gradcheck_fp64():
    x, weight, target, bias = _inputs((4,), 3, torch.float64, bias=True, ignore_every=4)
    weight = weight[:7].contiguous()
    bias = bias[:7].contiguous()
    target = target.clamp(max=6) * (target >= 0) + (-100) * (target < 0)
    args = [t.requires_grad_() for t in (x, weight, bias)]
    assert torch.autograd.gradcheck(
        lambda x, w, b: tt.fused_linear_cross_entropy(x, w, target, b, chunk_size=3), args
    )


def test_opcheck():
    x, weight, target, bias = _inputs((5,), 8, torch.float32, bias=True)
    args = (x.requires_grad_(), weight.requires_grad_(), target, bias.requires_grad_(), -100, "mean", 2, True, True, True)
    torch.library.opcheck(torch.ops.twinkle.fused_linear_cross_entropy.default, args)


def test_opcheck_tiled(small_tiles):
    x, weight, target, bias = _inputs((21,), 24, torch.float32, bias=True)
    args = (x.requires_grad_(), weight.requires_grad_(), target, bias.requires_grad_(), -100, 0.1, 1e-3, 0.0,
            1e-6, False)
    torch.library.opcheck(torch.ops.twinkle.fused_linear_cross_entropy_tiled.default, args)


def _compiled_matches_reference(backend, **options):
    x, weight, target, bias = _inputs((2, 6), 16, torch.float32, bias=True)
    target[0, :4] = -100

    def loss_fn(flce, x, weight, bias):
        return flce(x, weight, target, bias, ignore_index=-100, reduction="mean") * 3.0

    args = [t.requires_grad_() for t in (x, weight, bias)]
    compiled = torch.compile(loss_fn, backend=backend, fullgraph=True)
    got = compiled(lambda *a, **k: tt.fused_linear_cross_entropy(*a, **k, **(options or {"chunk_size": 5})), *args)
    want = loss_fn(tt.fused_linear_cross_entropy_reference, *args)
    assert_close(got, want, torch.float32, f"{backend} loss")
    for g, w in zip(torch.autograd.grad(got, args), torch.autograd.grad(want, args)):
        assert_close(g, w, torch.float32, f"{backend} grad")


def test_compiled_with_aot_eager_and_ignored_labels_matches_reference():
    """Liger's FLCE returned wrong losses with ignore_index under torch.compile; ours must not."""
    _compiled_matches_reference("aot_eager")


def test_tiled_compiled_with_aot_eager_matches_reference(small_tiles):
    _compiled_matches_reference("aot_eager", strategy="tiled")


def test_tiled_non_contiguous_x_and_weight(small_tiles):
    x = torch.randn(16, 10).t()
    weight = torch.randn(16, 2 * VOCAB).t()[::2]
    target = torch.randint(0, VOCAB, (10,))
    _check(x, weight, target, None, torch.float32, chunk_size=None, what="tiled strided")


def test_compiled_with_inductor_and_ignored_labels_matches_reference():
    _compiled_matches_reference("inductor")


def test_rejects_bad_inputs_with_a_useful_message():
    x, weight, target, _ = _inputs((5,), 16, torch.float32, bias=False)
    with pytest.raises(ValueError, match="reduction='none'.*strategy='vocab_chunked'"):
        tt.fused_linear_cross_entropy(x, weight, target, reduction="none", chunk_size=4)
    with pytest.raises(ValueError, match="label_smoothing"):
        tt.fused_linear_cross_entropy(x, weight, target, strategy="chunked", label_smoothing=0.1)
    with pytest.raises(ValueError, match="reduction='avg'"):
        tt.fused_linear_cross_entropy(x, weight, target, reduction="avg")
    with pytest.raises(ValueError, match="strategy='fast'"):
        tt.fused_linear_cross_entropy(x, weight, target, strategy="fast")
    with pytest.raises(ValueError, match="softcap"):
        tt.fused_linear_cross_entropy(x, weight, target, softcap=-1.0)
    with pytest.raises(ValueError, match="filter_eps"):
        tt.fused_linear_cross_entropy(x, weight, target, filter_eps="fast")
    with pytest.raises(ValueError, match="target"):
        tt.fused_linear_cross_entropy(x, weight, target[:3])
    with pytest.raises(ValueError, match="dtypes"):
        tt.fused_linear_cross_entropy(x, weight.double(), target)


# ---------------------------------------------------------------- strategy="vocab_chunked"

@pytest.fixture(params=["tiled", "cublas"])
def vocab_forward(request, monkeypatch, small_tiles):
    """Both forwards of the vocab-chunked strategy (the Triton online-LSE matmul, cuBLAS chunks)."""
    monkeypatch.setattr(vocab_chunked, "VOCAB_CHUNKED_FORWARD", request.param)
    return request.param


# The cuBLAS forward (not the default) is interpreted slowly (~8 s a case): every dtype and option
# runs with the default tiled forward, a subset with the cuBLAS one.


@pytest.mark.parametrize(("dtype", "reduction", "vocab_forward"),
                         [(dtype, reduction, "tiled") for dtype in DTYPES for reduction in ("mean", "sum", "none")]
                         + [(torch.float32, "mean", "cublas"), (torch.bfloat16, "none", "cublas")],
                         indirect=["vocab_forward"])
def test_vocab_chunked_matches_reference(reduction, dtype, vocab_forward):
    # 123 vocab in chunks of 50: two whole chunks and a partial one; odd token count, bias
    x, weight, target, bias = _inputs((3, 13), 40, dtype, bias=True)
    _check(x, weight, target, bias, dtype, reduction, chunk_size=50, strategy="vocab_chunked",
           what=f"vocab_chunked {vocab_forward} {reduction}")


_ALL_OPTIONS = {"label_smoothing": 0.2, "z_loss": 1e-3, "softcap": 5.0}


@pytest.mark.parametrize(("options", "dtype", "vocab_forward"),
                         [(options, dtype, "tiled") for dtype in (torch.float32, torch.bfloat16)
                          for options in ({"label_smoothing": 0.1}, {"z_loss": 1e-2}, {"softcap": 2.0}, _ALL_OPTIONS)]
                         + [(_ALL_OPTIONS, torch.float32, "cublas")], indirect=["vocab_forward"])
def test_vocab_chunked_options_match_reference(options, dtype, vocab_forward):
    x, weight, target, bias = _inputs((29,), 24, dtype, bias=True)
    _check(x, weight, target, bias, dtype, "mean", chunk_size=64, strategy="vocab_chunked",
           what=f"vocab_chunked {options}", **options)
    _check(x, weight, target, None, dtype, "none", chunk_size=64, strategy="vocab_chunked",
           what=f"vocab_chunked none {options}", **options)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_vocab_chunked_all_targets_ignored_behaves_like_torch(reduction, vocab_forward):
    x, weight, target, bias = _inputs((6,), 16, torch.float32, bias=True, ignore_every=1)
    args = [t.requires_grad_() for t in (x, weight, bias)]
    loss = tt.fused_linear_cross_entropy(x, weight, target, bias, reduction=reduction, strategy="vocab_chunked",
                                         chunk_size=40)
    want = tt.fused_linear_cross_entropy_reference(x, weight, target, bias, reduction=reduction)
    torch.testing.assert_close(loss, want, equal_nan=True)
    grads = torch.autograd.grad(loss.sum(), args)
    assert not any(g.any() for g in grads)


def test_vocab_chunked_empty_batch_and_frozen_weight(vocab_forward):
    x, weight, target, _ = _inputs((0,), 16, torch.float32, bias=False)
    args = [t.requires_grad_() for t in (x, weight)]
    loss = tt.fused_linear_cross_entropy(x, weight, target, reduction="sum", strategy="vocab_chunked")
    grad_x, grad_w = torch.autograd.grad(loss, args)
    assert loss.item() == 0.0 and grad_x.shape == (0, 16) and not grad_w.any()
    x, weight, target, _ = _inputs((5,), 16, torch.float32, bias=False)
    x.requires_grad_()
    tt.fused_linear_cross_entropy(x, weight, target, strategy="vocab_chunked").backward()
    assert weight.grad is None and x.grad is not None


def test_vocab_chunked_strided_inputs_and_compiled(vocab_forward):
    x = torch.randn(16, 10).t()
    weight = torch.randn(16, 2 * VOCAB).t()[::2]
    target = torch.randint(0, VOCAB, (10,))
    _check(x, weight, target, None, torch.float32, chunk_size=32, strategy="vocab_chunked", what="strided")
    _compiled_matches_reference("aot_eager", strategy="vocab_chunked", chunk_size=32)


def test_vocab_chunked_gradcheck_fp64():
    x, weight, target, bias = _inputs((4,), 3, torch.float64, bias=True, ignore_every=4)
    weight, bias = weight[:7].contiguous(), bias[:7].contiguous()
    target = target.clamp(max=6) * (target >= 0) + (-100) * (target < 0)
    args = [t.requires_grad_() for t in (x, weight, bias)]
    assert torch.autograd.gradcheck(
        lambda x, w, b: tt.fused_linear_cross_entropy(x, w, target, b, strategy="vocab_chunked", chunk_size=3,
                                                      z_loss=0.5), args
    )


def test_opcheck_vocab_chunked(small_tiles):
    x, weight, target, bias = _inputs((21,), 24, torch.float32, bias=True)
    args = (x.requires_grad_(), weight.requires_grad_(), target, bias.requires_grad_(), -100, 0.1, 1e-3, 0.0, 50)
    torch.library.opcheck(torch.ops.twinkle.fused_linear_cross_entropy_vocab_chunked.default, args)


def test_default_vocab_chunk_fits_its_budget():
    # the reference workload: 4096 tokens, bf16 -> whole 256-column tiles within VOCAB_CHUNK_BYTES, which
    # hold the fp32 logits (4 bytes each) and their bf16 gradient (2)
    cols = vocab_chunked.default_vocab_chunk(4096, 151936, torch.bfloat16)
    assert cols % 256 == 0 and 4096 * cols * 6 <= vocab_chunked.VOCAB_CHUNK_BYTES < 4096 * (cols + 256) * 6
    assert vocab_chunked.default_vocab_chunk(4096, 300, torch.bfloat16) == 300  # never more than the vocabulary
    assert vocab_chunked.default_vocab_chunk(10**7, 151936, torch.float32) == 256  # at least one tile


def test_vocab_chunked_rejects_tiled_only_options():
    x, weight, target, _ = _inputs((5,), 16, torch.float32, bias=False)
    with pytest.raises(ValueError, match="filter_eps / fp32_accumulation apply to strategy='tiled'"):
        tt.fused_linear_cross_entropy(x, weight, target, strategy="vocab_chunked", filter_eps="auto")


def test_options_chunked_lacks_default_to_the_exact_vocab_chunked_strategy(monkeypatch):
    """label_smoothing / z_loss / softcap / reduction='none' without filter_eps take the exact
    vocab-chunked strategy (exact tiling is 4x slower); filter_eps or fp32_accumulation take tiled."""
    calls = []
    real = flce.vocab_chunked_op
    monkeypatch.setattr(flce, "vocab_chunked_op", lambda *args: calls.append(args) or real(*args))
    x, weight, target, _ = _inputs((9,), 16, torch.float32, bias=False)
    for options in ({"label_smoothing": 0.1}, {"z_loss": 1e-3}, {"softcap": 3.0}, {"reduction": "none"}):
        tt.fused_linear_cross_entropy(x, weight, target, **options)
    assert len(calls) == 4
    tt.fused_linear_cross_entropy(x, weight, target, label_smoothing=0.1, filter_eps="auto")
    tt.fused_linear_cross_entropy(x, weight, target, reduction="none", fp32_accumulation=True)
    tt.fused_linear_cross_entropy(x, weight, target)  # chunked
    assert len(calls) == 4
