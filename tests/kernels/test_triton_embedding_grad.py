"""embedding_grad_rows: the rows an embedding's weight gradient changes, added to a base, against the dense
gradient PyTorch computes (``embedding_dense_backward``) plus the base."""

import pytest
import torch
from kernel_test_utils import assert_close

import twinkle_triton as tt


def _dense(base, indices, grad, padding_idx=-1):
    """What the backward graph computed before the rewrite: the fp32 table, rounded, added to the base."""
    table = torch.ops.aten.embedding_dense_backward(grad.float(), indices, base.shape[0], padding_idx, False)
    return base + table.to(base.dtype)


def _applied(base, indices, grad, mask=None):
    rows, index = tt.embedding_grad_rows(base, indices, grad, mask)
    assert rows.dtype == base.dtype and index.dtype == torch.int64
    return base.index_put((index,), rows)


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16, torch.float16))
@pytest.mark.parametrize("shape", [(3, 41), (97,), (2, 3, 5)])
def test_rows_put_into_the_base_give_the_dense_gradient(shape, dtype):
    torch.manual_seed(0)
    vocab, hidden = 50, 37
    base = torch.randn(vocab, hidden, dtype=dtype)
    indices = torch.randint(0, vocab, shape)
    grad = torch.randn(*shape, hidden, dtype=dtype)
    assert_close(_applied(base, indices, grad), _dense(base, indices, grad), dtype, "weight gradient")
    rows, index = tt.embedding_grad_rows(base, indices, grad)
    want_rows, want_index = tt.embedding_grad_rows_reference(base, indices, grad)
    assert torch.equal(index, want_index)
    assert_close(rows, want_rows, dtype, "rows")


def test_an_index_repeated_past_one_loop_step_sums_every_token():
    """A padding token over half the batch: more tokens of one index than the kernel reads a step."""
    vocab, hidden = 20, 16
    indices = torch.randint(0, vocab, (2, 64))
    indices[:, 20:] = 3
    grad = torch.randn(2, 64, hidden)
    base = torch.zeros(vocab, hidden)
    assert_close(_applied(base, indices, grad), _dense(base, indices, grad), torch.float32, "weight gradient")


def test_masked_tokens_add_nothing():
    """The padding index's tokens: masked, as embedding_dense_backward leaves their row alone."""
    vocab, hidden, padding_idx = 30, 24, 4
    indices = torch.randint(0, vocab, (5, 9))
    indices[0] = padding_idx
    grad = torch.randn(5, 9, hidden)
    base = torch.randn(vocab, hidden)
    got = _applied(base, indices, grad, indices != padding_idx)
    assert_close(got, _dense(base, indices, grad, padding_idx), torch.float32, "weight gradient")
    assert torch.equal(got[padding_idx], base[padding_idx])
    # the mask as the decomposition passes it, with a trailing 1
    again = _applied(base, indices, grad, (indices != padding_idx).unsqueeze(-1))
    assert torch.equal(again, got)


def test_sums_do_not_depend_on_the_schedule():
    """Each index's tokens are summed in one order (their positions'): two runs give the same bits."""
    indices = torch.randint(0, 8, (300,))
    grad, base = torch.randn(300, 64, dtype=torch.bfloat16), torch.randn(8, 64, dtype=torch.bfloat16)
    first, second = tt.embedding_grad_rows(base, indices, grad), tt.embedding_grad_rows(base, indices, grad)
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])


def test_int32_indices_strided_grad_and_no_tokens():
    vocab, hidden = 40, 33
    base = torch.randn(vocab, hidden)
    indices = torch.randint(0, vocab, (6, 7), dtype=torch.int32)
    grad = torch.randn(6, hidden, 7).transpose(1, 2)  # non-contiguous
    assert_close(_applied(base, indices, grad), _dense(base, indices.long(), grad), torch.float32, "weight gradient")
    rows, index = tt.embedding_grad_rows(base, indices[:0], grad[:0])
    assert rows.shape == (0, hidden) and index.shape == (0,)


def test_opcheck():
    base, indices, grad = torch.randn(10, 8), torch.randint(0, 10, (2, 5)), torch.randn(2, 5, 8)
    torch.library.opcheck(torch.ops.twinkle.embedding_grad_rows.default, (base, indices, grad, None))
    torch.library.opcheck(torch.ops.twinkle.embedding_grad_rows.default, (base, indices, grad, indices != 2))


def test_rejects_bad_inputs_with_a_useful_message():
    base, indices, grad = torch.randn(10, 8), torch.randint(0, 10, (2, 5)), torch.randn(2, 5, 8)
    with pytest.raises(TypeError, match="integer indices"):
        tt.embedding_grad_rows(base, indices.float(), grad)
    with pytest.raises(ValueError, match="do not match"):
        tt.embedding_grad_rows(base, indices, grad[..., :7])
    with pytest.raises(ValueError, match="bool mask"):
        tt.embedding_grad_rows(base, indices, grad, indices)
