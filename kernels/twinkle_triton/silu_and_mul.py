"""SwiGLU activation: ``silu_and_mul(x)`` (vLLM's packed form) and ``silu_mul(gate, up)``; each with the down
projection as one op that keeps no product for the backward: ``silu_and_mul_linear`` and ``silu_mul_linear``.

``silu_and_mul(x) = silu(x[..., :d]) * x[..., d:]`` for ``x`` of last dim ``2d`` (one fused
gate_up projection); ``silu_mul(gate, up) = silu(gate) * up`` for the two separate projections of
Qwen2MLP/LlamaMLP, which avoids concatenating them first. Both compute in fp32 (fp64 for fp64) and
round once; PyTorch's ``F.silu(g) * u`` rounds twice in half precision.

Backward, with s = sigmoid(g): d/dg = grad * u * s * (1 + g * (1 - s)), d/du = grad * silu(g);
one kernel writes both from one read of grad, g and u. The kernels are :mod:`._gated`'s, shared
with GeGLU (:mod:`.gelu_mul`).
"""

from collections.abc import Callable

import torch
from torch import Tensor

from ._gated import (SILU, packed_backward_impl, packed_backward_with_value_impl, packed_impl, separate_backward_impl,
                     separate_backward_with_value_impl, separate_impl)
from ._checks import check_tensors
from ._library import define_differentiable_op

# ----------------------------------------------------------------------------- silu_and_mul


def _silu_and_mul_impl(x: Tensor) -> Tensor:
    return packed_impl(x, SILU)


def _silu_and_mul_fake(x: Tensor) -> Tensor:
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))


def _silu_and_mul_backward_impl(grad: Tensor, x: Tensor) -> Tensor:
    return packed_backward_impl(grad, x, SILU)


def _silu_and_mul_backward_fake(grad: Tensor, x: Tensor) -> Tensor:
    return x.new_empty(x.shape)


_silu_and_mul_op = define_differentiable_op(
    "silu_and_mul", _silu_and_mul_impl, fake=_silu_and_mul_fake,
    backward=_silu_and_mul_backward_impl, backward_fake=_silu_and_mul_backward_fake, saved=("x",),
    reference=lambda *args: silu_and_mul_reference(*args),  # defined below
)


def silu_and_mul(x: Tensor) -> Tensor:
    """``silu(x[..., :d]) * x[..., d:]`` for ``x`` of last dimension ``2d`` (vLLM semantics).

    Args:
        x (`torch.Tensor`): ``[..., 2d]``; rows may be strided.

    Returns:
        `torch.Tensor`: contiguous ``[..., d]`` in x's dtype.

    Raises:
        TypeError: a tensor argument is not a floating-point tensor (the error names it).
        ValueError: the last dimension is odd.

    Example:
        ```python
        act = silu_and_mul(gate_up_proj(x))   # gate_up_proj: Linear(hidden, 2 * intermediate)
        ```
    """
    check_tensors("silu_and_mul", min_dim=1, x=x)
    if x.dim() == 0 or x.shape[-1] % 2:
        raise ValueError(
            f"silu_and_mul: x has shape {tuple(x.shape)}; its last dimension must be even "
            "(gate and up halves). For two separate tensors use silu_mul(gate, up)."
        )
    return _silu_and_mul_op(x)


def silu_and_mul_reference(x: Tensor) -> Tensor:
    """Plain PyTorch ``silu_and_mul``."""
    d = x.shape[-1] // 2
    return torch.nn.functional.silu(x[..., :d]) * x[..., d:]


# ----------------------------------------------------------------------------- silu_mul


def _silu_mul_impl(gate: Tensor, up: Tensor) -> Tensor:
    return separate_impl(gate, up, SILU)


def _silu_mul_fake(gate: Tensor, up: Tensor) -> Tensor:
    return gate.new_empty(gate.shape)


def _silu_mul_backward_impl(grad: Tensor, gate: Tensor, up: Tensor) -> tuple[Tensor, Tensor]:
    return separate_backward_impl(grad, gate, up, SILU)


def _silu_mul_backward_fake(grad: Tensor, gate: Tensor, up: Tensor) -> tuple[Tensor, Tensor]:
    return gate.new_empty(gate.shape), up.new_empty(up.shape)


_silu_mul_op = define_differentiable_op(
    "silu_mul", _silu_mul_impl, fake=_silu_mul_fake,
    backward=_silu_mul_backward_impl, backward_fake=_silu_mul_backward_fake, saved=("gate", "up"),
    reference=lambda *args: silu_mul_reference(*args),  # defined below
)


def silu_mul(gate: Tensor, up: Tensor) -> Tensor:
    """``silu(gate) * up`` for two tensors of one shape (Qwen2MLP's ``act_fn(gate_proj(x)) * up_proj(x)``).

    Args:
        gate (`torch.Tensor`): ``[..., d]``; rows may be strided.
        up (`torch.Tensor`): same shape and dtype as ``gate`` (no broadcasting).

    Returns:
        `torch.Tensor`: contiguous, gate's shape and dtype.

    Raises:
        TypeError: a tensor argument is not a floating-point tensor (the error names it).
        ValueError: shapes, dtypes or devices differ.

    Example:
        ```python
        out = down_proj(silu_mul(gate_proj(x), up_proj(x)))
        ```
    """
    check_tensors("silu_mul", min_dim=1, gate=gate, up=up)
    if gate.shape != up.shape or gate.dtype != up.dtype or gate.dim() == 0:
        raise ValueError(
            f"silu_mul: gate is {tuple(gate.shape)} {gate.dtype}, up is {tuple(up.shape)} {up.dtype}; "
            "pass two tensors (at least 1-D) of one shape and dtype (silu_mul does not broadcast)."
        )
    return _silu_mul_op(gate, up)


def silu_mul_reference(gate: Tensor, up: Tensor) -> Tensor:
    """Plain PyTorch ``silu_mul``."""
    return torch.nn.functional.silu(gate) * up


# ----------------------------------------------------------------------------- silu_mul_linear


def _silu_mul_linear_impl(gate: Tensor, up: Tensor, weight: Tensor) -> Tensor:
    # the product is a temporary: the backward's kernel writes it again for the weight's gradient
    return torch.nn.functional.linear(separate_impl(gate, up, SILU), weight)


def _silu_mul_linear_fake(gate: Tensor, up: Tensor, weight: Tensor) -> Tensor:
    return gate.new_empty((*gate.shape[:-1], weight.shape[0]))


def _down_projection_backward(grad: Tensor, weight: Tensor, product_shape: tuple[int, ...],
                              activation_backward: Callable[[Tensor], tuple[Tensor, ...]]) -> tuple[Tensor, ...]:
    """The backward of ``F.linear(product, weight)`` whose product is not kept: ``activation_backward`` takes the
    product's gradient and returns the activation inputs' gradients and the product written again; returned are
    those gradients and the weight's."""
    grad2 = grad.reshape(-1, grad.shape[-1])
    *grads, product = activation_backward((grad2 @ weight).view(product_shape))
    return (*grads, grad2.t() @ product.view(-1, product.shape[-1]))


def _silu_mul_linear_backward_impl(grad: Tensor, gate: Tensor, up: Tensor, weight: Tensor
                                   ) -> tuple[Tensor, Tensor, Tensor]:
    return _down_projection_backward(grad, weight, gate.shape,
                                     lambda grad_product: separate_backward_with_value_impl(grad_product, gate, up,
                                                                                            SILU))


def _silu_mul_linear_backward_fake(grad: Tensor, gate: Tensor, up: Tensor, weight: Tensor
                                   ) -> tuple[Tensor, Tensor, Tensor]:
    return gate.new_empty(gate.shape), up.new_empty(up.shape), weight.new_empty(weight.shape)


_silu_mul_linear_op = define_differentiable_op(
    "silu_mul_linear", _silu_mul_linear_impl, fake=_silu_mul_linear_fake,
    backward=_silu_mul_linear_backward_impl, backward_fake=_silu_mul_linear_backward_fake,
    saved=("gate", "up", "weight"),
    reference=lambda *args: silu_mul_linear_reference(*args),  # defined below
)


def silu_mul_linear(gate: Tensor, up: Tensor, weight: Tensor) -> Tensor:
    """``F.linear(silu(gate) * up, weight)``: a SwiGLU MLP's activation and down projection, keeping for the backward
    only what the activation's gradient reads (gate and up).

    Autograd would keep the product ``silu(gate) * up`` too, for the weight's gradient: one more
    ``rows x intermediate`` tensor a layer (64 MiB a layer at Llama-3.2-3B's 4096 x 8192, 1.75 GiB over 28 layers).
    Here the backward's activation kernel writes the product again, from the gate and up it reads anyway, in the
    forward kernel's arithmetic (the same bits).

    Args:
        gate (`torch.Tensor`): ``[..., d]``; rows may be strided.
        up (`torch.Tensor`): same shape and dtype as ``gate``.
        weight (`torch.Tensor`): ``[n, d]``, the down projection's (``nn.Linear`` without a bias), gate's dtype.

    Returns:
        `torch.Tensor`: ``[..., n]`` in gate's dtype.

    Raises:
        TypeError: a tensor argument is not a floating-point tensor (the error names it).
        ValueError: shapes, dtypes or devices do not fit.

    Example:
        ```python
        out = silu_mul_linear(gate_proj(x), up_proj(x), down_proj.weight)
        ```
    """
    check_tensors("silu_mul_linear", min_dim=1, gate=gate, up=up, weight=weight)
    if gate.shape != up.shape or gate.dtype != up.dtype or gate.dim() == 0:
        raise ValueError(
            f"silu_mul_linear: gate is {tuple(gate.shape)} {gate.dtype}, up is {tuple(up.shape)} {up.dtype}; "
            "pass two tensors (at least 1-D) of one shape and dtype."
        )
    if weight.dim() != 2 or weight.shape[1] != gate.shape[-1] or weight.dtype != gate.dtype:
        raise ValueError(
            f"silu_mul_linear: weight is {tuple(weight.shape)} {weight.dtype} for gate {tuple(gate.shape)} "
            f"{gate.dtype}; pass a 2-D [n, {gate.shape[-1]}] weight of gate's dtype (a down projection's)."
        )
    return _silu_mul_linear_op(gate, up, weight)


def silu_mul_linear_reference(gate: Tensor, up: Tensor, weight: Tensor) -> Tensor:
    """Plain PyTorch ``silu_mul_linear``."""
    return torch.nn.functional.linear(silu_mul_reference(gate, up), weight)


# ----------------------------------------------------------------------------- silu_and_mul_linear


def _silu_and_mul_linear_impl(x: Tensor, weight: Tensor) -> Tensor:
    # the product is a temporary: the backward's kernel writes it again for the weight's gradient
    return torch.nn.functional.linear(packed_impl(x, SILU), weight)


def _silu_and_mul_linear_fake(x: Tensor, weight: Tensor) -> Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _silu_and_mul_linear_backward_impl(grad: Tensor, x: Tensor, weight: Tensor) -> tuple[Tensor, Tensor]:
    return _down_projection_backward(grad, weight, (*x.shape[:-1], x.shape[-1] // 2),
                                     lambda grad_product: packed_backward_with_value_impl(grad_product, x, SILU))


def _silu_and_mul_linear_backward_fake(grad: Tensor, x: Tensor, weight: Tensor) -> tuple[Tensor, Tensor]:
    return x.new_empty(x.shape), weight.new_empty(weight.shape)


_silu_and_mul_linear_op = define_differentiable_op(
    "silu_and_mul_linear", _silu_and_mul_linear_impl, fake=_silu_and_mul_linear_fake,
    backward=_silu_and_mul_linear_backward_impl, backward_fake=_silu_and_mul_linear_backward_fake,
    saved=("x", "weight"),
    reference=lambda *args: silu_and_mul_linear_reference(*args),  # defined below
)


def silu_and_mul_linear(x: Tensor, weight: Tensor) -> Tensor:
    """``F.linear(silu_and_mul(x), weight)``: the activation and down projection of an MLP with one fused gate/up
    projection (Phi-3, GLM-4), keeping for the backward only what the activation's gradient reads (``x``).

    Autograd would keep the product too, for the weight's gradient: one more ``rows x d`` tensor a layer. Here the
    backward's activation kernel writes the product again from the ``x`` it reads anyway, in the forward kernel's
    arithmetic (the same bits), as :func:`silu_mul_linear` does for two separate projections.

    Args:
        x (`torch.Tensor`): ``[..., 2d]``, gate then up; rows may be strided.
        weight (`torch.Tensor`): ``[n, d]``, the down projection's (``nn.Linear`` without a bias), x's dtype.

    Returns:
        `torch.Tensor`: ``[..., n]`` in x's dtype.

    Raises:
        TypeError: a tensor argument is not a floating-point tensor (the error names it).
        ValueError: an odd last dimension, or a weight whose shape, dtype or device does not fit.

    Example:
        ```python
        out = silu_and_mul_linear(gate_up_proj(x), down_proj.weight)
        ```
    """
    check_tensors("silu_and_mul_linear", min_dim=1, x=x, weight=weight)
    if x.dim() == 0 or x.shape[-1] % 2:
        raise ValueError(
            f"silu_and_mul_linear: x has shape {tuple(x.shape)}; its last dimension must be even "
            "(gate and up halves). For two separate tensors use silu_mul_linear(gate, up, weight)."
        )
    d = x.shape[-1] // 2
    if weight.dim() != 2 or weight.shape[1] != d or weight.dtype != x.dtype:
        raise ValueError(
            f"silu_and_mul_linear: weight is {tuple(weight.shape)} {weight.dtype} for x {tuple(x.shape)} {x.dtype}; "
            f"pass a 2-D [n, {d}] weight of x's dtype (a down projection's)."
        )
    return _silu_and_mul_linear_op(x, weight)


def silu_and_mul_linear_reference(x: Tensor, weight: Tensor) -> Tensor:
    """Plain PyTorch ``silu_and_mul_linear``."""
    return torch.nn.functional.linear(silu_and_mul_reference(x), weight)
