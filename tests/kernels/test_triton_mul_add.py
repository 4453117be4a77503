"""mul_add = a * b + c, with torch broadcasting."""

import pytest
import torch
from kernel_test_utils import DTYPES, assert_close, check_forward_backward

import twinkle_triton as tt


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5, 123), (1, 123), (3, 7, 123), (0, 123)])
def test_same_shapes_match_reference(shape, dtype):
    a, b, c = (torch.randn(shape, dtype=dtype) for _ in range(3))
    check_forward_backward(tt.mul_add, tt.mul_add_reference, (a, b, c), dtype, "mul_add")


@pytest.mark.parametrize("shapes", [((3, 7, 123), (123,), (123,)), ((5, 1), (1, 123), (5, 123)), ((123,), (4, 123), (4, 1))])
def test_broadcasting_matches_reference(shapes):
    a, b, c = (torch.randn(s) for s in shapes)
    check_forward_backward(tt.mul_add, tt.mul_add_reference, (a, b, c), torch.float32, f"mul_add {shapes}")


def test_non_contiguous_inputs():
    a, b, c = torch.randn(123, 5).t(), torch.randn(5, 200)[:, :123], torch.randn(5, 123)
    check_forward_backward(tt.mul_add, tt.mul_add_reference, (a, b, c), torch.float32, "mul_add strided")


def test_gradcheck_fp64():
    a, b, c = (torch.randn(s, dtype=torch.float64, requires_grad=True) for s in ((3, 4), (4,), (3, 1)))
    assert torch.autograd.gradcheck(tt.mul_add, (a, b, c))


def test_opcheck():
    a, b, c = (torch.randn(3, 8, requires_grad=True) for _ in range(3))
    torch.library.opcheck(torch.ops.twinkle.mul_add.default, (a, b, c))
    torch.library.opcheck(torch.ops.twinkle.mul_add.default, (a, torch.randn(8, requires_grad=True), c))
    torch.library.opcheck(torch.ops.twinkle.mul_add_backward.default, (torch.randn(3, 8), a.detach(), b.detach()))


def test_compiles_with_aot_eager_forward_and_backward():
    a, b, c = torch.randn(4, 16, requires_grad=True), torch.randn(16, requires_grad=True), torch.randn(4, 16, requires_grad=True)
    fn = lambda a, b, c: tt.mul_add(a, b, c).square().sum()  # noqa: E731
    got, want = torch.compile(fn, backend="aot_eager", fullgraph=True)(a, b, c), tt.mul_add_reference(a, b, c).square().sum()
    assert_close(got, want, torch.float32, "output")
    for g, w in zip(torch.autograd.grad(got, (a, b, c)), torch.autograd.grad(want, (a, b, c))):
        assert_close(g, w, torch.float32, "grad")


def test_rejects_bad_inputs_with_a_useful_message():
    with pytest.raises(ValueError, match="dtypes"):
        tt.mul_add(torch.randn(2), torch.randn(2, dtype=torch.float64), torch.randn(2))
    with pytest.raises(ValueError, match="do not broadcast"):
        tt.mul_add(torch.randn(2, 3), torch.randn(4), torch.randn(3))
