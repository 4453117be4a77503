"""``options={"verify": True}``: run the graph before and after the rewrite on the example inputs.

Debugging aid, at compile time: the original graph is kept as a copy, both run once without
grad on the real example inputs (inputs cloned so in-place updates do not add up), and outputs
must agree as :func:`twinkle_fx.numerics.compare` (eager verify's comparison) says.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.fx as fx

from .. import numerics
from .dynamo_internals import is_ddp_piece

__all__ = ["snapshot", "compare"]


def snapshot(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``gm``'s graph (sharing its submodules and constants) to run as the reference."""
    return fx.GraphModule(gm, copy.deepcopy(gm.graph))


def _clone(value: Any) -> Any:
    if isinstance(value, torch.nn.Parameter):
        return value
    return value.clone() if isinstance(value, torch.Tensor) else value


def compare(reference: fx.GraphModule, rewritten: fx.GraphModule, example_inputs: list[Any]) -> str | None:
    """None when both graphs agree on the example inputs, else what differs."""
    if is_ddp_piece(example_inputs):
        return "not checked: the graph's example inputs are fake tensors (a DDP bucket), nothing real to run"
    with torch.no_grad():
        want_tree = reference(*[_clone(v) for v in example_inputs])
        got_tree = rewritten(*[_clone(v) for v in example_inputs])
    return numerics.compare(got_tree, want_tree, leaf="output", reference_name="the original")[1]
