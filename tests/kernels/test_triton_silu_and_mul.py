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


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [s[:-1] + (123,) for s in SHAPES])
def test_silu_mul_linear_is_the_linear_of_silu_mul(shape, dtype):
    """Forward and every gradient as the unfused ``F.linear(silu_mul(gate, up), weight)`` computes them (the same
    product, bit for bit, and the same projections); silu_mul's own tests hold the product to the truth."""
    gate, up = torch.randn(shape, dtype=dtype), torch.randn(shape, dtype=dtype)
    weight = torch.randn(37, 123, dtype=dtype)
    fused = [t.clone().requires_grad_() for t in (gate, up, weight)]
    unfused = [t.clone().requires_grad_() for t in (gate, up, weight)]
    out = tt.silu_mul_linear(*fused)
    want = torch.nn.functional.linear(tt.silu_mul(*unfused[:2]), unfused[2])
    assert_close(out, want, dtype, "silu_mul_linear output")
    grad = torch.randn_like(want)
    for name, got, expected in zip(("gate", "up", "weight"), torch.autograd.grad(out, fused, grad),
                                   torch.autograd.grad(want, unfused, grad)):
        assert_close(got, expected, dtype, f"silu_mul_linear grad of {name}")


@pytest.mark.parametrize("shape", [(5, 123), (3, 7, 123)])
def test_silu_mul_linear_matches_reference(shape):
    check_forward_backward(tt.silu_mul_linear, tt.silu_mul_linear_reference,
                           (torch.randn(shape), torch.randn(shape), torch.randn(37, 123)), torch.float32,
                           "silu_mul_linear")


def test_silu_mul_linear_on_strided_inputs():
    wide = torch.randn(4, 300)
    check_forward_backward(tt.silu_mul_linear, tt.silu_mul_linear_reference,
                           (wide[:, :123], torch.randn(123, 4).t(), torch.randn(123, 37).t()), torch.float32,
                           "silu_mul_linear strided")


def _saved_by(fn) -> set[int]:
    """The storages autograd keeps for the backward of what ``fn`` computes."""
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        fn()
    return {t.untyped_storage().data_ptr() for t in saved}


def test_silu_mul_linear_keeps_gate_and_up_not_the_product():
    gate, up = (torch.randn(6, 40, requires_grad=True) for _ in range(2))
    weight = torch.randn(16, 40, requires_grad=True)
    inputs = {t.untyped_storage().data_ptr() for t in (gate, up, weight)}
    assert _saved_by(lambda: tt.silu_mul_linear(gate, up, weight)) == inputs
    unfused = _saved_by(lambda: torch.nn.functional.linear(tt.silu_mul(gate, up), weight))
    assert inputs < unfused and len(unfused - inputs) == 1  # the product, rows x 40


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_backward_writes_the_forwards_product_again_bit_for_bit(dtype):
    from twinkle_triton._gated import SILU, separate_backward_with_value_impl, separate_impl

    gate, up, grad = (3 * torch.randn(5, 7, 130, dtype=dtype) for _ in range(3))
    *_, again = separate_backward_with_value_impl(grad, gate, up, SILU)
    assert torch.equal(again, separate_impl(gate, up, SILU))


def test_silu_mul_linear_opcheck():
    g, u, w = torch.randn(3, 8, requires_grad=True), torch.randn(3, 8, requires_grad=True), torch.randn(5, 8)
    torch.library.opcheck(torch.ops.twinkle.silu_mul_linear.default, (g, u, w.requires_grad_()))
    torch.library.opcheck(torch.ops.twinkle.silu_mul_linear_backward.default,
                          (torch.randn(3, 5), g.detach(), u.detach(), w.detach()))


def test_silu_mul_linear_rejects_a_weight_that_does_not_fit():
    gate = torch.randn(2, 8)
    with pytest.raises(ValueError, match=r"pass a 2-D \[n, 8\] weight"):
        tt.silu_mul_linear(gate, gate, torch.randn(8, 5))
    with pytest.raises(ValueError, match="of gate's dtype"):
        tt.silu_mul_linear(gate, gate, torch.randn(5, 8, dtype=torch.float64))


def test_silu_mul_linear_gradcheck_fp64():
    g, u = (torch.randn(3, 5, dtype=torch.float64, requires_grad=True) for _ in range(2))
    assert torch.autograd.gradcheck(tt.silu_mul_linear, (g, u, torch.randn(4, 5, dtype=torch.float64,
                                                                             requires_grad=True)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_silu_and_mul_linear_is_the_linear_of_silu_and_mul(shape, dtype):
    """The packed form: forward and both gradients as the unfused ``F.linear(silu_and_mul(x), weight)``."""
    x, weight = torch.randn(shape, dtype=dtype), torch.randn(37, 123, dtype=dtype)
    fused = [t.clone().requires_grad_() for t in (x, weight)]
    unfused = [t.clone().requires_grad_() for t in (x, weight)]
    out = tt.silu_and_mul_linear(*fused)
    want = torch.nn.functional.linear(tt.silu_and_mul(unfused[0]), unfused[1])
    assert_close(out, want, dtype, "silu_and_mul_linear output")
    grad = torch.randn_like(want)
    for name, got, expected in zip(("x", "weight"), torch.autograd.grad(out, fused, grad),
                                   torch.autograd.grad(want, unfused, grad)):
        assert_close(got, expected, dtype, f"silu_and_mul_linear grad of {name}")


def test_silu_and_mul_linear_matches_reference_on_strided_rows():
    wide = torch.randn(4, 300)
    check_forward_backward(tt.silu_and_mul_linear, tt.silu_and_mul_linear_reference,
                           (wide[:, :246], torch.randn(123, 37).t()), torch.float32, "silu_and_mul_linear strided")
    check_forward_backward(tt.silu_and_mul_linear, tt.silu_and_mul_linear_reference,
                           (torch.randn(3, 7, 246), torch.randn(37, 123)), torch.float32, "silu_and_mul_linear 3-D")


def test_silu_and_mul_linear_keeps_x_not_the_product():
    x = torch.randn(6, 80, requires_grad=True)
    weight = torch.randn(16, 40, requires_grad=True)
    inputs = {t.untyped_storage().data_ptr() for t in (x, weight)}
    assert _saved_by(lambda: tt.silu_and_mul_linear(x, weight)) == inputs
    unfused = _saved_by(lambda: torch.nn.functional.linear(tt.silu_and_mul(x), weight))
    assert inputs < unfused and len(unfused - inputs) == 1  # the product, rows x 40


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_packed_backward_writes_the_forwards_product_again_bit_for_bit(dtype):
    from twinkle_triton._gated import SILU, packed_backward_impl, packed_backward_with_value_impl, packed_impl

    x, grad = 3 * torch.randn(5, 7, 260, dtype=dtype), 3 * torch.randn(5, 7, 130, dtype=dtype)
    grad_x, again = packed_backward_with_value_impl(grad, x, SILU)
    assert torch.equal(again, packed_impl(x, SILU)) and torch.equal(grad_x, packed_backward_impl(grad, x, SILU))


def test_silu_and_mul_linear_opcheck_and_gradcheck():
    x, w = torch.randn(3, 16, requires_grad=True), torch.randn(5, 8, requires_grad=True)
    torch.library.opcheck(torch.ops.twinkle.silu_and_mul_linear.default, (x, w))
    torch.library.opcheck(torch.ops.twinkle.silu_and_mul_linear_backward.default,
                          (torch.randn(3, 5), x.detach(), w.detach()))
    x64 = torch.randn(3, 10, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(tt.silu_and_mul_linear, (x64, torch.randn(4, 5, dtype=torch.float64,
                                                                               requires_grad=True)))


def test_silu_and_mul_linear_rejects_what_does_not_fit():
    with pytest.raises(ValueError, match="its last dimension must be even"):
        tt.silu_and_mul_linear(torch.randn(2, 7), torch.randn(5, 3))
    with pytest.raises(ValueError, match=r"pass a 2-D \[n, 4\] weight"):
        tt.silu_and_mul_linear(torch.randn(2, 8), torch.randn(4, 5))
    with pytest.raises(ValueError, match="of x's dtype"):
        tt.silu_and_mul_linear(torch.randn(2, 8), torch.randn(5, 4, dtype=torch.float64))
