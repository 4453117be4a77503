"""silu_and_mul (packed gate|up) and silu_mul (two tensors)."""

import pytest
import torch
from kernel_test_utils import DTYPES, assert_close, check_forward_backward

import twinkle_triton as tt

SHAPES = [(5, 2 * 123), (1, 2 * 123), (3, 7, 2 * 123), (0, 2 * 123)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_silu_and_mul_matches_reference(shape, dtype):
    x = torch.randn(shape, dtype=dtype)
    check_forward_backward(tt.silu_and_mul, tt.silu_and_mul_reference, (x,), dtype, "silu_and_mul")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [s[:-1] + (123,) for s in SHAPES])
def test_silu_mul_matches_reference(shape, dtype):
    gate, up = torch.randn(shape, dtype=dtype), torch.randn(shape, dtype=dtype)
    check_forward_backward(tt.silu_mul, tt.silu_mul_reference, (gate, up), dtype, "silu_mul")


def test_non_contiguous_inputs():
    wide = torch.randn(4, 300)
    check_forward_backward(tt.silu_and_mul, tt.silu_and_mul_reference, (wide[:, :246],), torch.float32,
                           "silu_and_mul sliced rows")
    check_forward_backward(tt.silu_and_mul, tt.silu_and_mul_reference, (torch.randn(246, 4).t(),),
                           torch.float32, "silu_and_mul transposed")
    check_forward_backward(tt.silu_mul, tt.silu_mul_reference, (wide[:, :123], torch.randn(123, 4).t()),
                           torch.float32, "silu_mul strided")


def test_gradcheck_fp64():
    x = torch.randn(3, 10, dtype=torch.float64, requires_grad=True)
    g, u = (torch.randn(3, 5, dtype=torch.float64, requires_grad=True) for _ in range(2))
    assert torch.autograd.gradcheck(tt.silu_and_mul, (x,))
    assert torch.autograd.gradcheck(tt.silu_mul, (g, u))


def test_opcheck():
    x = torch.randn(3, 5, 16, requires_grad=True)
    g, u = torch.randn(3, 8, requires_grad=True), torch.randn(3, 8, requires_grad=True)
    torch.library.opcheck(torch.ops.twinkle.silu_and_mul.default, (x,))
    torch.library.opcheck(torch.ops.twinkle.silu_mul.default, (g, u))
    torch.library.opcheck(torch.ops.twinkle.silu_and_mul_backward.default, (torch.randn(3, 5, 8), x.detach()))
    torch.library.opcheck(torch.ops.twinkle.silu_mul_backward.default, (torch.randn(3, 8), g.detach(), u.detach()))


def test_compiles_with_aot_eager_forward_and_backward():
    x = torch.randn(4, 32, requires_grad=True)
    fn = lambda x: (tt.silu_and_mul(x) * tt.silu_mul(x[:, :16], x[:, 16:])).sum()  # noqa: E731
    ref = lambda x: (tt.silu_and_mul_reference(x) * tt.silu_mul_reference(x[:, :16], x[:, 16:])).sum()  # noqa: E731
    got, want = torch.compile(fn, backend="aot_eager", fullgraph=True)(x), ref(x)
    assert_close(got, want, torch.float32, "output")
    assert_close(torch.autograd.grad(got, x)[0], torch.autograd.grad(want, x)[0], torch.float32, "grad")


def test_rejects_bad_shapes_with_a_useful_message():
    with pytest.raises(ValueError, match="must be even"):
        tt.silu_and_mul(torch.randn(2, 7))
    with pytest.raises(ValueError, match="does not broadcast"):
        tt.silu_mul(torch.randn(2, 8), torch.randn(8))
