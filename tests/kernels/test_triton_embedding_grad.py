"""embedding_grad_sums: an embedding's weight gradient as one fp32 sum per looked-up row, against the dense
gradient PyTorch computes (``embedding_dense_backward``); add_embedding_grad: those sums added in place to a
scaled gradient (a tied LM head's)."""

import pytest
import torch
from kernel_test_utils import assert_close

import twinkle_triton as tt


def _dense(indices, grad, num_embeddings, padding_idx=-1):
    """The dense gradient of the backward graph before the rewrite, in fp32."""
    return torch.ops.aten.embedding_dense_backward(grad.float(), indices, num_embeddings, padding_idx, False)


def _table(indices, grad, num_embeddings, mask=None):
    """The dense gradient read back through the op's slots, as the rewritten graph reads it."""
    sums, slot = tt.embedding_grad_sums(indices, grad, mask, num_embeddings)
    assert sums.dtype == torch.float32 and slot.dtype == torch.int64 and slot.shape == (num_embeddings,)
    return sums[slot.clamp(min=0)] * (slot >= 0)[:, None]


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16, torch.float16))
@pytest.mark.parametrize("shape", [(3, 41), (97,), (2, 3, 5)])
def test_sums_read_through_the_slots_are_the_dense_gradient(shape, dtype):
    vocab, hidden = 50, 37
    indices = torch.randint(0, vocab, shape)
    grad = torch.randn(*shape, hidden, dtype=dtype)
    assert_close(_table(indices, grad, vocab), _dense(indices, grad, vocab), torch.float32, "weight gradient")
    sums, slot = tt.embedding_grad_sums(indices, grad, None, vocab)
    want_sums, want_slot = tt.embedding_grad_sums_reference(indices, grad, None, vocab)
    assert torch.equal(slot, want_slot)
    assert_close(sums, want_sums, torch.float32, "sums")


def test_an_index_repeated_past_one_loop_step_sums_every_token():
    """A padding token over half the batch: more tokens of one index than the kernel reads a step."""
    vocab, hidden = 20, 16
    indices = torch.randint(0, vocab, (2, 64))
    indices[:, 20:] = 3
    grad = torch.randn(2, 64, hidden)
    assert_close(_table(indices, grad, vocab), _dense(indices, grad, vocab), torch.float32, "weight gradient")


def test_an_index_over_several_segments_adds_their_sums(monkeypatch):
    """More tokens of one index than one program sums: segments summed apart, then added in order."""
    from twinkle_triton import embedding_grad

    monkeypatch.setattr(embedding_grad, "_SEGMENT", 32)
    vocab, hidden = 20, 16
    indices = torch.randint(0, vocab, (2, 64))
    indices[:, 20:] = 3  # 88 tokens: three segments, the last one partial
    indices[1, :10] = 5
    grad = torch.randn(2, 64, hidden)
    mask = indices != 5
    assert_close(_table(indices, grad, vocab, mask), _dense(indices, grad, vocab, 5), torch.float32, "weight gradient")
    first, second = (tt.embedding_grad_sums(indices, grad, mask, vocab) for _ in range(2))
    assert torch.equal(first[0], second[0])


def test_negative_indices_count_from_the_end_as_in_index_put():
    """The rewrite also replaces an accumulating index_put (torch 2.11's decomposition), whose negative indices wrap."""
    vocab, hidden = 30, 24
    indices = torch.randint(-vocab, vocab, (4, 9))
    grad = torch.randn(4, 9, hidden)
    want = torch.zeros(vocab, hidden).index_put_((indices,), grad, accumulate=True)
    assert_close(_table(indices, grad, vocab), want, torch.float32, "weight gradient")
    sums, slot = tt.embedding_grad_sums(indices, grad, None, vocab)
    want_sums, want_slot = tt.embedding_grad_sums_reference(indices, grad, None, vocab)
    assert torch.equal(slot, want_slot)
    assert_close(sums, want_sums, torch.float32, "sums")


def test_masked_tokens_add_nothing():
    """The padding index's tokens: masked, as embedding_dense_backward leaves their row at zero."""
    vocab, hidden, padding_idx = 30, 24, 4
    indices = torch.randint(0, vocab, (5, 9))
    indices[0] = padding_idx
    grad = torch.randn(5, 9, hidden)
    got = _table(indices, grad, vocab, indices != padding_idx)
    assert_close(got, _dense(indices, grad, vocab, padding_idx), torch.float32, "weight gradient")
    assert not got[padding_idx].any()
    # the mask as the decomposition passes it, with a trailing 1
    assert torch.equal(_table(indices, grad, vocab, (indices != padding_idx).unsqueeze(-1)), got)


def test_sums_do_not_depend_on_the_schedule():
    """Each index's tokens are summed in one order (their positions'): two runs give the same bits."""
    indices, grad = torch.randint(0, 8, (300,)), torch.randn(300, 64, dtype=torch.bfloat16)
    first, second = tt.embedding_grad_sums(indices, grad, None, 8), tt.embedding_grad_sums(indices, grad, None, 8)
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])


def test_int32_indices_strided_grad_and_no_tokens():
    vocab, hidden = 40, 33
    indices = torch.randint(0, vocab, (6, 7), dtype=torch.int32)
    grad = torch.randn(6, hidden, 7).transpose(1, 2)  # non-contiguous
    assert_close(_table(indices, grad, vocab), _dense(indices.long(), grad, vocab), torch.float32, "weight gradient")
    sums, slot = tt.embedding_grad_sums(indices[:0], grad[:0], None, vocab)
    assert sums.shape == (0, hidden) and torch.equal(slot, torch.full((vocab,), -1))


def test_opcheck():
    indices, grad = torch.randint(0, 10, (2, 5)), torch.randn(2, 5, 8)
    torch.library.opcheck(torch.ops.twinkle.embedding_grad_sums.default, (indices, grad, None, 10))
    torch.library.opcheck(torch.ops.twinkle.embedding_grad_sums.default, (indices, grad, indices != 2, 10))


def test_rejects_bad_inputs_with_a_useful_message():
    indices, grad = torch.randint(0, 10, (2, 5)), torch.randn(2, 5, 8)
    with pytest.raises(TypeError, match="integer indices"):
        tt.embedding_grad_sums(indices.float(), grad, None, 10)
    with pytest.raises(ValueError, match="do not match"):
        tt.embedding_grad_sums(indices, grad[:1], None, 10)
    with pytest.raises(ValueError, match="bool mask"):
        tt.embedding_grad_sums(indices, grad, indices, 10)


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
@pytest.mark.parametrize("scale", (1.0, 0.375))
def test_add_in_place_is_the_scaled_gradient_plus_the_dense_table(dtype, scale):
    vocab, hidden = 53, 37  # rows over several programs, a hidden size over several column steps on the GPU
    indices = torch.randint(0, vocab, (3, 11))
    indices[0, :5] = 7  # a row looked up by several tokens
    grad = torch.randn(3, 11, hidden, dtype=dtype)
    head = torch.randn(vocab, hidden, dtype=dtype)
    sums, slot = tt.embedding_grad_sums(indices, grad, None, vocab)
    out = head.clone()
    assert tt.add_embedding_grad(out, torch.tensor(scale, dtype=dtype), sums, slot) is None
    want = head.float() * scale + _dense(indices, grad, vocab)
    assert_close(out, want.to(dtype), dtype, "weight gradient")
    reference = head.clone()
    tt.add_embedding_grad_reference(reference, torch.tensor(scale, dtype=dtype), sums, slot)
    assert_close(out, reference, dtype, "weight gradient")
    untouched = slot < 0
    if scale == 1.0:  # rows nobody looked up are neither read nor written: the same bits
        assert torch.equal(out[untouched], head[untouched])
    else:
        assert_close(out[untouched], (head[untouched].float() * scale).to(dtype), dtype, "scaled rows")


def test_add_in_place_with_masked_tokens_no_tokens_and_a_non_finite_scale():
    vocab, hidden = 20, 16
    indices = torch.randint(0, vocab, (2, 9))
    indices[1] = 3
    grad, head = torch.randn(2, 9, hidden), torch.randn(vocab, hidden)
    sums, slot = tt.embedding_grad_sums(indices, grad, indices != 3, vocab)
    out = head.clone()
    tt.add_embedding_grad(out, torch.tensor(1.0), sums, slot)
    assert torch.equal(out[3], head[3])  # the masked index's row: no token added to it
    assert_close(out, head + _dense(indices, grad, vocab, 3), torch.float32, "weight gradient")
    none_sums, none_slot = tt.embedding_grad_sums(indices[:0], grad[:0], None, vocab)
    out = head.clone()
    tt.add_embedding_grad(out, torch.tensor(2.0), none_sums, none_slot)
    assert torch.equal(out, head * 2)
    reference = head.clone()
    tt.add_embedding_grad_reference(reference, torch.tensor(2.0), none_sums, none_slot)
    assert torch.equal(reference, head * 2)
    tt.add_embedding_grad(out, torch.tensor(float("nan")), none_sums, none_slot)  # a nan loss reaches every row
    assert out.isnan().all()


def test_add_in_place_opcheck():
    indices, grad = torch.randint(0, 10, (2, 5)), torch.randn(2, 5, 8)
    sums, slot = tt.embedding_grad_sums(indices, grad, None, 10)
    for scale in (1.0, 0.5):
        torch.library.opcheck(torch.ops.twinkle.add_embedding_grad.default,
                              (torch.randn(10, 8), torch.tensor(scale), sums, slot))


def test_add_in_place_rejects_bad_inputs_with_a_useful_message():
    indices, grad = torch.randint(0, 10, (2, 5)), torch.randn(2, 5, 8)
    sums, slot = tt.embedding_grad_sums(indices, grad, None, 10)
    out, one = torch.randn(10, 8), torch.tensor(1.0)
    with pytest.raises(TypeError, match="embedding_grad_sums' outputs"):
        tt.add_embedding_grad(out, one, sums.double(), slot)
    with pytest.raises(ValueError, match="contiguous rows"):
        tt.add_embedding_grad(torch.randn(8, 10).t(), one, sums, slot)
    with pytest.raises(ValueError, match="do not fit"):
        tt.add_embedding_grad(out[:9], one, sums, slot)
    with pytest.raises(ValueError, match="do not fit"):
        tt.add_embedding_grad(out, torch.ones(2), sums, slot)
    with pytest.raises(TypeError, match="scale"):
        tt.add_embedding_grad(out, torch.tensor(1), sums, slot)
