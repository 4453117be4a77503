"""The one comparison of a kernel's result with its reference's, shared by eager verify mode
(:mod:`twinkle_fx.eager.verify`) and compile-time verify (:mod:`twinkle_fx.compiler.inner.verify`).

Structure, non-tensor values, dtype, device and shape must agree exactly; integer and bool tensors
exactly; floating values within :func:`twinkle_fx.core.tolerances.tolerance` of their dtype, with the same
non-finite positions (NaN where the reference has NaN is agreement).
"""

from __future__ import annotations

from typing import Any

import torch

from .tolerances import tolerance
from .torch_internals import tree_flatten

__all__ = ["compare"]


def _same_value(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    try:
        return bool(a == b)
    except Exception:  # objects without a usable ==: the same type is all that can be said
        return True


def _as_real(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    return torch.view_as_real(t.resolve_conj()).double() if t.is_complex() else t.double()


def compare(ours: Any, reference: Any, *, check_grad: bool = False, leaf: str = "leaf",
            reference_name: str = "the reference") -> tuple[float, str | None]:
    """``(largest absolute difference, what differs or None)`` between two results (any pytree).

    Args:
        ours: the kernel's (or the rewritten graph's) result.
        reference: the reference's result.
        check_grad (`bool`, defaults to `False`): an output the reference connects to the autograd
            graph must be connected in ours too (training: the layers before it would get no gradient).
        leaf (`str`, defaults to ``"leaf"``): what one element of the result is called in messages
            (``"output"`` for a graph's outputs).
        reference_name (`str`, defaults to ``"the reference"``): what the reference is called in messages.

    Examples:
        >>> import torch
        >>> compare(torch.ones(3), torch.ones(3) + 1e-6)
        (9.5367431640625e-07, None)
        >>> compare(torch.ones(3, dtype=torch.bfloat16), torch.ones(3))[1]
        "leaf 0: dtype torch.bfloat16 vs the reference's torch.float32"
        >>> compare((torch.ones(3),), (torch.ones(3), torch.ones(3)), leaf="output", reference_name="the original")[1]
        'structure differs: 1 output(s) shaped ... vs the original 2 shaped ...'
    """
    ours_leaves, ours_spec = tree_flatten(ours)
    ref_leaves, ref_spec = tree_flatten(reference)
    if ours_spec != ref_spec:
        return float("inf"), (f"structure differs: {len(ours_leaves)} {leaf}(s) shaped {ours_spec} vs "
                              f"{reference_name} {len(ref_leaves)} shaped {ref_spec}")
    worst = 0.0
    for i, (a, b) in enumerate(zip(ours_leaves, ref_leaves)):
        where = f"{leaf} {i}: "
        if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
            if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor) or not _same_value(a, b):
                return float("inf"), f"{where}{a!r:.60} vs {reference_name}'s {b!r:.60}"
            continue
        for what, x, y in (("dtype", a.dtype, b.dtype), ("device", a.device, b.device), ("shape", a.shape, b.shape)):
            if x != y:
                return float("inf"), f"{where}{what} {x} vs {reference_name}'s {y}"
        if check_grad and b.requires_grad and not a.requires_grad:
            return float("inf"), f"{where}does not require grad (detached?): the layers before it would get no gradient"
        if a.numel() == 0:
            continue
        if not (b.is_floating_point() or b.is_complex()):
            if not torch.equal(a, b):
                return float("inf"), f"{where}values differ ({b.dtype} is compared exactly)"
            continue
        a64, b64 = _as_real(a), _as_real(b)
        finite = torch.isfinite(b64)
        if not torch.equal(torch.isfinite(a64), finite):
            return float("inf"), f"{where}non-finite values where {reference_name} has finite ones (or the reverse)"
        zero = torch.zeros((), dtype=torch.float64, device=a64.device)
        error = (a64 - b64).abs().where(finite, zero)
        leaf_worst = error.max().item()
        worst = max(worst, leaf_worst)
        tol = tolerance(b.dtype)
        if not bool((error <= tol.atol + tol.rtol * b64.abs().where(finite, zero)).all()):
            return worst, (f"{where}max abs difference {leaf_worst:.3g} beyond the {b.dtype} tolerance "
                           f"(atol={tol.atol:g}, rtol={tol.rtol:g})")
    return worst, None
