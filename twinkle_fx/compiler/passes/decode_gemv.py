"""Linears on a few rows (decode steps) become Triton GEMV calls, with what follows them fused.

At a decode step each linear multiplies one token by its whole weight. cuBLAS's kernels for that
read the small projections of a 0.5B model at 0.3-1.4 TB/s on an H200 (one launch each, plus a bias,
the SwiGLU product, a residual add, and the weight concatenation :mod:`.gemm_fusion` makes to fuse
q/k/v), where ``twinkle_triton.gemv`` reaches 0.7-2.7 TB/s at one row, their epilogues included (the
table per projection and model shape is in docs/performance.md, decode GEMVs). Three rewrites, in graph
order of the linears that read one input:

- ``silu(linear(x, wg)) * linear(x, wu)`` (a SwiGLU MLP's gate and up) ->
  ``twinkle.gemv_swiglu(x, wg, wu)``: both weights streamed by one kernel, the product computed in
  registers;
- two or three other linears of that input (q, k, v) -> one ``twinkle.gemv(x, [wq, wk, wv],
  [bq, bk, bv])`` and a split: no weight is concatenated;
- a linear left alone whose only use is ``residual + linear(...)`` (o_proj, down_proj) ->
  ``twinkle.gemv(h, [w], residual=residual)``; any other -> ``twinkle.gemv(x, [w], [b])``, but under
  ``"auto"`` not an LM head (a weight of over :data:`AUTO_MAX_LONE_WEIGHT` elements), which cuBLAS reads
  at full bandwidth.

Layers the layer pass swapped before this one are opened where that pays at these rows:

- a ``SwiGLUMLP`` layer call (``twinkle_triton.layers``) that would run the GEMV kernels itself (plain
  linears, see ``uses_decode_gemvs``) becomes its two GEMVs in the graph, so ``residual + mlp(h)`` adds the
  residual in the down projection's GEMV;
- an ``RMSNorm`` layer call read only by GEMV calls (the norm before q/k/v, the one before the MLP) moves
  into their prologue (``norm_weight=``): no launch of its own.

Which calls: ``options={"decode_gemv": ...}``: ``"auto"`` (the default) rewrites inference graphs
on CUDA where the input has at most ``twinkle_triton.gemv.DECODE_ROWS`` rows (where the kernels were
measured faster than cuBLAS); ``True`` any graph with at most
``twinkle_triton.gemv.MAX_ROWS`` rows, on any device (on the CPU the kernels run under the Triton
interpreter, or their PyTorch reference); ``False`` none. Removing the registry's graph rewrite
``decode_gemv`` turns it off wherever that registry is in effect. The pass runs before
:mod:`.gemm_fusion`, which then fuses only what it left. Each rewrite is reported as a swapped
function region.
"""

from __future__ import annotations

import logging
import operator

import torch
import torch.fx as fx

from ...core.modes import Mode
from ..graph.dynamo import common_provenance, example_value, set_example_value
from ..pipeline import Outcome, PassState, Swapped
from ..regions.region import LayerKernelCall, builtin_layer_call, layer_call_params
from .function_patterns import region_location
from .gemm_fusion import linear_args, rows_at_most

logger = logging.getLogger(__name__)

__all__ = ["run", "should_rewrite", "left_to_cublas", "AUTO_MAX_LONE_WEIGHT", "DECODE_GEMV"]

DECODE_GEMV = "decode_gemv"  # its name in the registry


_SILU = (torch.nn.functional.silu,)
_MUL = (operator.mul, torch.mul)
_ADD = (operator.add, torch.add)
_KERNEL, _SWIGLU_KERNEL = "twinkle_triton.gemv", "twinkle_triton.gemv_swiglu"


def _kernels():
    import twinkle_triton

    return twinkle_triton


class GemvCall:
    """The graph's call of the kernel: prints as ``twinkle.gemv(x, weights, biases, residual)``."""

    __name__ = __qualname__ = "gemv"
    __module__ = "twinkle"

    def __call__(self, x, weights, biases, residual, norm_weight=None, eps=1e-6):
        return _kernels().gemv(x, weights, biases, residual=residual, norm_weight=norm_weight, eps=eps)

    def __repr__(self) -> str:
        return "<twinkle kernel call gemv>"


class GemvSwigluCall:
    """The graph's call of the kernel: prints as ``twinkle.gemv_swiglu(x, gate_weight, up_weight)``."""

    __name__ = __qualname__ = "gemv_swiglu"
    __module__ = "twinkle"

    def __call__(self, x, gate_weight, up_weight, norm_weight=None, eps=1e-6):
        return _kernels().gemv_swiglu(x, gate_weight, up_weight, norm_weight=norm_weight, eps=eps)

    def __repr__(self) -> str:
        return "<twinkle kernel call gemv_swiglu>"


gemv_call, gemv_swiglu_call = GemvCall(), GemvSwigluCall()


def should_rewrite(setting: bool | str, mode: Mode) -> int | None:
    """The most rows a rewritten input may have under ``setting`` in ``mode``; None: rewrite nothing.

    Examples:
        >>> should_rewrite("auto", Mode.INFERENCE), should_rewrite("auto", Mode.TRAINING)
        (1, None)
    """
    if setting is False or (setting == "auto" and Mode.TRAINING in mode):
        return None
    from twinkle_triton.gemv import DECODE_ROWS, MAX_ROWS  # imported when a graph is rewritten, not with the backend

    return DECODE_ROWS if setting == "auto" else MAX_ROWS


def run(state: PassState) -> list[Outcome]:
    """The pass: see the module docstring."""
    setting = state.options.decode_gemv if state.registry.has_graph_rewrite(DECODE_GEMV) else False
    max_rows = should_rewrite(setting, state.mode)
    if max_rows is None:
        return []
    graph = state.gm.graph
    order = {n: i for i, n in enumerate(graph.nodes)}
    by_input: dict[fx.Node, list[fx.Node]] = {}
    for node in graph.nodes:
        parsed = linear_args(node)
        if parsed is not None and _eligible(node, cuda_only=setting == "auto"):
            by_input.setdefault(parsed[0], []).append(node)
    outcomes: list[Outcome] = []
    for x, linears in by_input.items():
        if not rows_at_most(x, max_rows):
            continue
        rows = _value(x).numel() // _value(x).shape[-1]
        # each rewrite reads its input from the linears: an input that an earlier rewrite replaced
        # (h = residual + o_proj(...) read by gate and up) is the new node there
        for pair in _swiglu_pairs(linears):
            outcomes.append(_rewrite_swiglu(*pair, rows))
            linears = [n for n in linears if n not in pair[:2]]
        for group in _groups(linears, order):
            if setting != "auto" or not left_to_cublas(group):
                outcomes.append(_rewrite_group(group, rows, order))
    cuda_only = setting == "auto"
    for node in list(graph.nodes):
        if (call := builtin_layer_call(node, "SwiGLUMLP")) is not None:
            outcomes.extend(_open_mlp(node, call, max_rows, cuda_only))
    for node in list(graph.nodes):
        if (call := builtin_layer_call(node, "RMSNorm")) is not None:
            outcomes.extend(_norm_into_prologues(node, call))
    if outcomes:
        graph.lint()
        state.gm.recompile()
        logger.info("decode_gemv: %d group(s) of linears now call the GEMV kernels", len(outcomes))
    return outcomes


def _value(node: object) -> torch.Tensor | None:
    value = example_value(node) if isinstance(node, fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


def _eligible(node: fx.Node, *, cuda_only: bool) -> bool:
    """A linear whose input, weight and bias are tensors of one floating dtype and device, with a 2-D
    weight and a 1-D bias or none."""
    x, weight, bias = linear_args(node)
    xv, wv = _value(x), _value(weight)
    if xv is None or wv is None or not isinstance(weight, fx.Node) or wv.dim() != 2 or xv.dim() == 0:
        return False
    if not xv.is_floating_point() or wv.dtype != xv.dtype or wv.device != xv.device:
        return False
    if cuda_only and xv.device.type != "cuda":
        return False
    if bias is None:
        return True
    bv = _value(bias)
    return isinstance(bias, fx.Node) and bv is not None and bv.dim() == 1 and bv.dtype == xv.dtype


def _only_user(node: fx.Node) -> fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def _is_call(node: fx.Node | None, targets: tuple) -> bool:
    return node is not None and node.op == "call_function" and node.target in targets and not node.kwargs


def _swiglu_pairs(linears: list[fx.Node]) -> list[tuple[fx.Node, fx.Node, fx.Node]]:
    """(gate linear, up linear, the product) for each ``silu(gate) * up`` on two bias-free linears of
    one input, each read by nothing else."""
    pairs = []
    for gate in linears:
        silu = _only_user(gate)
        product = _only_user(silu) if _is_call(silu, _SILU) and len(silu.args) == 1 else None
        if not _is_call(product, _MUL) or linear_args(gate)[2] is not None:
            continue
        other = product.args[1] if product.args[0] is silu else product.args[0]
        if other in linears and other is not gate and _only_user(other) is product and linear_args(other)[2] is None:
            if _value(linear_args(other)[1]).shape == _value(linear_args(gate)[1]).shape:
                pairs.append((gate, other, product))
    return pairs


def _groups(linears: list[fx.Node], order: dict[fx.Node, int]) -> list[list[fx.Node]]:
    """The linears of one input in launches: up to three at once where their weights share dtype and
    input width, all or none have a bias and every weight is defined before the first; else alone."""
    groups: list[list[fx.Node]] = []
    kinds: dict[tuple, list[fx.Node]] = {}
    for node in linears:
        _, weight, bias = linear_args(node)
        kinds.setdefault((_value(weight).shape[1], bias is None), []).append(node)
    for same in kinds.values():
        for start in range(0, len(same), 3):
            chunk = same[start:start + 3]
            first = min(chunk, key=order.__getitem__)
            defined = [a for n in chunk for a in linear_args(n)[1:] if isinstance(a, fx.Node)]
            if all(order[d] < order[first] for d in defined):
                groups.append(chunk)
            else:
                groups.extend([n] for n in chunk)
    return groups


# "auto" leaves a lone linear with a larger weight than this (elements) to cuBLAS: at one row its GEMV reads an
# LM head's weight at 4.0-4.2 TB/s, where the kernel took 0.89-0.98 of its speed (tools/gemv_sweep.py, H200,
# bf16, LM heads of 136M-394M elements); the largest projection measured faster has 25M (Llama-3.2-3B's down).
AUTO_MAX_LONE_WEIGHT = 2**26


def left_to_cublas(group: list[fx.Node]) -> bool:
    """Whether "auto" keeps ``group`` as cuBLAS's: one linear, no residual to add, a weight of more than
    :data:`AUTO_MAX_LONE_WEIGHT` elements (an LM head)."""
    return len(group) == 1 and _residual(group[0]) is None and \
        _value(linear_args(group[0])[1]).numel() > AUTO_MAX_LONE_WEIGHT


def _residual(linear: fx.Node) -> tuple[fx.Node, fx.Node] | None:
    """(the add, the residual) when the linear's only use is ``residual + linear`` of one shape and dtype."""
    add = _only_user(linear)
    if not _is_call(add, _ADD) or len(add.args) != 2:
        return None
    residual = add.args[1] if add.args[0] is linear else add.args[0]
    rv, lv = _value(residual), _value(linear)
    if residual is linear or rv is None or lv is None or rv.shape != lv.shape or rv.dtype != lv.dtype:
        return None
    return add, residual


def _rewrite_swiglu(gate: fx.Node, up: fx.Node, product: fx.Node, rows: int) -> Swapped:
    graph, x = gate.graph, linear_args(gate)[0]
    with graph.inserting_before(product):
        call = graph.call_function(gemv_swiglu_call, (x, linear_args(gate)[1], linear_args(up)[1]))
    call.meta.update(common_provenance([gate, up, product]))
    set_example_value(call, example_value(product))
    location = region_location([gate, up, product])
    product.replace_all_uses_with(call)
    silu = product.args[0] if product.args[0] is not up else product.args[1]
    for node in (product, silu, gate, up):
        graph.erase_node(node)
    return Swapped("function", f"silu(linear) * linear on {rows} row(s)", location, _SWIGLU_KERNEL,
                   f"{rows} row(s): gate and up in one GEMV")


def _rewrite_group(group: list[fx.Node], rows: int, order: dict[fx.Node, int]) -> Swapped:
    graph, x = group[0].graph, linear_args(group[0])[0]
    weights = [linear_args(n)[1] for n in group]
    biases = [linear_args(n)[2] for n in group]
    biases = None if biases[0] is None else biases
    location = region_location(group)
    residual = _residual(group[0]) if len(group) == 1 else None
    if residual is not None:
        add, r = residual
        with graph.inserting_before(add):
            call = graph.call_function(gemv_call, (x, weights, biases, r))
        call.meta.update(common_provenance([group[0], add]))
        set_example_value(call, example_value(add))
        add.replace_all_uses_with(call)
        graph.erase_node(add)
        graph.erase_node(group[0])
        return Swapped("function", f"linear + residual on {rows} row(s)", location, _KERNEL,
                       f"{rows} row(s): the residual added in the GEMV")
    first = min(group, key=order.__getitem__)
    widths = [int(_value(w).shape[0]) for w in weights]
    with graph.inserting_before(first):
        call = graph.call_function(gemv_call, (x, weights, biases, None))
        call.meta.update(common_provenance(group))
        out = _value(x).new_empty((*_value(x).shape[:-1], sum(widths)))
        set_example_value(call, out)
        pieces = [call] if len(group) == 1 else [
            graph.call_function(torch.narrow, (call, -1, sum(widths[:i]), widths[i])) for i in range(len(group))]
    for i, (piece, linear) in enumerate(zip(pieces, group)):
        if piece is not call:
            piece.meta.update(linear.meta)
            set_example_value(piece, out.narrow(-1, sum(widths[:i]), widths[i]))
        linear.replace_all_uses_with(piece)
        graph.erase_node(linear)
    what = f"{len(group)} linear(s) on {rows} row(s)" if len(group) > 1 else f"linear on {rows} row(s)"
    return Swapped("function", what, location, _KERNEL, f"{rows} row(s): " + (
        "one launch, no weight concatenated" if len(group) > 1 else "one GEMV"))


def _open_mlp(node: fx.Node, call: LayerKernelCall, max_rows: int, cuda_only: bool) -> list[Outcome]:
    """A SwiGLUMLP layer call -> ``gemv(gemv_swiglu(x, wg, wu), [wd], [bd], residual)`` where the layer itself
    would run those kernels on the input (its projections plain linears, the rows few enough)."""
    from twinkle_triton.layers import uses_decode_gemvs

    x, params = node.args[0], layer_call_params(node, call)
    xv = _value(x)
    weights = ("gate_proj.weight", "up_proj.weight", "down_proj.weight")
    if xv is None or not set(weights) <= set(params) <= {*weights, "down_proj.bias"} or not rows_at_most(x, max_rows):
        return []
    if (cuda_only and xv.device.type != "cuda") or not uses_decode_gemvs(call.module, xv):
        return []
    graph, rows = node.graph, xv.numel() // xv.shape[-1]
    wg, wu, wd = (params[w] for w in weights)
    bias = [params["down_proj.bias"]] if "down_proj.bias" in params else None
    residual = _residual(node)
    last = residual[0] if residual is not None else node
    with graph.inserting_before(last):
        act = graph.call_function(gemv_swiglu_call, (x, wg, wu))
        down = graph.call_function(gemv_call, (act, [wd], bias, residual[1] if residual is not None else None))
    for new in (act, down):
        new.meta.update(common_provenance([node]))
    set_example_value(act, xv.new_empty((*xv.shape[:-1], int(_value(wg).shape[0]))))
    set_example_value(down, example_value(last))
    location = region_location([node])
    last.replace_all_uses_with(down)
    for old in ([last, node] if residual is not None else [node]):
        graph.erase_node(old)
    what = "SwiGLUMLP layer" + (" + residual" if residual is not None else "")
    return [Swapped("function", f"{what} on {rows} row(s)", location, _SWIGLU_KERNEL,
                    f"{rows} row(s): the layer's GEMVs in the graph" +
                    (", the residual added in down's" if residual is not None else ""))]


def _norm_into_prologues(node: fx.Node, call: LayerKernelCall) -> list[Outcome]:
    """An RMSNorm layer call read only as the input of GEMV calls -> ``norm_weight=`` of each of them."""
    users = list(node.users)
    params = layer_call_params(node, call)
    x, out = node.args[0], _value(node)
    if not users or set(params) != {"weight"} or _value(x) is None or out is None or out.dtype != _value(x).dtype:
        return []
    arity = {gemv_call: 4, gemv_swiglu_call: 3}  # calls without a norm of their own
    for user in users:
        if user.op != "call_function" or arity.get(user.target) != len(user.args) or user.args[0] is not node \
                or _reads(user.args[1:], node):
            return []
    eps = float(call.constants.get("variance_epsilon", call.module.variance_epsilon))
    for user in users:
        user.args = (x, *user.args[1:], params["weight"], eps)
    location = region_location([node])
    node.graph.erase_node(node)
    rows = _value(x).numel() // _value(x).shape[-1]
    return [Swapped("function", f"RMSNorm layer into {len(users)} GEMV(s) on {rows} row(s)", location, _KERNEL,
                    "the norm computed in the GEMVs' prologue")]


def _reads(args: tuple, node: fx.Node) -> bool:
    found = []
    fx.node.map_arg(args, lambda a: found.append(a is node))
    return any(found)
