"""Bind a region to its reference: which region inputs are the reference's arguments, and which
leaf of the reference's result each region output is. One algorithm for layers and functions.

The reference is a layer's original ``forward`` (its arguments' order unknown: every order is
tried) or a registered function (its order known from the pattern). Region and reference are
traced to ATen on the same static fake inputs (:mod:`.equivalence`); a binding exists when every
region output is a reference output. Regions with the same structure and input metadata (the 24
identical layers of a model) share one answer, kept in the graph's cache (``PassScratch.bindings``), so only the first is traced.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch.fx as fx

from .equivalence import StructuralKeys, aten_outputs, static_inputs
from ..reasons import KeepRegion, Reason, ReasonKind
from .region import Binding, Region, external_outputs, region_graph_module, region_signature

__all__ = ["bind", "outputs_read_outside"]


def outputs_read_outside(region: Region) -> list[fx.Node]:
    """The region's nodes read outside it (what a kernel call must produce); keeps the region if none."""
    outputs = external_outputs(region.nodes)
    if not outputs:
        raise KeepRegion(ReasonKind.UNUSED_RESULT, "nothing outside the region reads its result")
    return outputs


def bind(
    gm: fx.GraphModule,
    cache: dict[tuple, Binding | Reason],
    region: Region,
    *,
    key: tuple,
    inputs: Sequence[fx.Node],
    values: Sequence[Any],
    outputs: Sequence[fx.Node],
    orders: Iterable[tuple[int, ...]],
    reference: Callable[[tuple[int, ...]], Callable[..., Any]],
    mismatch: str,
    constants: dict[fx.Node, float] | None = None,
) -> Binding:
    """The first order of ``orders`` whose reference computes the region's outputs.

    Args:
        gm: the graph the region is in.
        cache: the answers found so far for this graph (a binding, or the reason there is none).
        key: what besides the region's signature decides the answer (the class or pattern, names, constants).
        inputs: the region's input nodes, as the region graph takes them; ``values`` their example values.
        orders: orders to try; ``reference(order)`` is the reference taking the inputs' values in the
            region's order and passing them on in ``order``.
        mismatch: the detail shown when no order computes the region's outputs.
        constants: graph inputs holding lifted float attributes, read as these literals in the region.

    Raises:
        KeepRegion: no binding (the reason is cached with the key, as a binding would be).
    """
    full_key = (key, region_signature(region.nodes, list(inputs), list(outputs)))
    if full_key not in cache:
        try:
            cache[full_key] = _search(gm, region, inputs, values, outputs, orders, reference, mismatch,
                                               constants)
        except KeepRegion as keep:
            cache[full_key] = keep.reason
    found = cache[full_key]
    if isinstance(found, Reason):
        raise KeepRegion(found.kind, found.detail, found.exception)
    return found


def _search(
    gm: fx.GraphModule, region: Region, inputs: Sequence[fx.Node], values: Sequence[Any], outputs: Sequence[fx.Node],
    orders: Iterable[tuple[int, ...]], reference: Callable[[tuple[int, ...]], Callable[..., Any]], mismatch: str,
    constants: dict[fx.Node, float] | None,
) -> Binding:
    try:
        statics = static_inputs(values)
    except ValueError as e:
        raise KeepRegion(ReasonKind.DATA_DEPENDENT, f"cannot build example inputs: {e}", e) from None
    keys = StructuralKeys()
    region_gm = region_graph_module(gm, region.nodes, list(inputs), list(outputs), constants)
    try:
        region_keys = keys.outputs(aten_outputs(region_gm, statics))
    except Exception as e:  # the region itself should always replay; say so if it does not
        raise KeepRegion(ReasonKind.CHECK_FAILED, f"the region does not replay on fake tensors: {e!r}", e) from None
    failures: list[Exception] = []
    ran = False
    for order in orders:
        try:
            ref_keys = keys.outputs(aten_outputs(reference(order), statics))
        except Exception as e:  # this order does not fit the reference; the next may
            failures.append(e)
            continue
        ran = True
        if all(k in ref_keys for k in region_keys):
            return Binding(tuple(order), tuple(ref_keys.index(k) for k in region_keys))
    detail = f" (the reference failed on fake inputs: {failures[0]!r})" if failures else ""
    if not ran:
        raise KeepRegion(ReasonKind.CHECK_FAILED, mismatch + detail, failures[0] if failures else None)
    raise KeepRegion(ReasonKind.NOT_EQUIVALENT, mismatch + detail)
