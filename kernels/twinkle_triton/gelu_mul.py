"""GeGLU activation: ``gelu_mul(gate, up)`` and ``gelu_and_mul(x)`` (packed gate|up).

``gelu_mul(gate, up, approximate) = gelu(gate, approximate) * up``: Gemma 1/2/3's MLP,
``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` with ``hidden_activation="gelu_pytorch_tanh"``
(``approximate="tanh"``; ``"none"`` is the erf GELU). ``gelu_and_mul(x)`` takes one fused
``gate_up`` projection of last dim ``2d``. Like ``silu_mul``, the GELU and the product run in fp32
(fp64 for fp64) and round once; PyTorch's ``F.gelu(g) * u`` rounds twice in half precision.

Backward, one kernel from one read of grad, gate and up: d/dgate = grad * up * gelu'(gate),
d/dup = grad * gelu(gate). The kernels are :mod:`._gated`'s, shared with SwiGLU (:mod:`.silu_and_mul`).
"""

import torch
from torch import Tensor

from ._gated import GELU_APPROXIMATIONS, packed_backward_impl, packed_impl, separate_backward_impl, separate_impl
from ._checks import check_tensors
from ._library import define_differentiable_op

_APPROXIMATIONS = tuple(GELU_APPROXIMATIONS)


def _check_approximate(op: str, approximate: str) -> None:
    if approximate not in _APPROXIMATIONS:
        raise ValueError(f"{op}: approximate={approximate!r}; use one of {_APPROXIMATIONS}.")


# ----------------------------------------------------------------------------- gelu_mul


def _gelu_mul_impl(gate: Tensor, up: Tensor, approximate: str) -> Tensor:
    return separate_impl(gate, up, GELU_APPROXIMATIONS[approximate])


def _gelu_mul_fake(gate: Tensor, up: Tensor, approximate: str) -> Tensor:
    return gate.new_empty(gate.shape)


def _gelu_mul_backward_impl(grad: Tensor, gate: Tensor, up: Tensor, approximate: str) -> tuple[Tensor, Tensor]:
    return separate_backward_impl(grad, gate, up, GELU_APPROXIMATIONS[approximate])


def _gelu_mul_backward_fake(grad: Tensor, gate: Tensor, up: Tensor, approximate: str) -> tuple[Tensor, Tensor]:
    return gate.new_empty(gate.shape), up.new_empty(up.shape)


_gelu_mul_op = define_differentiable_op(
    "gelu_mul", _gelu_mul_impl, fake=_gelu_mul_fake,
    backward=_gelu_mul_backward_impl, backward_fake=_gelu_mul_backward_fake, saved=("gate", "up", "approximate"),
    reference=lambda *args: gelu_mul_reference(*args),  # defined below
)


def gelu_mul(gate: Tensor, up: Tensor, approximate: str = "tanh") -> Tensor:
    """``gelu(gate, approximate) * up`` for two tensors of one shape (Gemma's GeGLU MLP).

    Args:
        gate (`torch.Tensor`): ``[..., d]``; rows may be strided.
        up (`torch.Tensor`): same shape and dtype as ``gate`` (no broadcasting).
        approximate (`str`, defaults to ``"tanh"``): ``"tanh"`` (transformers' ``gelu_pytorch_tanh``)
            or ``"none"`` (erf GELU, transformers' ``gelu``).

    Returns:
        `torch.Tensor`: contiguous, gate's shape and dtype.

    Raises:
        TypeError: a tensor argument is not a floating-point tensor (the error names it).
        ValueError: shapes, dtypes or devices differ, or an unknown ``approximate``.

    Example:
        ```python
        out = down_proj(gelu_mul(gate_proj(x), up_proj(x)))
        ```
    """
    check_tensors("gelu_mul", min_dim=1, gate=gate, up=up)
    _check_approximate("gelu_mul", approximate)
    if gate.shape != up.shape or gate.dtype != up.dtype or gate.dim() == 0:
        raise ValueError(
            f"gelu_mul: gate is {tuple(gate.shape)} {gate.dtype}, up is {tuple(up.shape)} {up.dtype}; "
            "pass two tensors (at least 1-D) of one shape and dtype (gelu_mul does not broadcast)."
        )
    return _gelu_mul_op(gate, up, approximate)


def gelu_mul_reference(gate: Tensor, up: Tensor, approximate: str = "tanh") -> Tensor:
    """Plain PyTorch ``gelu_mul``."""
    return torch.nn.functional.gelu(gate, approximate=approximate) * up


# ----------------------------------------------------------------------------- gelu_and_mul


def _gelu_and_mul_impl(x: Tensor, approximate: str) -> Tensor:
    return packed_impl(x, GELU_APPROXIMATIONS[approximate])


def _gelu_and_mul_fake(x: Tensor, approximate: str) -> Tensor:
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))


def _gelu_and_mul_backward_impl(grad: Tensor, x: Tensor, approximate: str) -> Tensor:
    return packed_backward_impl(grad, x, GELU_APPROXIMATIONS[approximate])


def _gelu_and_mul_backward_fake(grad: Tensor, x: Tensor, approximate: str) -> Tensor:
    return x.new_empty(x.shape)


_gelu_and_mul_op = define_differentiable_op(
    "gelu_and_mul", _gelu_and_mul_impl, fake=_gelu_and_mul_fake,
    backward=_gelu_and_mul_backward_impl, backward_fake=_gelu_and_mul_backward_fake, saved=("x", "approximate"),
    reference=lambda *args: gelu_and_mul_reference(*args),  # defined below
)


def gelu_and_mul(x: Tensor, approximate: str = "tanh") -> Tensor:
    """``gelu(x[..., :d], approximate) * x[..., d:]`` for ``x`` of last dimension ``2d``
    (vLLM's ``GeluAndMul``; one fused gate_up projection).

    Args:
        x (`torch.Tensor`): ``[..., 2d]``; rows may be strided.
        approximate (`str`, defaults to ``"tanh"``): ``"tanh"`` or ``"none"``.

    Returns:
        `torch.Tensor`: contiguous ``[..., d]`` in x's dtype.

    Raises:
        TypeError: a tensor argument is not a floating-point tensor (the error names it).
        ValueError: the last dimension is odd, or an unknown ``approximate``.

    Example:
        ```python
        act = gelu_and_mul(gate_up_proj(x))   # gate_up_proj: Linear(hidden, 2 * intermediate)
        ```
    """
    check_tensors("gelu_and_mul", min_dim=1, x=x)
    _check_approximate("gelu_and_mul", approximate)
    if x.dim() == 0 or x.shape[-1] % 2:
        raise ValueError(
            f"gelu_and_mul: x has shape {tuple(x.shape)}; its last dimension must be even "
            "(gate and up halves). For two separate tensors use gelu_mul(gate, up)."
        )
    return _gelu_and_mul_op(x, approximate)


def gelu_and_mul_reference(x: Tensor, approximate: str = "tanh") -> Tensor:
    """Plain PyTorch ``gelu_and_mul``."""
    d = x.shape[-1] // 2
    return torch.nn.functional.gelu(x[..., :d], approximate=approximate) * x[..., d:]
