"""add_gelu = gelu(x + bias), erf and tanh forms."""

import pytest
import torch
from kernel_test_utils import DTYPES, assert_close, check_forward_backward

import twinkle_triton as tt


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5, 123), (1, 123), (3, 7, 123), (0, 123)])
def test_matches_reference(shape, dtype, approximate):
    x, bias = torch.randn(shape, dtype=dtype), torch.randn(shape[-1], dtype=dtype)
    check_forward_backward(lambda x, b: tt.add_gelu(x, b, approximate),
                           lambda x, b: tt.add_gelu_reference(x, b, approximate),
                           (x, bias), dtype, f"add_gelu {approximate}")


def test_full_shape_bias_and_non_contiguous_x():
    x = torch.randn(123, 5).t()
    check_forward_backward(tt.add_gelu, tt.add_gelu_reference, (x, torch.randn(5, 123)), torch.float32,
                           "add_gelu full bias, transposed x")
    check_forward_backward(tt.add_gelu, tt.add_gelu_reference, (torch.randn(4, 200)[:, :123], torch.randn(123)),
                           torch.float32, "add_gelu sliced x")


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gradcheck_fp64(approximate):
    x = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    b = torch.randn(6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, b: tt.add_gelu(x, b, approximate), (x, b))


def test_opcheck():
    x, b = torch.randn(3, 5, 16, requires_grad=True), torch.randn(16, requires_grad=True)
    torch.library.opcheck(torch.ops.twinkle.add_gelu.default, (x, b, "tanh"))
    torch.library.opcheck(torch.ops.twinkle.add_gelu_backward.default, (torch.randn(3, 5, 16), x.detach(), b.detach(), "none"))


def test_compiles_with_aot_eager_forward_and_backward():
    x, b = torch.randn(4, 32, requires_grad=True), torch.randn(32, requires_grad=True)
    fn = lambda x, b: tt.add_gelu(x, b, "tanh").square().sum()  # noqa: E731
    got, want = torch.compile(fn, backend="aot_eager", fullgraph=True)(x, b), tt.add_gelu_reference(x, b, "tanh").square().sum()
    assert_close(got, want, torch.float32, "output")
    for g, w in zip(torch.autograd.grad(got, (x, b)), torch.autograd.grad(want, (x, b))):
        assert_close(g, w, torch.float32, "grad")


def test_rejects_bad_inputs_with_a_useful_message():
    with pytest.raises(ValueError, match="approximate"):
        tt.add_gelu(torch.randn(2, 4), torch.randn(4), "exact")
    with pytest.raises(ValueError, match="bias"):
        tt.add_gelu(torch.randn(2, 4), torch.randn(3))
