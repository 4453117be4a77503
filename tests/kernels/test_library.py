"""``_library.define_differentiable_op``: the autograd wiring it generates from a declaration."""

import pytest
import torch
from torch import Tensor

from twinkle_triton._library import define_differentiable_op


def _scale_add_impl(x: Tensor, bias: Tensor | None, scale: float) -> tuple[Tensor, Tensor]:
    out = x * scale + (0 if bias is None else bias)
    return out, out * out


def _scale_add_fake(x: Tensor, bias: Tensor | None, scale: float) -> tuple[Tensor, Tensor]:
    return torch.empty_like(x), torch.empty_like(x)


def _scale_add_backward(grad_out: Tensor, grad_square: Tensor, out: Tensor, bias: Tensor | None,
                        scale: float) -> tuple[Tensor, Tensor]:
    grad = grad_out + 2 * out * grad_square
    return grad * scale, grad.sum(0)


def _scale_add_backward_fake(grad_out: Tensor, grad_square: Tensor, out: Tensor, bias: Tensor | None,
                             scale: float) -> tuple[Tensor, Tensor]:
    return torch.empty_like(grad_out), grad_out.new_empty(grad_out.shape[1:])


# saved: an output, an optional tensor input and a float; bias gets no gradient when it is None
_scale_add = define_differentiable_op(
    "test_library_scale_add", _scale_add_impl, fake=_scale_add_fake,
    backward=_scale_add_backward, backward_fake=_scale_add_backward_fake, saved=("output[0]", "bias", "scale"),
    gradients=lambda grads, saved: (grads[0], grads[1] if saved[1] is not None else None, None),
)


@pytest.mark.parametrize("with_bias", [True, False])
def test_generated_autograd_matches_gradcheck_and_opcheck(with_bias):
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(4, dtype=torch.float64, requires_grad=True) if with_bias else None
    inputs = (x, bias) if with_bias else (x,)
    assert torch.autograd.gradcheck(lambda *t: _scale_add(t[0], t[1] if with_bias else None, 1.5), inputs)
    torch.library.opcheck(_scale_add.op, (x, bias, 1.5))
    assert torch.ops.twinkle.test_library_scale_add_backward.default is not None  # the backward is an op too


def test_a_saved_name_that_is_no_parameter_is_refused():
    with pytest.raises(ValueError, match="saved names 'weight'.*x, scale"):
        define_differentiable_op(
            "test_library_bad", lambda x, scale: x, fake=lambda x, scale: x,
            backward=lambda grad, weight: grad, backward_fake=lambda grad, weight: grad, saved=("weight",),
        )


def _normalize_impl(x: Tensor) -> tuple[Tensor, Tensor]:
    norm = x.norm(dim=-1, keepdim=True)
    return x / norm, norm


def _normalize_fake(x: Tensor) -> tuple[Tensor, Tensor]:
    return torch.empty_like(x), x.new_empty((*x.shape[:-1], 1))


def _normalize_backward(grad: Tensor, out: Tensor, norm: Tensor) -> Tensor:  # no gradient of norm comes in
    return (grad - out * (grad * out).sum(-1, keepdim=True)) / norm


def _normalize_backward_fake(grad: Tensor, out: Tensor, norm: Tensor) -> Tensor:
    return torch.empty_like(grad)


# the norm is a statistic the backward reads: not differentiable, its gradient never passed on
_normalize = define_differentiable_op(
    "test_library_normalize", _normalize_impl, fake=_normalize_fake,
    backward=_normalize_backward, backward_fake=_normalize_backward_fake, saved=("output[0]", "output[1]"),
    non_differentiable=("output[1]",),
)


def test_non_differentiable_outputs_are_marked_and_get_no_gradient_argument():
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    out, norm = _normalize(x)
    assert out.requires_grad and not norm.requires_grad
    assert torch.autograd.gradcheck(lambda t: _normalize(t)[0], (x,))
    torch.library.opcheck(_normalize.op, (x,))


def test_a_non_differentiable_name_that_is_no_output_is_refused():
    with pytest.raises(ValueError, match="non_differentiable names 'x'"):
        define_differentiable_op(
            "test_library_bad_statistic", lambda x: (x, x), fake=lambda x: (x, x),
            backward=lambda grad, x: grad, backward_fake=lambda grad, x: grad, saved=("x",), non_differentiable=("x",),
        )


def _scales_impl(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    return x * 2, x * 3, x.abs().amax()


def _scales_fake(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    return torch.empty_like(x), torch.empty_like(x), x.new_empty(())


def _scales_backward(grad_double: Tensor, grad_triple: Tensor) -> Tensor:
    return grad_double * 2 + grad_triple * 3


def _scales_backward_fake(grad_double: Tensor, grad_triple: Tensor) -> Tensor:
    return torch.empty_like(grad_double)


# two differentiable outputs and a statistic nothing differentiates
_scales = define_differentiable_op(
    "test_library_scales", _scales_impl, fake=_scales_fake, backward=_scales_backward,
    backward_fake=_scales_backward_fake, saved=(), non_differentiable=("output[2]",),
)


class _Ops(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


def test_no_gradient_is_made_for_a_statistic_and_an_unused_output_gets_zeros():
    x = torch.randn(3, 5, requires_grad=True)
    out, norm = _normalize(x)
    with _Ops() as ops:
        torch.autograd.grad(out.sum(), x)
    assert not [op for op in ops.seen if "zeros" in op or "fill" in op or "full" in op], ops.seen
    double, _, _ = _scales(x)  # the triple is not in the loss: its gradient comes in as zeros
    (grad,) = torch.autograd.grad(double.sum(), x)
    assert torch.equal(grad, torch.full_like(x, 2.0))
