"""Rotary position embedding and the KV-cache write of a decode step in one launch.

``apply_rotary_pos_emb_to_cache(q, k, v, cos, sin, key_cache, value_cache, cache_position)`` returns
the rotated ``q`` and writes the rotated ``k`` and ``v`` into the caches, as transformers' attention
does at a step with a static cache::

    q, k = apply_rotary_pos_emb(q, k, cos, sin)            # rotate_half RoPE, unsqueeze_dim=1
    key_cache.index_copy_(2, cache_position, k)            # StaticCache's layer update
    value_cache.index_copy_(2, cache_position, v)
    return q

Why: at batch 1 each of those is a launch of its own (the rotary kernel, one ``index_copy`` a cache)
that moves a few hundred bytes, so a decoder layer spends ~3 launch latencies on them. The rotary
kernel (:mod:`.rotary`) already reads each position's cos/sin row once for all heads of q and k; here
its k output is the key cache at row ``cache_position[s]``, and v is copied to the value cache's row
in the same program.

q, k and v are ``[B, H, S, D]`` (the ``.view(...).transpose(1, 2)`` of a projection, read through their
strides); the caches ``[B, Hkv, S_max, D]`` with unit-stride rows; ``cache_position`` ``[S]`` integer
rows of the caches, each distinct (a cache row written twice in one call keeps either value, as with
``index_copy_``). A decode kernel: no autograd (the cache write is not differentiable in transformers
either); under grad mode, q, k or v requiring grad is refused with a ValueError.
"""

import torch
from torch import Tensor

from ._checks import check_tensors
from ._library import define_op
from .rotary import apply_rotary_pos_emb_reference, check_arguments, launch, out_like

__all__ = ["apply_rotary_pos_emb_to_cache", "apply_rotary_pos_emb_to_cache_reference"]


def _impl(q: Tensor, k: Tensor, v: Tensor, cos: Tensor, sin: Tensor, key_cache: Tensor, value_cache: Tensor,
          cache_position: Tensor) -> Tensor:
    return launch(q, k, cos, sin, 1, transpose=False, cache=(v, key_cache, value_cache, cache_position))[0]


def _fake(q: Tensor, k: Tensor, v: Tensor, cos: Tensor, sin: Tensor, key_cache: Tensor, value_cache: Tensor,
          cache_position: Tensor) -> Tensor:
    return out_like(q)


# Opaque to Inductor: the kernel launches as a programmatic dependent (_dependent_launch), which Inductor's launcher
# of user kernels does not do; a decode step runs as a CUDA graph, where the op's dispatch costs nothing.
_op = define_op(
    "apply_rotary_pos_emb_to_cache", _impl, fake=_fake, mutates_args=("key_cache", "value_cache"),
    inline_kernels=False,
    reference=lambda *args: apply_rotary_pos_emb_to_cache_reference(*args),  # defined below
)


def apply_rotary_pos_emb_to_cache(q: Tensor, k: Tensor, v: Tensor, cos: Tensor, sin: Tensor, key_cache: Tensor,
                                  value_cache: Tensor, cache_position: Tensor) -> Tensor:
    """Rotate ``q`` and ``k`` (transformers' ``apply_rotary_pos_emb``, ``unsqueeze_dim=1``), write the rotated
    ``k`` and ``v`` to rows ``cache_position`` of the caches along dim 2, in one launch; return the rotated q.

    Args:
        q (`torch.Tensor`): ``[B, Hq, S, D]``, any strides with unit-stride head dims.
        k (`torch.Tensor`): ``[B, Hkv, S, D]``, q's dtype.
        v (`torch.Tensor`): ``[B, Hkv, S, D]``, q's dtype.
        cos (`torch.Tensor`): ``[B or 1, S, D]`` (or anything that broadcasts to q after ``unsqueeze(1)``).
        sin (`torch.Tensor`): as ``cos``.
        key_cache (`torch.Tensor`): ``[B, Hkv, S_max, D]``, q's dtype and device, unit-stride rows; written.
        value_cache (`torch.Tensor`): as ``key_cache``; written.
        cache_position (`torch.Tensor`): ``[S]`` integer rows of the caches.

    Returns:
        `torch.Tensor`: the rotated q, in q's layout (see :func:`~twinkle_triton.apply_rotary_pos_emb`).

    Raises:
        TypeError: an argument is not a tensor of the kind it needs (the error names it).
        ValueError: shapes, dtypes or devices that do not fit together (the error names them), or q, k or v
            requiring grad under grad mode.

    Example:
        ```python
        q = apply_rotary_pos_emb_to_cache(q, k, v, cos, sin, cache.layers[i].keys, cache.layers[i].values,
                                          cache_position)
        ```
    """
    check_cache_write("apply_rotary_pos_emb_to_cache", q, k, v, cos, sin, key_cache, value_cache)
    length = k.shape[2]
    if cache_position.shape != (length,) or cache_position.dtype not in (torch.int32, torch.int64) \
            or cache_position.device != k.device:
        raise ValueError(f"apply_rotary_pos_emb_to_cache: cache_position is {tuple(cache_position.shape)} "
                         f"{cache_position.dtype} on {cache_position.device}; pass [{length}] int64 (or int32) "
                         "rows of the caches on k's device.")
    return _op(q, k, v, cos, sin, key_cache, value_cache, cache_position)


def check_cache_write(op: str, q: Tensor, k: Tensor, v: Tensor, cos: Tensor, sin: Tensor, key_cache: Tensor,
                      value_cache: Tensor) -> None:
    """The arguments of a decode kernel that rotates q and k and writes k and v into a static cache, checked;
    ``op`` names the kernel in the errors."""
    check_arguments(q, k, cos, sin, 1)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise ValueError(f"{op}: q, k or v requires grad, but this decode kernel has no backward (the cache write "
                         "is not differentiable).\nCall it under torch.no_grad(), or use apply_rotary_pos_emb and "
                         "index_copy_ to differentiate through the rotation.")
    check_tensors(op, v=v, key_cache=key_cache, value_cache=value_cache)
    batch, heads, _, dim = k.shape
    if v.shape != k.shape or v.dtype != k.dtype:
        raise ValueError(f"{op}: v is {tuple(v.shape)} {v.dtype}, k {tuple(k.shape)} {k.dtype}; pass v of k's "
                         "shape and dtype.")
    for name, cache in (("key_cache", key_cache), ("value_cache", value_cache)):
        if cache.dim() != 4 or (cache.shape[0], cache.shape[1], cache.shape[3]) != (batch, heads, dim) \
                or cache.dtype != k.dtype or cache.device != k.device or cache.stride(-1) != 1:
            raise ValueError(f"{op}: {name} is {tuple(cache.shape)} {cache.dtype} on {cache.device} (strides "
                             f"{cache.stride()}); pass [{batch}, {heads}, S_max, {dim}] of k's dtype and device with "
                             "unit-stride rows.")


def apply_rotary_pos_emb_to_cache_reference(q: Tensor, k: Tensor, v: Tensor, cos: Tensor, sin: Tensor,
                                            key_cache: Tensor, value_cache: Tensor, cache_position: Tensor) -> Tensor:
    """Plain PyTorch ``apply_rotary_pos_emb_to_cache``."""
    q, k = apply_rotary_pos_emb_reference(q, k, cos, sin)
    key_cache.index_copy_(2, cache_position, k)
    value_cache.index_copy_(2, cache_position, v)
    return q
