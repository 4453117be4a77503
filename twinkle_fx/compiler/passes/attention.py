"""Attention as transformers writes it, made what the GPU does best: two SDPA rewrites.

**A causal mask that is a constant becomes ``is_causal=True``.** Under torch.compile transformers
does not skip the causal mask (``_ignore_causal_mask_sdpa`` declines while tracing), so a compiled
forward without padding (training on packed rows, a prefill of ``model(input_ids)``) passes SDPA a
materialised ``L x S`` boolean mask. A masked SDPA cannot take grouped heads on CUDA, so the key
and value are repeated to the query's heads too, and the call runs a masked kernel over the whole
square (cuDNN's on an H100 with torch 2.11) instead of causal attention over its lower half. When the mask depends on no graph
input (it is made from ``arange``s of static sizes), the pass evaluates it once at compile time;
when it is exactly the upper-left causal mask (key ``j`` visible to query ``i`` iff ``j <= i``, over
every batch row and head), the call becomes ``scaled_dot_product_attention(q, k, v, is_causal=True)``,
and on unrepeated K/V with ``enable_gqa=True`` where flash attention takes it (fp16/bf16). Any other
mask (padding, a sliding window, a mask from the inputs) is left alone. The registry's graph rewrite
``causal_attention`` (``get_registry().remove_graph_rewrite("causal_attention")``) turns it off wherever
that registry is in effect, ``options={"causal_mask": False}`` for one compile.

**Short queries on repeated K/V become one grouped-query kernel.** transformers'
``sdpa_attention_forward`` repeats key and value whenever a mask is given, and a static KV cache always
has one, so at every decode step each layer copies its whole cache, expanded from the KV heads to the
query heads (Qwen2-0.5B, 32 sequences, a 1024-token cache: 2 -> 14 heads, 58.7 MB for K and as much
for V, written and read again by SDPA), to attend with one query token. Before::

    k = key[:, :, None, :, :].expand(B, Hkv, G, S, D).reshape(B, Hkv * G, S, D)   # the same for value
    out = scaled_dot_product_attention(query, k, v, attn_mask=mask, dropout_p=0.0, scale=s)

after::

    out = twinkle.gqa_attention(query, key, value, mask, s)

``twinkle_triton.gqa_attention`` reads each KV head once for all the query heads of its group
(flash-decoding: the keys split across programs, then one combine), and has a backward.
``options={"gqa_attention": ...}``: ``"auto"`` (the default) rewrites calls whose query length is at
most :data:`AUTO_MAX_QUERY_LEN` (decode steps), ``True`` every match, ``False`` none; removing the
registry's graph rewrite ``gqa_attention`` turns it off as ``False`` does, wherever that registry is in effect.

Both match the repeat written as transformers' ``repeat_kv`` (index with ``None``, ``expand``,
``reshape``) or as ``repeat_interleave(G, dim=1)``, on key and value with the same group size, and
only SDPA calls without dropout, ``is_causal`` or ``enable_gqa``. Each rewritten call is reported as a
swapped function region; a repeat the kernel cannot take is reported as kept, with the reason (a
query longer than the option allows is no candidate: logged at DEBUG).
"""

from __future__ import annotations

import logging
import math
import operator
import os

import torch
import torch.fx as fx

from ...core.torch_internals import nn_sdpa
from ..graph.dynamo import common_provenance, example_value, is_erased, set_example_value
from ..pipeline import Kept, Outcome, PassState, Swapped
from ...core.reasons import Reason, ReasonKind
from .function_patterns import region_location

logger = logging.getLogger(__name__)

__all__ = ["run", "AUTO_MAX_QUERY_LEN", "find_repeat", "should_rewrite", "constant_causal"]

# "auto": the longest query the kernel takes. Decode steps are 1 token (a few with speculative
# decoding); there the repeat_kv copy is nearly all of attention's memory traffic.
AUTO_MAX_QUERY_LEN = 16

# the largest mask (elements) evaluated at compile time: 2**28 booleans is 256 MiB, a 16k x 16k mask
MAX_EVALUATED_MASK = 2**28

CAUSAL_REWRITE, GQA_REWRITE = "causal_attention", "gqa_attention"  # their names in the registry
SDPA_TARGETS = (nn_sdpa(), torch.nn.functional.scaled_dot_product_attention)
_SDPA_PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_TARGET = "scaled_dot_product_attention on repeated K/V"
_KERNEL = "twinkle_triton.gqa_attention"
_CAUSAL_TARGET = "scaled_dot_product_attention with a constant causal mask"
_CAUSAL_KERNEL = "scaled_dot_product_attention(is_causal=True)"
_FROM_INPUTS = "the mask is computed from graph inputs"


def _kernel():
    import twinkle_triton

    return twinkle_triton.gqa_attention


class GQAAttentionCall:
    """The graph's call of the kernel: prints as ``twinkle.gqa_attention(query, key, value, mask, scale)``."""

    __name__ = __qualname__ = "gqa_attention"
    __module__ = "twinkle"

    def __call__(self, query, key, value, attn_mask, scale):
        return _kernel()(query, key, value, attn_mask=attn_mask, scale=scale)

    def __repr__(self) -> str:
        return "<twinkle kernel call gqa_attention>"


gqa_attention_call = GQAAttentionCall()


def should_rewrite(setting: bool | str, query_len: object) -> tuple[bool, str]:
    """Whether ``setting`` rewrites a call with a query of ``query_len`` tokens, and if not, why."""
    if setting is False:
        return False, "options gqa_attention=False, or the registry's graph rewrite gqa_attention removed"
    if not isinstance(query_len, int):
        return False, f"the query length is symbolic ({query_len}); compile with dynamic=False for decode steps"
    if setting == "auto" and query_len > AUTO_MAX_QUERY_LEN:
        return False, (f"query length {query_len} > {AUTO_MAX_QUERY_LEN}: SDPA's fused kernels on the repeated K/V "
                       f"are kept (the copy is a small part of a prefill); gqa_attention=True rewrites it anyway")
    return True, ""


def _value(node: object) -> torch.Tensor | None:
    value = example_value(node) if isinstance(node, fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


def _is_method(node: object, *names: str) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_method" and node.target in names


def _repeat_interleave(node: fx.Node) -> tuple[fx.Node, int] | None:
    """``x.repeat_interleave(G, dim=1)`` / ``torch.repeat_interleave(x, G, dim=1)`` -> (x, G)."""
    if not (_is_method(node, "repeat_interleave")
            or (node.op == "call_function" and node.target is torch.repeat_interleave)):
        return None
    args = list(node.args) + [None] * 3
    source, repeats = args[0], node.kwargs.get("repeats", args[1])
    dim = node.kwargs.get("dim", args[2])
    if isinstance(source, fx.Node) and isinstance(repeats, int) and dim == 1:
        return source, repeats
    return None


def find_repeat(node: object) -> tuple[fx.Node, int, list[fx.Node]] | None:
    """``(source, G, nodes)`` when ``node`` repeats the heads (dim 1) of a 4-D ``source`` ``G`` times,
    each head ``G`` times in a row (what ``repeat_kv`` and ``repeat_interleave(G, dim=1)`` do);
    ``nodes``: the nodes of the repeat, last first."""
    if not isinstance(node, fx.Node):
        return None
    out = _value(node)
    if out is None or out.dim() != 4:
        return None
    found = _repeat_interleave(node)
    if found is not None:
        source, groups = found
        chain = [node]
    elif _is_method(node, "reshape", "view") or (node.op == "call_function" and node.target is torch.reshape):
        expand = node.args[0]
        if not _is_method(expand, "expand") or not isinstance(expand.args[0], fx.Node):
            return None
        index = expand.args[0]
        if not (index.op == "call_function" and index.target is operator.getitem
                and index.args[1] == (slice(None), slice(None), None, slice(None), slice(None))):
            return None
        source, expanded = index.args[0], _value(expand)
        if not isinstance(source, fx.Node) or expanded is None or expanded.dim() != 5:
            return None
        groups = expanded.shape[2]
        chain = [node, expand, index]
    else:
        return None
    src = _value(source)
    if src is None or src.dim() != 4 or not isinstance(groups, int):
        return None
    b, h, s, d = src.shape
    if tuple(out.shape) != (b, h * groups, s, d):
        return None
    return source, groups, chain


def _sdpa_args(node: fx.Node) -> dict[str, object]:
    bound = dict(zip(_SDPA_PARAMS, node.args))
    bound.update(node.kwargs)
    return bound


def run(state: PassState) -> list[Outcome]:
    """The pass: each SDPA call with a constant causal mask (``state.options.causal_mask``) or a short
    query on repeated K/V (``state.options.gqa_attention``) is rewritten, as far as the registry's
    graph rewrites of those names are there; see the module docstring."""
    outcomes: list[Outcome] = []
    graph = state.gm.graph
    causal_on = state.options.causal_mask and state.registry.has_graph_rewrite(CAUSAL_REWRITE)
    gqa_setting = state.options.gqa_attention if state.registry.has_graph_rewrite(GQA_REWRITE) else False
    causal: dict[fx.Node, bool | str] = {}  # mask node -> True, or why it is not a constant causal mask
    repeats: list[list[fx.Node]] = []  # the repeat chains of rewritten calls, erased below if unread
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in SDPA_TARGETS:
            continue
        args = _sdpa_args(node)
        key, value = find_repeat(args.get("key")), find_repeat(args.get("value"))
        if key is None or value is None or key[1] != value[1]:  # both repeated alike, or neither counts
            key = value = None
        location = region_location([node])
        mask = args.get("attn_mask")
        plain = args.get("dropout_p", 0.0) == 0.0 and args.get("is_causal", False) is False \
            and not args.get("enable_gqa", False)
        if causal_on and plain and isinstance(mask, fx.Node):
            if mask not in causal:
                causal[mask] = constant_causal(state.gm, mask)
            if causal[mask] is True:
                _rewrite_causal(node, args, key, value)
                repeats += [key[2], value[2]] if key is not None else []
                outcomes.append(Swapped("function", _CAUSAL_TARGET, location, _CAUSAL_KERNEL, "SDPA call"))
                continue
            if not causal[mask].startswith(_FROM_INPUTS):  # a constant mask, but not one is_causal can stand for
                outcomes.append(Kept("function", _CAUSAL_TARGET, location,
                                     Reason(ReasonKind.DOES_NOT_APPLY, causal[mask]), kernel=_CAUSAL_KERNEL))
            else:
                logger.debug("%s: %s", location, causal[mask])
        if key is None or value is None:
            continue

        def kept(detail: str) -> Kept:
            return Kept("function", _TARGET, location, Reason(ReasonKind.DOES_NOT_APPLY, detail), kernel=_KERNEL)

        query = _value(args.get("query"))
        mask_value = _value(mask)
        if not plain:
            outcomes.append(kept("dropout, is_causal or enable_gqa is set (the kernel has none of them)"))
        elif query is None or query.dim() != 4 or query.shape[1] != _value(key[0]).shape[1] * key[1]:
            outcomes.append(kept("the query's heads are not the repeated key's"))
        elif mask is not None and (mask_value is None or mask_value.requires_grad):
            outcomes.append(kept("the attention mask is not a tensor, or requires grad"))
        elif query.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            outcomes.append(kept(f"the kernel runs on CUDA (or the Triton interpreter), not on {query.device.type}"))
        elif not isinstance(args.get("scale"), (float, int, type(None))):
            outcomes.append(kept(f"the scale is not a constant ({args.get('scale')})"))
        else:
            rewrite, why = should_rewrite(gqa_setting, query.shape[2])
            if not rewrite:  # not a candidate under these options (a prefill, or switched off): not reported
                logger.debug("%s: %s", location, why)
                continue
            failure = _trial(args, key[0], value[0], example_value(node))
            if failure is not None:
                outcomes.append(Kept("function", _TARGET, location, Reason(ReasonKind.KERNEL_FAILED, failure),
                                     kernel=_KERNEL))
                continue
            state.scratch.kernel_calls.add(_rewrite_gqa(node, args, key[0], value[0]))
            repeats += [key[2], value[2]]
            outcomes.append(Swapped("function", _TARGET, location, _KERNEL, "custom op call"))
    if any(isinstance(o, Swapped) for o in outcomes):
        # the repeats and masks nothing reads any more (not graph.eliminate_dead_code: it would also drop
        # in-place updates such as a cache's index_copy_, call_method nodes FX does not know are impure)
        for chain in repeats:
            for repeat in chain:
                if not repeat.users and not is_erased(repeat):  # a chain two calls share is erased once
                    graph.erase_node(repeat)
        for mask, is_causal in causal.items():
            if is_causal is True:
                _erase_unread(graph, mask)
        graph.lint()
        state.gm.recompile()
    return outcomes


def _ancestors(node: fx.Node) -> list[fx.Node]:
    """``node`` and every node it is computed from, in graph order."""
    seen: set[fx.Node] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if n not in seen:
            seen.add(n)
            stack.extend(n.all_input_nodes)
    return [n for n in node.graph.nodes if n in seen]


def constant_causal(gm: fx.GraphModule, mask: fx.Node) -> bool | str:
    """True when ``mask`` depends on no graph input and is the upper-left causal mask of its last two
    dimensions for every leading index (as ``is_causal=True`` applies it); else why not."""
    nodes = _ancestors(mask)
    inputs = [n.name for n in nodes if n.op == "placeholder"]
    if inputs:
        return f"{_FROM_INPUTS} ({', '.join(inputs[:3])})"
    # In-place steps inside the computation are replayed by the copy evaluated below; a step outside it
    # that mutates one of its tensors would make the copy read values the graph never has.
    inside = set(nodes)
    for n in nodes[0].graph.nodes:
        if n not in inside and _in_place(n) and n.args and n.args[0] in inside:
            return f"{n.name} changes a tensor of the mask's computation in place"
    shape = getattr(example_value(mask), "shape", None)
    if shape is not None and all(isinstance(n, int) for n in shape) and math.prod(shape) > MAX_EVALUATED_MASK:
        return f"the mask has {math.prod(shape):,} elements, more than the pass evaluates at compile time"
    sub = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for n in nodes:
        env[n] = sub.node_copy(n, env.__getitem__)
    sub.output(env[mask])
    try:
        with torch.no_grad():
            value = fx.GraphModule(gm, sub)()
    except Exception as e:  # not evaluable at compile time: leave the call alone
        return f"the mask could not be evaluated at compile time: {e!r}"
    if not isinstance(value, torch.Tensor) or value.dim() < 2:
        return "the mask is not a tensor of at least 2 dimensions"
    if value.dtype == torch.bool:
        visible = value
    elif value.is_floating_point() and bool(((value == 0) | (value == float("-inf")) | (value == torch.finfo(value.dtype).min)).all()):
        visible = value == 0
    else:
        return "the mask is neither boolean nor 0 / -inf"
    rows, cols = visible.shape[-2:]
    tril = torch.ones(rows, cols, dtype=torch.bool, device=visible.device).tril()
    if not torch.equal(visible, tril.expand_as(visible)):
        return "the constant mask is not causal (padding, a window, or another pattern)"
    return True


_IN_PLACE_OPERATORS = {operator.iadd, operator.iand, operator.ior, operator.imul, operator.isub, operator.ixor,
                       operator.itruediv, operator.setitem}


def _in_place(node: fx.Node) -> bool:
    """Whether ``node`` writes into its first argument (``x.add_(...)``, ``x &= ...``, ``x[i] = ...``)."""
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    if node.op == "call_method":
        dunder = name.startswith("__") and name.endswith("__")
        return name.startswith("__i") if dunder else name.endswith("_") or name == "__setitem__"
    if node.op == "call_function":
        return node.target in _IN_PLACE_OPERATORS or (name.endswith("_") and not name.startswith("_"))
    return False


def _erase_unread(graph: fx.Graph, node: fx.Node) -> None:
    """Erase ``node`` and what only it read, newest first (pure nodes only: a constant mask's computation)."""
    for n in reversed(_ancestors(node)):
        if not n.users and n.op in ("call_function", "call_method") and not n.is_impure() and not _in_place(n):
            graph.erase_node(n)


def _rewrite_causal(node: fx.Node, args: dict, key: tuple | None, value: tuple | None) -> None:
    """``sdpa(q, k, v, is_causal=True)``, on the unrepeated K/V (``enable_gqa``) where flash attention
    takes grouped heads: fp16/bf16 (in fp32 CUDA runs the memory-efficient kernel, which has no GQA)."""
    graph = node.graph
    query = _value(args["query"])
    grouped = key is not None and query is not None and (
        query.dtype in (torch.float16, torch.bfloat16) or query.device.type == "cpu")
    k, v = (key[0], value[0]) if grouped else (args["key"], args["value"])
    kwargs = {"dropout_p": 0.0, "is_causal": True, "scale": args.get("scale")}
    if grouped:
        kwargs["enable_gqa"] = True
    with graph.inserting_before(node):
        call = graph.call_function(node.target, (args["query"], k, v), kwargs)
    call.meta.update(common_provenance([node]))
    set_example_value(call, example_value(node))
    node.replace_all_uses_with(call)
    graph.erase_node(node)


def _trial(args: dict, key: fx.Node, value: fx.Node, expected: object) -> str | None:
    """Run the kernel on the call's fake inputs: None when it returns SDPA's shape and dtype, else why not."""
    query = _value(args["query"])
    fake_mode = getattr(query, "fake_mode", None)
    if fake_mode is None or not isinstance(expected, torch.Tensor):
        return "the call has no fake values to check the kernel on"
    scale = args.get("scale")
    try:
        with fake_mode:
            got = gqa_attention_call(query, _value(key), _value(value), _value(args.get("attn_mask")),
                                     None if scale is None else float(scale))
    except Exception as e:  # the kernel's own error, shown in the report
        return f"the kernel fails on fake tensors of the call's shapes: {e!r}"
    if got.shape != expected.shape or got.dtype != expected.dtype:
        return (f"the kernel returns {got.dtype}{list(got.shape)} where SDPA returns "
                f"{expected.dtype}{list(expected.shape)}")
    return None


def _rewrite_gqa(node: fx.Node, args: dict, key: fx.Node, value: fx.Node) -> fx.Node:
    graph = node.graph
    scale = args.get("scale")
    call_args = (args["query"], key, value, args.get("attn_mask"), None if scale is None else float(scale))
    with graph.inserting_before(node):
        call = graph.call_function(gqa_attention_call, call_args)
    call.meta.update(common_provenance([node]))
    set_example_value(call, example_value(node))
    node.replace_all_uses_with(call)
    graph.erase_node(node)
    return call
