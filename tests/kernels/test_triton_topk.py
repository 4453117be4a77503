"""topk: the k largest values of each row along the last dimension and their indices, torch.topk's order (nans first,
equal values by index), in one kernel; the values' gradient to the chosen positions."""

import pytest
import torch

import twinkle_triton as tt


def _rows(shape, dtype):
    return torch.randn(shape).to(dtype)


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16, torch.float16))
@pytest.mark.parametrize(("shape", "k"), [((37, 128), 8), ((2, 19, 60), 6), ((5, 8), 2), ((3, 1000), 32), ((4, 1), 1)])
def test_as_torch_topk(shape, k, dtype):
    """Router-like rows (128 experts, top-8; 60, top-6; 8, top-2), a long row and a row of one: the values and
    indices torch.topk gives where a row's values are distinct, the values bit for bit."""
    x = _rows(shape, dtype)
    values, indices = tt.topk(x, k)
    want_values, want_indices = torch.topk(x, k)
    assert values.dtype == dtype and indices.dtype == torch.int64 and values.shape == (*shape[:-1], k)
    assert torch.equal(values, want_values)
    distinct = torch.tensor([row.unique().numel() == row.numel() for row in x.reshape(-1, shape[-1])])
    assert torch.equal(indices.reshape(-1, k)[distinct], want_indices.reshape(-1, k)[distinct])
    assert torch.equal(x.gather(-1, indices), values)  # each index points at its value, ties included
    ref_values, ref_indices = tt.topk_reference(x, k)
    assert torch.equal(ref_values, values) and torch.equal(ref_indices, indices)


def test_ties_nans_and_infinities_in_torchs_order():
    """Equal values by index, nans above every number, infinities and -0 as numbers; k up to the whole row."""
    x = torch.tensor([[1.0, 3.0, 3.0, -1.0, 3.0, 0.0],
                      [float("nan"), 2.0, float("inf"), float("nan"), float("-inf"), -0.0],
                      [float("-inf")] * 6])
    values, indices = tt.topk(x, 6)
    assert indices.tolist() == [[1, 2, 4, 0, 5, 3], [0, 3, 2, 1, 5, 4], [0, 1, 2, 3, 4, 5]]
    want = torch.topk(x, 6).values
    assert torch.equal(values.isnan(), want.isnan()) and torch.equal(values.nan_to_num(), want.nan_to_num())
    ref_values, ref_indices = tt.topk_reference(x, 6)
    assert torch.equal(ref_indices, indices)


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
def test_the_values_are_the_inputs_bits(dtype):
    """A -0 keeps its sign and a nan its payload: the values are the chosen elements as they are."""
    x = torch.tensor([[-0.0, -1.0, -2.0, -3.0], [float("nan"), 1.0, -0.0, 2.0]], dtype=dtype)
    values, _ = tt.topk(x, 3)
    bits = torch.int32 if dtype == torch.float32 else torch.int16
    assert torch.equal(values.view(bits), torch.stack([x[0, :3], x[1, [0, 3, 1]]]).view(bits))


def test_strided_rows_and_empty_inputs():
    x = torch.randn(64, 40).t()  # rows of 64 with a stride of 40... the last dimension strided
    values, indices = tt.topk(x, 5)
    assert torch.equal(values, torch.topk(x, 5).values) and torch.equal(indices, torch.topk(x, 5).indices)
    values, indices = tt.topk(torch.randn(0, 16), 4)
    assert values.shape == indices.shape == (0, 4)
    values, indices = tt.topk(torch.randn(3, 16), 0)
    assert values.shape == indices.shape == (3, 0)


def test_the_values_gradient_goes_to_the_chosen_positions():
    x = torch.randn(9, 24, requires_grad=True)
    grad = torch.randn(9, 4)
    values, _ = tt.topk(x, 4)
    (got,) = torch.autograd.grad(values, x, grad)
    want_values, _ = torch.topk(x, 4)
    (want,) = torch.autograd.grad(want_values, x, grad)
    assert torch.equal(got, want)


def test_opcheck():
    torch.library.opcheck(torch.ops.twinkle.topk.default, (torch.randn(10, 32), 4))
    torch.library.opcheck(torch.ops.twinkle.topk.default, (torch.randn(6, 8, requires_grad=True), 2))


def test_rejects_bad_inputs_with_a_useful_message():
    with pytest.raises(ValueError, match="k=9"):
        tt.topk(torch.randn(3, 8), 9)
    with pytest.raises(ValueError, match="k=33"):
        tt.topk(torch.randn(3, 64), 33)
    with pytest.raises(ValueError, match="rows of at most 1024"):
        tt.topk(torch.randn(2, 1025), 2)
    with pytest.raises(TypeError, match="float64"):
        tt.topk(torch.randn(3, 8, dtype=torch.float64), 2)
    with pytest.raises(TypeError, match="x"):
        tt.topk(torch.arange(8), 2)
    with pytest.raises(ValueError, match="x"):
        tt.topk(torch.tensor(1.0), 1)
