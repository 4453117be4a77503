"""``options={"verify": True}``: run the graph before and after the rewrite on the example inputs.

Debugging aid, at compile time: the original graph is kept as a copy, both run once without
grad on the real example inputs (inputs cloned so in-place updates do not add up), and outputs
must agree within the dtype's tolerance.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensor

__all__ = ["snapshot", "compare"]

_TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-8, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def snapshot(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``gm``'s graph (sharing its submodules and constants) to run as the reference."""
    return fx.GraphModule(gm, copy.deepcopy(gm.graph))


def _clone(value: Any) -> Any:
    if isinstance(value, torch.nn.Parameter):
        return value
    return value.clone() if isinstance(value, torch.Tensor) else value


def compare(reference: fx.GraphModule, rewritten: fx.GraphModule, example_inputs: list[Any]) -> str | None:
    """None when both graphs agree on the example inputs, else what differs."""
    if any(isinstance(v, FakeTensor) for v in example_inputs):
        return "not checked: the graph's example inputs are fake tensors (a DDP bucket), nothing real to run"
    with torch.no_grad():
        want_tree = reference(*[_clone(v) for v in example_inputs])
        got_tree = rewritten(*[_clone(v) for v in example_inputs])
    want, want_spec = pytree.tree_flatten(want_tree)
    got, got_spec = pytree.tree_flatten(got_tree)
    if want_spec != got_spec:
        return f"the rewritten graph returns {len(got)} output(s) shaped {got_spec}, the original {len(want)} shaped {want_spec}"
    for i, (a, b) in enumerate(zip(want, got)):
        if not isinstance(a, torch.Tensor):
            continue
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"output {i}: {b.dtype}{list(b.shape)} instead of {a.dtype}{list(a.shape)}"
        if a.is_floating_point():
            tol = _TOLERANCE.get(a.dtype, 1e-4)
            if not torch.allclose(a, b, rtol=tol, atol=tol):
                return f"output {i}: max abs difference {(a.float() - b.float()).abs().max().item():.3g} (tolerance {tol})"
        elif not torch.equal(a, b):
            return f"output {i}: values differ"
    return None
