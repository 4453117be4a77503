"""Rotary embedding variants of other model families: partial, interleaved, half-width cos/sin, de-interleaving.

:func:`twinkle_triton.apply_rotary_pos_emb` is Llama/Qwen2's rotary (``rotate_half`` over the whole
head, full-width cos/sin). Other transformers families differ in three ways, all handled by
:mod:`.rotary`'s kernel and the op ``twinkle::apply_rotary_pos_emb_variant``:

- **partial** (Phi3 with ``partial_rotary_factor < 1``, GLM4): only the first ``rotary_dim``
  columns of each head rotate; the rest pass through unchanged (``torch.cat([rotated, pass])``);
- **interleaved** pairs (GLM4, Cohere): column ``2i`` rotates with ``2i + 1`` (``x[..., 0::2]`` /
  ``x[..., 1::2]``) instead of ``i`` with ``i + rotary_dim / 2``;
- **shared angle** (GPT-OSS's half-width cos/sin; GLM4's ``cos[..., :d/2].repeat_interleave(2)``):
  both columns of pair ``i`` use ``cos[i]``/``sin[i]``; otherwise each column uses the cos/sin entry
  at its own position (Phi3, Cohere).

For pair ``(a, b)`` with angles ``(cos_a, sin_a)``, ``(cos_b, sin_b)``::

    out[a] = x[a] * cos_a - x[b] * sin_a        out[b] = x[b] * cos_b + x[a] * sin_b

computed in fp32 and rounded once (Cohere's own code computes in fp32 too). The public functions
have transformers' signature ``(q, k, cos, sin, unsqueeze_dim=1)`` and each equals one family's
``apply_rotary_pos_emb``, so they can be registered as function kernels for it.

DeepSeek-V3's ``apply_rotary_pos_emb_interleave`` (``rope_interleave=True``, the default) reads
interleaved pairs and writes them rotated in ``rotate_half`` layout, at the angle ``cos[..., i]`` of
pair ``i`` (the first half of cos/sin, which are ``cat(freqs, freqs)``), so the input and output
layouts differ::

    out[i]       = x[2i] * cos_i - x[2i+1] * sin_i
    out[i + D/2] = x[2i+1] * cos_i + x[2i] * sin_i

:func:`apply_rotary_pos_emb_deinterleave` computes that (op ``twinkle::apply_rotary_pos_emb_deinterleave``);
its backward reads the gradient in ``rotate_half`` layout and writes it interleaved.

As in :mod:`.rotary`, cos and sin get no gradient; backward is the transposed rotation. The kernel
and its launch are :mod:`.rotary`'s, whose Llama layout is the case with no variant.
"""

import torch
from torch import Tensor

from ._checks import check_tensors
from ._library import define_differentiable_op
from .rotary import DEINTERLEAVE, INTERLEAVED, ROTATE_HALF, check_arguments, launch, out_like


def _variant_impl(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int, rotary_dim: int,
                  interleaved: bool, shared_angle: bool) -> tuple[Tensor, Tensor]:
    return launch(q, k, cos, sin, unsqueeze_dim, False, rotary_dim=rotary_dim,
                  layout=INTERLEAVED if interleaved else ROTATE_HALF, shared_angle=shared_angle)


def _variant_fake(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int, rotary_dim: int,
                  interleaved: bool, shared_angle: bool) -> tuple[Tensor, Tensor]:
    return out_like(q), out_like(k)


def _variant_backward_impl(grad_q: Tensor, grad_k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int,
                           rotary_dim: int, interleaved: bool, shared_angle: bool) -> tuple[Tensor, Tensor]:
    return launch(grad_q, grad_k, cos, sin, unsqueeze_dim, True, rotary_dim=rotary_dim,
                  layout=INTERLEAVED if interleaved else ROTATE_HALF, shared_angle=shared_angle)


def _variant_backward_fake(grad_q: Tensor, grad_k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int,
                           rotary_dim: int, interleaved: bool, shared_angle: bool) -> tuple[Tensor, Tensor]:
    return out_like(grad_q), out_like(grad_k)


_variant_op = define_differentiable_op(
    "apply_rotary_pos_emb_variant", _variant_impl, fake=_variant_fake,
    backward=_variant_backward_impl, backward_fake=_variant_backward_fake,
    saved=("cos", "sin", "unsqueeze_dim", "rotary_dim", "interleaved", "shared_angle"),
    gradients=lambda grads, _: (*grads, None, None, None, None, None, None),  # cos, sin and the layout get none
    reference=lambda q, k, cos, sin, unsqueeze_dim, rotary_dim, interleaved, shared_angle: _REFERENCES[
        interleaved, shared_angle](q, k, cos, sin, unsqueeze_dim),
)


def _run(name: str, q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int, rotary_dim: int,
         interleaved: bool, shared_angle: bool) -> tuple[Tensor, Tensor]:
    check_tensors(name, q=q, k=k, cos=cos, sin=sin)
    head_dim = q.shape[-1] if q.dim() else 0
    if rotary_dim % 2 or not 0 < rotary_dim <= head_dim:
        raise ValueError(
            f"{name}: cos/sin of width {cos.shape[-1]} give a rotary dim of {rotary_dim} for heads of "
            f"{head_dim}; it must be even and at most the head dim."
        )
    width = cos.shape[-1] if cos.dim() else 0
    if width > head_dim:
        raise ValueError(f"{name}: cos/sin are {width} wide but the heads of q are {head_dim}; pass cos/sin "
                         "at most as wide as the head.")
    # shapes, dtypes and no-grad cos/sin as for the Llama rotary, checked on the columns cos/sin cover
    check_arguments(q[..., :width], k[..., :width], cos, sin, unsqueeze_dim)
    return _variant_op(q, k, cos, sin, int(unsqueeze_dim), int(rotary_dim), bool(interleaved), bool(shared_angle))


def apply_rotary_pos_emb_partial(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1
                                 ) -> tuple[Tensor, Tensor]:
    """Phi3's ``apply_rotary_pos_emb``: ``rotate_half`` over the first ``cos.shape[-1]`` columns of each
    head; the others pass through.

    Args:
        q (`torch.Tensor`): ``[B, Hq, S, D]`` (``unsqueeze_dim=1``) or ``[B, S, Hq, D]`` (``=2``).
        k (`torch.Tensor`): like q with its own head count.
        cos (`torch.Tensor`): ``[B or 1, S, R]`` with ``R <= D`` even; no gradient flows to it.
        sin (`torch.Tensor`): like cos.
        unsqueeze_dim (`int`, defaults to 1): the head dimension of q and k.

    Returns:
        `tuple[torch.Tensor, torch.Tensor]`: ``(q_embed, k_embed)`` laid out like q and k.

    Raises:
        TypeError: q, k, cos or sin is not a floating-point tensor.
        ValueError: bad shapes, an odd rotary width or one wider than the head, cos/sin requiring grad,
            tensors on two devices.

    Example:
        ```python
        q, k = apply_rotary_pos_emb_partial(q, k, cos[..., :48], sin[..., :48])   # heads of 64
        ```
    """
    return _run("apply_rotary_pos_emb_partial", q, k, cos, sin, unsqueeze_dim, cos.shape[-1], False, False)


def apply_rotary_pos_emb_partial_reference(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1
                                           ) -> tuple[Tensor, Tensor]:
    """Plain PyTorch ``apply_rotary_pos_emb_partial`` (transformers' Phi3 version)."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    rotary_dim = cos.shape[-1]
    out = []
    for x in (q, k):
        x_rot, x_pass = x[..., :rotary_dim], x[..., rotary_dim:]
        half = rotary_dim // 2
        rotated = torch.cat((-x_rot[..., half:], x_rot[..., :half]), dim=-1)
        out.append(torch.cat([x_rot * cos + rotated * sin, x_pass], dim=-1))
    return out[0], out[1]


def apply_rotary_pos_emb_interleaved_partial(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1
                                             ) -> tuple[Tensor, Tensor]:
    """GLM4's ``apply_rotary_pos_emb``: interleaved pairs ``(2i, 2i+1)`` over the first
    ``cos.shape[-1]`` columns, pair ``i`` at angle ``cos[..., i]`` (the first half of cos/sin, as
    ``cos[..., :R/2].repeat_interleave(2)``); the other columns pass through.

    Args and returns as :func:`apply_rotary_pos_emb_partial`.

    Example:
        ```python
        q, k = apply_rotary_pos_emb_interleaved_partial(q, k, cos, sin)   # GLM4: R = head_dim / 2
        ```
    """
    return _run("apply_rotary_pos_emb_interleaved_partial", q, k, cos, sin, unsqueeze_dim,
                2 * (cos.shape[-1] // 2), True, True)


def apply_rotary_pos_emb_interleaved_partial_reference(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor,
                                                       unsqueeze_dim: int = 1) -> tuple[Tensor, Tensor]:
    """Plain PyTorch ``apply_rotary_pos_emb_interleaved_partial`` (transformers' GLM4 version)."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    cos = cos[..., : cos.shape[-1] // 2].repeat_interleave(2, dim=-1)
    sin = sin[..., : sin.shape[-1] // 2].repeat_interleave(2, dim=-1)
    rotary_dim = cos.shape[-1]
    out = []
    for x in (q, k):
        x_rot, x_pass = x[..., :rotary_dim], x[..., rotary_dim:]
        rotated = torch.stack((-x_rot[..., 1::2], x_rot[..., 0::2]), dim=-1).flatten(-2)
        out.append(torch.cat([x_rot * cos + rotated * sin, x_pass], dim=-1))
    return out[0], out[1]


def apply_rotary_pos_emb_interleaved(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1
                                     ) -> tuple[Tensor, Tensor]:
    """Cohere's ``apply_rotary_pos_emb``: interleaved pairs ``(2i, 2i+1)`` over the whole head, each
    column at its own cos/sin entry, computed in fp32 and returned in q's dtype.

    Args and returns as :func:`apply_rotary_pos_emb_partial` (cos/sin as wide as the head).

    Example:
        ```python
        q, k = apply_rotary_pos_emb_interleaved(q, k, cos, sin)
        ```
    """
    return _run("apply_rotary_pos_emb_interleaved", q, k, cos, sin, unsqueeze_dim, cos.shape[-1], True, False)


def apply_rotary_pos_emb_interleaved_reference(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1
                                               ) -> tuple[Tensor, Tensor]:
    """Plain PyTorch ``apply_rotary_pos_emb_interleaved`` (transformers' Cohere version)."""
    dtype = q.dtype
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    out = []
    for x in (q.float(), k.float()):
        rotated = torch.stack([-x[..., 1::2], x[..., ::2]], dim=-1).flatten(-2)
        out.append((x * cos + rotated * sin).to(dtype))
    return out[0], out[1]


def apply_rotary_pos_emb_half_angle(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1
                                    ) -> tuple[Tensor, Tensor]:
    """GPT-OSS's ``apply_rotary_pos_emb``: ``rotate_half`` over the whole head with half-width cos/sin
    (``cos[..., i]`` for both columns ``i`` and ``i + D/2``).

    Args and returns as :func:`apply_rotary_pos_emb_partial`, with cos/sin ``[B or 1, S, D/2]``.

    Example:
        ```python
        q, k = apply_rotary_pos_emb_half_angle(q, k, cos, sin)
        ```
    """
    return _run("apply_rotary_pos_emb_half_angle", q, k, cos, sin, unsqueeze_dim, 2 * cos.shape[-1], False, True)


def apply_rotary_pos_emb_half_angle_reference(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1
                                              ) -> tuple[Tensor, Tensor]:
    """Plain PyTorch ``apply_rotary_pos_emb_half_angle`` (transformers' GPT-OSS version)."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    out = []
    for x in (q, k):
        first, second = torch.chunk(x, 2, dim=-1)
        out.append(torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1))
    return out[0], out[1]


# The reference of each layout (interleaved, shared_angle); the rotary dim follows from cos/sin's width in each.
_REFERENCES = {
    (False, False): apply_rotary_pos_emb_partial_reference,
    (True, True): apply_rotary_pos_emb_interleaved_partial_reference,
    (True, False): apply_rotary_pos_emb_interleaved_reference,
    (False, True): apply_rotary_pos_emb_half_angle_reference,
}


# ----------------------------------------------------------------------------- DeepSeek-V3


def _deinterleave_impl(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int) -> tuple[Tensor, Tensor]:
    return launch(q, k, cos, sin, unsqueeze_dim, False, layout=DEINTERLEAVE, shared_angle=True)


def _deinterleave_fake(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int) -> tuple[Tensor, Tensor]:
    return out_like(q), out_like(k)


def _deinterleave_backward_impl(grad_q: Tensor, grad_k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int
                                ) -> tuple[Tensor, Tensor]:
    return launch(grad_q, grad_k, cos, sin, unsqueeze_dim, True, layout=DEINTERLEAVE, shared_angle=True)


def _deinterleave_backward_fake(grad_q: Tensor, grad_k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int
                                ) -> tuple[Tensor, Tensor]:
    return out_like(grad_q), out_like(grad_k)


_deinterleave_op = define_differentiable_op(
    "apply_rotary_pos_emb_deinterleave", _deinterleave_impl, fake=_deinterleave_fake,
    backward=_deinterleave_backward_impl, backward_fake=_deinterleave_backward_fake,
    saved=("cos", "sin", "unsqueeze_dim"),
    gradients=lambda grads, _: (*grads, None, None, None),  # cos and sin get none (as apply_rotary_pos_emb)
    reference=lambda q, k, cos, sin, unsqueeze_dim: apply_rotary_pos_emb_deinterleave_reference(
        q, k, cos, sin, None, unsqueeze_dim),  # defined below
)


def apply_rotary_pos_emb_deinterleave(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, position_ids=None,
                                      unsqueeze_dim: int = 1) -> tuple[Tensor, Tensor]:
    """DeepSeek-V3's ``apply_rotary_pos_emb_interleave``: interleaved pairs ``(2i, 2i+1)`` rotated by
    ``cos[..., i]`` / ``sin[..., i]`` and returned in ``rotate_half`` layout (pair ``i`` at columns
    ``i`` and ``i + D/2``).

    Args:
        q (`torch.Tensor`): ``[B, Hq, S, D]`` (``unsqueeze_dim=1``) or ``[B, S, Hq, D]`` (``=2``), D even.
        k (`torch.Tensor`): like q with its own head count (DeepSeek's shared key: 1 head).
        cos (`torch.Tensor`): ``[B or 1, S, D]`` as ``cat(freqs, freqs)``; only the first half is read,
            as transformers does. No gradient flows to it.
        sin (`torch.Tensor`): like cos.
        position_ids: unused (transformers' signature has it and ignores it too).
        unsqueeze_dim (`int`, defaults to 1): the head dimension of q and k.

    Returns:
        `tuple[torch.Tensor, torch.Tensor]`: ``(q_embed, k_embed)`` laid out like q and k.

    Raises:
        TypeError: q, k, cos or sin is not a floating-point tensor.
        ValueError: bad shapes, an odd head dim, cos/sin requiring grad, tensors on two devices.

    Example:
        ```python
        q_rot, k_rot = apply_rotary_pos_emb_deinterleave(q_rot, k_rot, cos, sin)   # DeepSeek-V3 MLA
        ```
    """
    check_arguments(q, k, cos, sin, unsqueeze_dim)
    return _deinterleave_op(q, k, cos, sin, int(unsqueeze_dim))


def apply_rotary_pos_emb_deinterleave_reference(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, position_ids=None,
                                                unsqueeze_dim: int = 1) -> tuple[Tensor, Tensor]:
    """Plain PyTorch ``apply_rotary_pos_emb_deinterleave`` (transformers' DeepSeek-V3 version)."""
    cos = cos[..., : cos.shape[-1] // 2].unsqueeze(unsqueeze_dim)
    sin = sin[..., : sin.shape[-1] // 2].unsqueeze(unsqueeze_dim)
    out = []
    for x in (q, k):
        x1, x2 = x[..., 0::2], x[..., 1::2]
        out.append(torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1))
    return out[0], out[1]
