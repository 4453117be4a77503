"""A residual add read by a swapped RMSNorm becomes one ``twinkle_triton.add_rms_norm`` call.

A decoder layer adds a branch to the residual stream and norms the sum, which is also the next
residual::

    h = residual + attn_out           # read by the norm and by the next residual add
    normed = RMSNorm(h)               # a swapped layer: twinkle_triton.layers.RMSNorm

Inductor cannot fuse the add into the swapped norm's kernel, so the add is a kernel of its own, and in
the backward so is the sum of the norm's input gradient and the gradient ``h`` gets from its other
readers. After::

    normed, h = add_rms_norm(attn_out, residual, weight, eps)

one forward kernel reads both addends and writes the sum and the normed rows, and one backward kernel
reads the normed rows' gradient, the sum's and the saved sum and writes the gradient both addends
get. The sum is rounded to the addends' dtype before it is normed, as the add rounds it, so the
results are those of the graph before.

Only sums read by something besides the norm are rewritten: for a sum that only the norm reads (the
final norm of a model) the fused backward would read a gradient of zeros for the sum, which the
unfused backward does not need. Nor are the norms a decode step's GEMVs took (:mod:`.decode_gemv`
runs first).

Kernel times of a training step's residual add + norm, forward and backward, on one H200 (triton 3.6, bf16,
4096 rows, the L2 flushed before each call): at hidden 2048 the add, rms_norm, its backward and the
gradients' add as separate kernels take 68 us (14.9 + 11.1 + 27.4 + 14.9), add_rms_norm 50 (18.7 + 30.9),
Inductor's code for the same add and norm 68; at hidden 3072 95, 70 and 120 us.

The registry's graph rewrite ``residual_norm`` (see :data:`~twinkle_fx.core.registry.GRAPH_REWRITES`) turns
the pass off wherever that registry is in effect, ``options={"residual_norm": False}`` for one compile.
"""

from __future__ import annotations

import logging
import operator

import torch
import torch.fx as fx

from ..graph.dynamo import common_provenance, example_value, set_example_value
from ..pipeline import Outcome, PassState, Swapped
from ..regions.region import builtin_layer_call, layer_call_params
from .function_patterns import region_location

logger = logging.getLogger(__name__)

__all__ = ["run", "RESIDUAL_NORM", "add_rms_norm_call"]

RESIDUAL_NORM = "residual_norm"  # its name in the registry

_ADD = (operator.add, torch.add)
_KERNEL = "twinkle_triton.add_rms_norm"


class AddRMSNormCall:
    """The graph's call of the kernel: prints as ``twinkle.add_rms_norm(x, residual, weight, eps)``."""

    __name__ = __qualname__ = "add_rms_norm"
    __module__ = "twinkle"

    def __call__(self, x, residual, weight, eps):
        import twinkle_triton  # imported when the graph runs or is traced, not with the backend

        return twinkle_triton.add_rms_norm(x, residual, weight, eps)

    def __repr__(self) -> str:
        return "<twinkle kernel call add_rms_norm>"


add_rms_norm_call = AddRMSNormCall()


def run(state: PassState) -> list[Outcome]:
    """The pass: see the module docstring."""
    if not (state.options.residual_norm and state.registry.has_graph_rewrite(RESIDUAL_NORM)):
        return []
    graph = state.gm.graph
    order = {n: i for i, n in enumerate(graph.nodes)}
    outcomes: list[Outcome] = []
    for node in list(graph.nodes):
        call = builtin_layer_call(node, "RMSNorm")
        if call is not None and (swap := _fuse(node, call, order)) is not None:
            outcomes.append(swap)
    if outcomes:
        graph.lint()
        state.gm.recompile()
        logger.info("residual_norm: %d residual add(s) joined their RMSNorm's kernel", len(outcomes))
    return outcomes


def _fuse(norm: fx.Node, call, order: dict[fx.Node, int]) -> Swapped | None:
    add, params = norm.args[0], layer_call_params(norm, call)
    addends = _addends(add)
    weight = params.get("weight")
    if addends is None or set(params) != {"weight"} or len(add.users) < 2 or not isinstance(weight, fx.Node):
        return None
    if order.get(weight, len(order)) > order[add]:  # the call takes the add's place, which the weight must precede
        return None
    eps = float(call.constants.get("variance_epsilon", call.module.variance_epsilon))
    graph = norm.graph
    with graph.inserting_before(add.next):  # in order, right after the add
        fused = graph.call_function(add_rms_norm_call, (*addends, weight, eps))
        normed = graph.call_function(operator.getitem, (fused, 0))
        summed = graph.call_function(operator.getitem, (fused, 1))
    fused.meta.update(common_provenance([add, norm]))
    normed.meta.update(norm.meta)
    summed.meta.update(add.meta)
    set_example_value(fused, (example_value(norm), example_value(add)))
    set_example_value(normed, example_value(norm))
    set_example_value(summed, example_value(add))
    location = region_location([norm])
    norm.replace_all_uses_with(normed)
    graph.erase_node(norm)
    add.replace_all_uses_with(summed)
    graph.erase_node(add)
    return Swapped("function", "residual add + RMSNorm layer", location, _KERNEL,
                   "the add in the norm's kernel, forward and backward")


def _addends(add: object) -> tuple[fx.Node, fx.Node] | None:
    """The two tensors ``add`` sums when it is a plain add of two tensors of one shape, dtype and device."""
    if not isinstance(add, fx.Node) or add.op != "call_function" or add.target not in _ADD \
            or len(add.args) != 2 or add.kwargs:
        return None
    values = [example_value(a) if isinstance(a, fx.Node) else None for a in add.args]
    out = example_value(add)
    if not all(isinstance(v, torch.Tensor) for v in (*values, out)):
        return None
    a, b = values
    if not (a.shape == b.shape == out.shape and a.dtype == b.dtype == out.dtype and a.device == b.device):
        return None
    return add.args[0], add.args[1]
