"""``options={"verify": True}``: run the graph before and after the rewrite on the example inputs.

Debugging aid, at compile time: the original graph is kept as a copy, both run once without
grad on the real example inputs (inputs cloned so in-place updates do not add up), and outputs
must agree as :func:`twinkle_fx.core.numerics.compare` (eager verify's comparison) says.

A graph with dynamic shapes serves sizes it was never run at, and the example sizes are often
the friendly ones (even, powers of two) where a kernel's edge handling never runs: such a graph
is also run at a second, awkward size of every symbol (odd, hence no power of two), its inputs
built from the example inputs. When it cannot run there (a size the model's own code refuses),
the report and a WARNING say that only the example shapes were checked.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.fx as fx

from ...core import numerics
from ..graph.dynamo import is_ddp_piece

__all__ = ["snapshot", "compare", "compare_at_other_sizes", "awkward_size"]


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


def awkward_size(hint: int, lower: int = 2, upper: float = float("inf")) -> int | None:
    """An odd size other than ``hint`` within ``[lower, upper]``, close to it (small inputs stay
    small); None when the range holds none. Odd sizes above 1 are never powers of two.

    Examples:
        >>> awkward_size(4), awkward_size(5), awkward_size(8, upper=8)
        (5, 7, 7)
    """
    for size in (*range(hint + 1, hint + 3), *range(hint - 1, hint - 3, -1)):
        if size % 2 and size != hint and max(lower, 3) <= size <= upper:
            return size
    return None


def _symbols(value: Any) -> set:
    sizes = [value] if isinstance(value, torch.SymInt) else list(value.shape) if isinstance(value, torch.Tensor) else []
    found: set = set()
    for size in sizes:
        if isinstance(size, torch.SymInt):
            found |= size.node.expr.free_symbols
    return found


def _at(size: Any, values: dict) -> int:
    return int(size.node.expr.xreplace(values)) if isinstance(size, torch.SymInt) else int(size)


def _resized(value: torch.Tensor, shape: list[int]) -> torch.Tensor:
    """A tensor of ``shape`` holding ``value``'s elements repeated: ids, positions and masks stay in
    their valid range."""
    flat = value.detach().reshape(-1)
    count = 1
    for size in shape:
        count *= size
    if flat.numel() == 0:
        return torch.zeros(shape, dtype=value.dtype, device=value.device)
    return flat.repeat(-(-count // flat.numel()))[:count].reshape(shape)


def compare_at_other_sizes(reference: fx.GraphModule, rewritten: fx.GraphModule,
                           example_inputs: list[Any]) -> tuple[str | None, str | None]:
    """For a graph with dynamic sizes: run both graphs at an awkward size of every symbol.

    Returns:
        ``(mismatch, checked)``: ``mismatch`` is what differs (None when they agree or the graph is
        static); ``checked`` says what was checked beside the example shapes, or that nothing was
        and why (it starts with "only the example shapes" then); None for a static graph.
    """
    placeholders = [n for n in reference.graph.nodes if n.op == "placeholder"]
    metas = [n.meta.get("example_value") for n in placeholders]
    symbols = set().union(*(_symbols(m) for m in metas)) if metas else set()
    if not symbols:
        return None, None
    if len(placeholders) != len(example_inputs):
        return None, "only the example shapes were checked: the graph's inputs do not line up with its placeholders"
    shape_env = next(size.node.shape_env for m in metas for size in
                     ([m] if isinstance(m, torch.SymInt) else list(getattr(m, "shape", ())))
                     if isinstance(size, torch.SymInt))
    # torch 2.13 renamed var_to_val (the sizes the graph was traced at) to backed_var_to_val
    hints = getattr(shape_env, "backed_var_to_val", None)
    hints = shape_env.var_to_val if hints is None else hints
    values = {}
    for symbol in sorted(symbols, key=str):
        hint = hints.get(symbol)
        bounds = shape_env.var_to_range.get(symbol)
        size = None if hint is None else awkward_size(int(hint), int(bounds.lower) if bounds is not None else 2,
                                                      float(bounds.upper) if bounds is not None else float("inf"))
        if size is None:
            return None, f"only the example shapes were checked: no second size of {symbol} (example {hint}) to run"
        values[symbol] = size
    sizes = ", ".join(f"{symbol}={size} (example {hints[symbol]})" for symbol, size in values.items())
    inputs = []
    for meta, value in zip(metas, example_inputs):
        if isinstance(meta, torch.SymInt):
            inputs.append(_at(meta, values))
        elif isinstance(meta, torch.Tensor) and isinstance(value, torch.Tensor) and _symbols(meta):
            inputs.append(_resized(value, [_at(size, values) for size in meta.shape]))
        else:
            inputs.append(_clone(value))
    try:
        with torch.no_grad():
            want_tree = reference(*inputs)
    except Exception as e:  # the model's own code refuses the size: nothing to compare there
        return None, (f"only the example shapes were checked: the original graph does not run at {sizes} "
                      f"({type(e).__name__}: {str(e)[:200]})")
    try:
        with torch.no_grad():
            got_tree = rewritten(*[_clone(v) for v in inputs])
    except Exception as e:
        return f"at {sizes} the rewritten graph raised {type(e).__name__}: {str(e)[:200]}", sizes
    mismatch = numerics.compare(got_tree, want_tree, leaf="output", reference_name="the original")[1]
    return (None if mismatch is None else f"at {sizes}: {mismatch}"), f"the example shapes and {sizes}"
