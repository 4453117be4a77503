"""The correctness item: outputs and gradients (inputs and parameters) of the kernel against the
original, per size and dtype, both measured against the original run in fp64 (the truth)."""

from __future__ import annotations

import copy
import math
from typing import Any

import torch

from ..core.tolerances import tolerance
from .report import FAIL, PASS, CheckInputs, CorrectnessCase, KernelCheck
from .runner import Runner, shape_of

__all__ = ["check_correctness"]


def check_correctness(check: KernelCheck, runner: Runner, sizes: list[tuple[int, int]],
                      dtypes: list[torch.dtype]) -> None:
    """Every size x dtype case into ``check.correctness``, and the item's verdict and note.

    Raises:
        NoInputs: the check cannot build inputs for the target.
    """
    for dtype in dtypes:
        for rows, width in sizes:
            check.correctness.append(_case(runner, rows, width, dtype))
    bad = [c for c in check.correctness if not c.passed]
    worst = max((max(c.forward_error, c.backward_error or 0.0) for c in check.correctness), default=0.0)
    check.verdicts["correctness"] = FAIL if bad else PASS
    what = "outputs and gradients" if runner.train else "outputs (inference-only kernel)"
    check.notes["correctness"] = (
        f"{what}, {len(check.correctness)} cases ({len(sizes)} sizes x {', '.join(str(d).removeprefix('torch.') for d in dtypes)}), "
        f"worst error {worst:.3g} of the tolerance" +
        "".join(f"; FAILED {c.dtype} {c.shape}: {c.error or f'fwd {c.forward_error:.3g}, bwd {c.backward_error}'}" for c in bad[:3]))


def _case(runner: Runner, rows: int, width: int, dtype: torch.dtype) -> CorrectnessCase:
    dname = str(dtype).removeprefix("torch.")
    inputs = runner.inputs(rows, width, dtype)
    truth_inputs = _as_double(inputs)
    wrt, truth_wrt = runner.wrt(inputs), runner.wrt(truth_inputs)
    original, kernel = runner.calls(inputs)
    truth_call = runner.calls(truth_inputs)[0]
    shape = shape_of(inputs)
    try:
        expected = runner.outputs(original)
        ours = runner.outputs(kernel)
        keys = [k for k in expected if k in ours and expected[k].is_floating_point()]
        if not keys:
            return CorrectnessCase(shape, dname, math.inf, None, False,
                                   f"no output to compare (original: {list(expected)}, kernel: {list(ours)})")
        truth = runner.outputs(truth_call)
        grads_ref = _grads(runner, expected, keys, wrt, rows)
        grads = _grads(runner, ours, keys, wrt, rows)
        grads_truth = _grads(runner, truth, keys, truth_wrt, rows)
    except Exception as e:  # noqa: BLE001 - a raising kernel is a failed case, the check goes on
        return CorrectnessCase(shape, dname, math.inf, None, False, f"{type(e).__name__}: {e}")
    forward = max(_error(ours[k], expected[k], truth[k]) for k in keys)
    backward = None
    if grads_ref:
        backward = max((math.inf if (a is None) != (b is None) else 0.0 if a is None else _error(a, b, t)
                        for a, b, t in zip(grads, grads_ref, grads_truth)), default=0.0)
    passed = forward <= 1 and (backward is None or backward <= 1)
    return CorrectnessCase(shape, dname, forward, backward, passed)


def _grads(runner: Runner, outputs: dict[str, torch.Tensor], keys: list[str], wrt: list[torch.Tensor], seed: int
           ) -> list[torch.Tensor | None]:
    objective = _objective(outputs, keys, seed) if runner.train and wrt else None
    return [] if objective is None else list(torch.autograd.grad(objective, wrt, allow_unused=True))


def _objective(outputs: dict[str, torch.Tensor], keys: list[str], seed: int) -> torch.Tensor | None:
    """A scalar whose gradient is a fixed random weighting of the compared outputs (multiples of 1/4
    in [-1, 1]: exact in every dtype, so the fp64 truth gets the same weights)."""
    total = None
    generator = torch.Generator().manual_seed(seed)
    for key in keys:
        out = outputs[key]
        if not out.is_floating_point() or not out.requires_grad:
            continue
        weight = (torch.randint(-4, 5, out.shape, generator=generator) / 4).to(device=out.device, dtype=out.dtype)
        term = (out * weight).double().sum()
        total = term if total is None else total + term
    return total


def _error(ours: torch.Tensor, original: torch.Tensor, truth: torch.Tensor) -> float:
    """How far the kernel is from the truth (the original on fp64 copies), in units of what is allowed
    (<= 1 passes): the L2 norm of its error over the dtype's tolerance (``atol`` per element plus
    ``rtol`` of the truth's norm) plus the original's own error norm. A kernel may round differently
    from PyTorch, but may not be less accurate than PyTorch in the same dtype by more than one
    tolerance. Norms, not the worst element: over a gradient summed across thousands of rows, two
    different but equally accurate roundings each have elements where the other happens to be exact
    (on an H100 the worst-element ratio of the built-in norm and MLP reached 1.3-2.8 in bf16/fp16
    while their error norms matched PyTorch's)."""
    if ours.shape != truth.shape:
        return math.inf
    tol = tolerance(original.dtype)
    a, o, t = ours.detach().double(), original.detach().double(), truth.detach().double()
    if not t.numel():
        return 0.0
    # NaN where the original is NaN too (a loss over no label) is agreement, not an error
    both_nan = a.isnan() & t.isnan()
    if (a.isnan() & ~both_nan).any() or (a.isinf() & ~(a == t)).any():
        return math.inf
    a, o, t = (v.masked_fill(both_nan, 0.0).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0) for v in (a, o, t))
    allowed = tol.atol * math.sqrt(t.numel()) + tol.rtol * float(t.norm()) + float((o - t).norm())
    return float((a - t).norm()) / allowed


def _as_double(inputs: "CheckInputs") -> "CheckInputs":
    """fp64 copies of the module and the float arguments: the original run on them is the truth."""
    def convert(value: Any) -> Any:
        return value.detach().double() if isinstance(value, torch.Tensor) and value.is_floating_point() else value

    module = None if inputs.module is None else copy.deepcopy(inputs.module).double()
    return CheckInputs(tuple(convert(a) for a in inputs.args), {k: convert(v) for k, v in inputs.kwargs.items()},
                       module, inputs.no_grad_args)
