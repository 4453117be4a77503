"""gqa_attention against SDPA over transformers' repeat_kv K/V, forward and backward.

The cases are a chosen slice of L in {1, 3, 17}, S in {1, 37, 300}, D in {32, 64, 80}, G in
{1, 2, 7}, B in {1, 3}, the mask kinds and the three dtypes (not their product: each interpreted
case costs ~0.5-1 s on CPU). S = 300 with one or two KV groups also runs the forward's split +
combine path under the interpreter (see ``_num_splits``); 17 query rows x 7 heads tile the rows.
"""

import functools
import math
import sys

import pytest
import torch
from kernel_test_utils import assert_as_accurate, assert_close, check_forward_backward

import twinkle_triton as tt
from twinkle_triton.gqa_attention import _gqa_forward, _num_splits, repeat_kv


def _mask(kind: str, batch: int, seq_q: int, seq_k: int, dtype: torch.dtype):
    """A mask of ``kind``; ``None`` for "none". Every kind but "fully_masked" leaves each row a key."""
    if kind == "none":
        return None
    keep = torch.rand(batch, 1, seq_q, seq_k) > 0.3
    keep[..., 0] = True
    if kind == "bool":
        return keep
    if kind == "bool_broadcast":  # one mask for every batch row and head: (1, 1, L, S)
        return keep[:1]
    if kind == "fully_masked":  # row 1 of batch 0 attends to nothing: zeros, no gradient
        keep[0, 0, min(1, seq_q - 1)] = False
        return keep
    bias = torch.randn(batch, 1, seq_q, seq_k, dtype=dtype)
    bias = bias.masked_fill(~keep, float("-inf"))
    if kind == "float":
        return bias
    if kind == "float_min_row":  # a row of finfo.min (transformers' eager masks): uniform attention, like SDPA
        bias[-1, 0, -1] = torch.finfo(dtype).min
        return bias
    raise ValueError(kind)


def _check(query, key, value, attn_mask, dtype, what, scale=None, reference=None):
    reference = reference or _ref
    truth_mask = attn_mask.double() if attn_mask is not None and attn_mask.is_floating_point() else attn_mask
    check_forward_backward(
        functools.partial(_gqa, attn_mask=attn_mask, scale=scale),
        functools.partial(reference, attn_mask=attn_mask, scale=scale),
        (query, key, value), dtype, what,
        truth_fn=functools.partial(reference, attn_mask=truth_mask, scale=scale),
    )


def _gqa(q, k, v, *, attn_mask, scale):
    return tt.gqa_attention(q, k, v, attn_mask=attn_mask, scale=scale)


def _ref(q, k, v, *, attn_mask, scale):
    return tt.gqa_attention_reference(q, k, v, attn_mask=attn_mask, scale=scale)


def _softmax_ref(q, k, v, *, attn_mask, scale):
    """Attention spelled out (the softmax's backward uses its saved output). SDPA's CPU backward
    recomputes the probabilities from lse = max + log(sum), which loses log(sum) next to a max of
    finfo.min: for a row masked with finfo.min everywhere its gradients are S times too large."""
    group = q.shape[1] // k.shape[1]
    scores = q @ repeat_kv(k, group).transpose(-1, -2) * (scale or q.shape[-1] ** -0.5) + attn_mask
    return torch.softmax(scores, dim=-1) @ repeat_kv(v, group)


CASES = [
    # batch, kv heads, group, L, S, D, mask, dtype
    (1, 2, 7, 1, 300, 64, "bool", torch.bfloat16),  # Qwen2-0.5B decode; split + combine
    (3, 2, 7, 1, 37, 64, "bool_broadcast", torch.float16),
    (3, 2, 2, 3, 37, 80, "float", torch.float32),  # D not a power of two
    (1, 1, 7, 17, 37, 32, "none", torch.float16),  # 119 rows: two row blocks
    (3, 1, 1, 1, 1, 64, "bool_broadcast", torch.float32),  # one key, G = 1 (plain MHA)
    (1, 2, 2, 17, 300, 32, "fully_masked", torch.bfloat16),
    (1, 1, 2, 3, 300, 80, "float_min_row", torch.float32),
    (3, 2, 1, 3, 1, 32, "float", torch.bfloat16),
    (1, 1, 7, 3, 300, 64, "none", torch.float32),
    (1, 2, 2, 1, 37, 80, "fully_masked", torch.float16),
]


@pytest.mark.parametrize("batch,kv_heads,group,seq_q,seq_k,head_dim,mask_kind,dtype", CASES)
def test_matches_sdpa_over_repeat_kv(batch, kv_heads, group, seq_q, seq_k, head_dim, mask_kind, dtype):
    q = torch.randn(batch, kv_heads * group, seq_q, head_dim, dtype=dtype)
    k = torch.randn(batch, kv_heads, seq_k, head_dim, dtype=dtype)
    v = torch.randn(batch, kv_heads, seq_k, head_dim, dtype=dtype)
    mask = _mask(mask_kind, batch, seq_q, seq_k, dtype)
    reference = _softmax_ref if mask_kind == "float_min_row" else None
    _check(q, k, v, mask, dtype, f"gqa_attention {mask_kind} {tuple(q.shape)} kv {tuple(k.shape)}", reference=reference)


def test_fully_masked_rows_are_zero_and_pass_no_gradient():
    q = torch.randn(1, 4, 3, 32, requires_grad=True)
    k = torch.randn(1, 2, 37, 32, requires_grad=True)
    v = torch.randn(1, 2, 37, 32, requires_grad=True)
    mask = torch.ones(1, 1, 3, 37, dtype=torch.bool)
    mask[0, 0, 1] = False
    out = tt.gqa_attention(q, k, v, attn_mask=mask)
    assert out.isfinite().all()
    assert (out[:, :, 1] == 0).all()
    (grad_q,) = torch.autograd.grad(out.sum(), q)
    assert (grad_q[:, :, 1] == 0).all() and grad_q.isfinite().all()
    float_mask = torch.zeros(1, 1, 3, 37).masked_fill(~mask, float("-inf"))
    assert (tt.gqa_attention(q, k, v, attn_mask=float_mask)[:, :, 1] == 0).all()


def test_strided_query_and_cache_read_in_place():
    # q from a (B, L, H, D) projection transposed, as in transformers; K/V a slice of a longer cache.
    dtype = torch.bfloat16
    q = torch.randn(3, 3, 14, 64, dtype=dtype).transpose(1, 2)
    cache_k = torch.randn(3, 2, 64, 64, dtype=dtype)
    cache_v = torch.randn(3, 2, 64, 64, dtype=dtype)
    k, v = cache_k[:, :, :37], cache_v[:, :, :37]
    assert not q.is_contiguous() and not k.is_contiguous()
    mask = _mask("bool", 3, 3, 37, dtype)
    _check(q, k, v, mask, dtype, "gqa_attention strided", scale=0.3)
    out = tt.gqa_attention(q, k, v, attn_mask=mask)
    assert out.is_contiguous() and out.shape == (3, 14, 3, 64)


# finfo.min - score overflows to -inf (probability 0, as wanted); the interpreter's numpy says so.
@pytest.mark.filterwarnings("ignore:overflow encountered in multiply:RuntimeWarning")
@pytest.mark.parametrize("num_splits", [2, 5])
def test_split_keys_combine_to_the_unsplit_result(num_splits):
    # Splits where the mask excludes every key of a split (a static cache's unwritten tail) and a
    # float mask of finfo.min (the combine must not lose the row's offset).
    q, k, v = torch.randn(2, 6, 2, 32), torch.randn(2, 3, 300, 32), torch.randn(2, 3, 300, 32)
    tail = torch.arange(300) < 100
    masks = [tail.expand(2, 1, 2, 300), torch.zeros(2, 1, 2, 300).masked_fill(~tail, torch.finfo(torch.float32).min)]
    for mask in masks:
        out, _ = _gqa_forward(q, k, v, mask, 0.2, num_splits)
        assert_close(out, tt.gqa_attention_reference(q, k, v, mask, 0.2), torch.float32, f"{num_splits} splits")


def test_splits_past_the_last_key_add_nothing(monkeypatch):
    # With a symbolic key length the split count is fixed (SYMBOLIC_SPLITS) and trailing splits may be empty.
    module = sys.modules["twinkle_triton.gqa_attention"]
    monkeypatch.setattr(module, "_split_length", lambda seq_k, splits, block_s: (8, 64))
    q, k, v = torch.randn(1, 4, 1, 32), torch.randn(1, 2, 100, 32), torch.randn(1, 2, 100, 32)
    out, _ = _gqa_forward(q, k, v, None, 0.2, 8)
    assert_close(out, tt.gqa_attention_reference(q, k, v, None, 0.2), torch.float32, "empty splits")


def test_split_heuristic_fills_the_gpu_with_long_enough_splits():
    # Not a CUDA device: the heuristic plans for one SM (PROGRAMS_PER_SM programs).
    cpu = torch.device("cpu")
    assert _num_splits(1, 300, 64, cpu) == (3, 128)
    assert _num_splits(4, 300, 64, cpu) == (1, 320)  # enough programs already
    assert _num_splits(1, 37, 64, cpu) == (1, 64)  # shorter than one split
    splits, length = _num_splits(1, 10_000, 64, cpu)
    assert splits * length >= 10_000 and length % 64 == 0


def test_no_keys_gives_zeros():
    out = tt.gqa_attention(torch.randn(2, 4, 3, 16), torch.randn(2, 2, 0, 16), torch.randn(2, 2, 0, 16))
    assert out.shape == (2, 4, 3, 16) and (out == 0).all()


def test_default_scale_is_one_over_sqrt_head_dim():
    q, k, v = torch.randn(1, 2, 1, 48), torch.randn(1, 1, 37, 48), torch.randn(1, 1, 37, 48)
    want = torch.nn.functional.scaled_dot_product_attention(q, repeat_kv(k, 2), repeat_kv(v, 2),
                                                            scale=1 / math.sqrt(48))
    assert_close(tt.gqa_attention(q, k, v), want, torch.float32, "default scale")


def test_compiles_with_aot_eager_forward_and_backward():
    q = torch.randn(2, 3, 4, 32, requires_grad=True)  # (B, L, H, D), transposed in the graph
    k = torch.randn(2, 2, 37, 32, requires_grad=True)
    v = torch.randn(2, 2, 37, 32, requires_grad=True)
    mask = _mask("bool", 2, 3, 37, torch.float32)

    def block(q, k, v, mask):
        return (tt.gqa_attention((q * 2).transpose(1, 2), k, v, attn_mask=mask) ** 2).sum()

    def reference(q, k, v, mask):
        return (tt.gqa_attention_reference((q * 2).transpose(1, 2), k, v, attn_mask=mask) ** 2).sum()

    got = torch.compile(block, backend="aot_eager", fullgraph=True)(q, k, v, mask)
    want = reference(q, k, v, mask)
    assert_close(got, want, torch.float32, "loss")
    for g, w in zip(torch.autograd.grad(got, (q, k, v)), torch.autograd.grad(want, (q, k, v))):
        assert_close(g, w, torch.float32, "grad")


def test_compiles_with_dynamic_shapes():
    # Prefill then decode, and a growing cache: L, S and the batch are symbolic in the graph (on a GPU
    # the op's impl is traced with them: the split count must not need their values).
    compiled = torch.compile(tt.gqa_attention, backend="aot_eager", dynamic=True, fullgraph=True)
    for batch, seq_q, seq_k in ((2, 5, 37), (3, 1, 300), (1, 1, 64)):
        q, k, v = torch.randn(batch, 4, seq_q, 32), torch.randn(batch, 2, seq_k, 32), torch.randn(batch, 2, seq_k, 32)
        mask = torch.rand(batch, 1, seq_q, seq_k) > 0.2
        assert_close(compiled(q, k, v, mask), tt.gqa_attention_reference(q, k, v, mask), torch.float32,
                     f"dynamic {batch} x {seq_q} x {seq_k}")


def test_opcheck():
    q, k, v = torch.randn(1, 4, 3, 16), torch.randn(1, 2, 20, 16), torch.randn(1, 2, 20, 16)
    mask = torch.rand(1, 1, 3, 20) > 0.2
    torch.library.opcheck(torch.ops.twinkle.gqa_attention.default,
                          (q.requires_grad_(), k.requires_grad_(), v, mask, 0.25))
    out, stats = torch.ops.twinkle.gqa_attention.default(q.detach(), k.detach(), v, mask, 0.25)
    torch.library.opcheck(torch.ops.twinkle.gqa_attention_backward.default,
                          (torch.randn_like(out), q.detach(), k.detach(), v, mask, out, stats, 0.25))


def test_half_precision_output_is_as_accurate_as_sdpa_at_decode():
    # bf16 at the decode shape the op is for, compared with the fp64 truth (what the model sees).
    q = torch.randn(4, 14, 1, 64, dtype=torch.bfloat16)
    k, v = torch.randn(4, 2, 300, 64, dtype=torch.bfloat16), torch.randn(4, 2, 300, 64, dtype=torch.bfloat16)
    mask = torch.arange(300).expand(4, 1, 1, 300) < torch.tensor([300, 1, 150, 7]).view(4, 1, 1, 1)
    got = tt.gqa_attention(q, k, v, attn_mask=mask)
    ref = tt.gqa_attention_reference(q, k, v, attn_mask=mask)
    truth = tt.gqa_attention_reference(q.double(), k.double(), v.double(), attn_mask=mask)
    assert_as_accurate(got, ref, truth, torch.bfloat16, "decode output")


def test_rejects_bad_inputs_with_useful_messages():
    q, k = torch.randn(2, 6, 3, 16), torch.randn(2, 2, 5, 16)
    with pytest.raises(ValueError, match="attn_mask requires grad"):
        tt.gqa_attention(q, k, k, attn_mask=torch.zeros(2, 1, 3, 5, requires_grad=True))
    with pytest.raises(ValueError, match="does not broadcast"):
        tt.gqa_attention(q, k, k, attn_mask=torch.ones(2, 1, 3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="bool .* or floating"):
        tt.gqa_attention(q, k, k, attn_mask=torch.ones(2, 1, 3, 5, dtype=torch.int64))
    with pytest.raises(ValueError, match="multiple of the key/value heads"):
        tt.gqa_attention(torch.randn(2, 5, 3, 16), k, k)
    with pytest.raises(ValueError, match="one of float16, bfloat16, float32"):
        tt.gqa_attention(q, k.half(), k.half())
    with pytest.raises(ValueError, match="head_dim"):
        tt.gqa_attention(q, torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8))
    with pytest.raises(ValueError, match="4-D"):
        tt.gqa_attention(q[0], k, k)
