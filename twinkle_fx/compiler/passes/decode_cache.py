"""The rotary kernel and a static KV cache's writes of a decode step become one kernel call.

transformers' attention at a step with a static cache rotates q and k, then its cache layer writes k and
v into the cache (``StaticCache``: ``keys.index_copy_(2, cache_position, k)``, the same for values).
With the rotary function kernel swapped in (``twinkle_triton.apply_rotary_pos_emb``), the graph holds::

    qk = twinkle.apply_rotary_pos_emb(q, k, cos, sin)
    keys.index_copy_(2, cache_position, qk[1])
    values.index_copy_(2, cache_position, v)
    ... attention(qk[0], keys, values, ...)

three launches that at batch 1 move a few hundred bytes each. After::

    q_rot = twinkle.apply_rotary_pos_emb_to_cache(q, k, v, cos, sin, keys, values, cache_position)
    ... attention(q_rot, keys, values, ...)

one launch (``twinkle_triton.rotary_cache``): the rotary kernel writes k's rows straight into the key
cache and copies v's into the value cache. The match needs both copies along dim 2 at one index, the
key copy of the rotated k read by nothing else, no copy result used, nothing reading the caches between
the two copies, and every reader of the rotated q after them (where the fused call goes).

Where the rotated q goes only to the grouped-query attention over those caches (the ``attention`` pass's
``twinkle.gqa_attention``, which runs before this one) and the index is the cache layer's length counter
(transformers' ``StaticLayer``: ``cache_position = arange(L) + cumulative_length``, then
``cumulative_length.add_(L)``), the attention, the index and the counter's update join the call::

    out = twinkle.rotary_cache_attention(q, k, v, cos, sin, keys, values, mask, scale,
                                         cache_length=cumulative_length)

two launches (``twinkle_triton.rotary_cache_attention``) where there were four: the counter's Inductor
kernel, the rotary cache write, and attention's key splits and their combine. That match also needs nothing
to read the caches between the copies and the attention; the counter's update joins only where nothing but
the index reads the counter (else the call takes ``cache_position=index`` and the graph keeps the update).
Each rewrite is reported as a swapped function region.

Which calls: ``options={"decode_cache": ...}``: ``"auto"`` (the default) rewrites inference graphs on
CUDA where the query has at most :data:`AUTO_MAX_QUERY_LEN` tokens; ``True`` any inference graph, on any
device (the CPU runs the kernel under the Triton interpreter, or its reference); ``False`` none. Training
graphs are never rewritten (the fused kernel has no backward). Removing the registry's graph rewrite
``decode_cache`` turns it off wherever that registry is in effect.
"""

from __future__ import annotations

import logging
import operator
from typing import NamedTuple

import torch
import torch.fx as fx

from ...core.modes import Mode
from ..graph.dynamo import common_provenance, example_value, set_example_value
from ..pipeline import Outcome, PassState, Swapped
from ..regions.region import FunctionKernelCall
from .attention import gqa_attention_call
from .function_patterns import region_location

logger = logging.getLogger(__name__)

__all__ = ["run", "AUTO_MAX_QUERY_LEN", "DECODE_CACHE"]

DECODE_CACHE = "decode_cache"  # its name in the registry
AUTO_MAX_QUERY_LEN = 16  # decode steps (and speculative drafts); a prefill's writes are long enough to stream
_KERNEL = "twinkle_triton.apply_rotary_pos_emb_to_cache"
_ATTENTION_KERNEL = "twinkle_triton.rotary_cache_attention"


class RotaryCacheCall:
    """The graph's call of the kernel: prints as ``twinkle.apply_rotary_pos_emb_to_cache(...)``."""

    __name__ = __qualname__ = "apply_rotary_pos_emb_to_cache"
    __module__ = "twinkle"

    def __call__(self, q, k, v, cos, sin, key_cache, value_cache, cache_position):
        import twinkle_triton

        return twinkle_triton.apply_rotary_pos_emb_to_cache(q, k, v, cos, sin, key_cache, value_cache, cache_position)

    def __repr__(self) -> str:
        return "<twinkle kernel call apply_rotary_pos_emb_to_cache>"


rotary_cache_call = RotaryCacheCall()


class RotaryCacheAttentionCall:
    """The graph's call of the kernel: prints as ``twinkle.rotary_cache_attention(...)``."""

    __name__ = __qualname__ = "rotary_cache_attention"
    __module__ = "twinkle"

    def __call__(self, q, k, v, cos, sin, key_cache, value_cache, attn_mask, scale, *, cache_position=None,
                 cache_length=None):
        import twinkle_triton

        return twinkle_triton.rotary_cache_attention(q, k, v, cos, sin, key_cache, value_cache, attn_mask, scale,
                                                     cache_position=cache_position, cache_length=cache_length)

    def __repr__(self) -> str:
        return "<twinkle kernel call rotary_cache_attention>"


rotary_cache_attention_call = RotaryCacheAttentionCall()


def run(state: PassState) -> list[Outcome]:
    """The pass: see the module docstring."""
    setting = state.options.decode_cache if state.registry.has_graph_rewrite(DECODE_CACHE) else False
    if setting is False or Mode.TRAINING in state.mode:
        return []
    graph = state.gm.graph
    order = {n: i for i, n in enumerate(graph.nodes)}
    outcomes: list[Outcome] = []
    for node in list(graph.nodes):
        match = _match(node, order)
        if match is None:
            continue
        q = node.args[0]  # the rotary call's q
        qv = example_value(q) if isinstance(q, fx.Node) else None
        if setting == "auto" and (qv is None or qv.device.type != "cuda" or qv.shape[2] > AUTO_MAX_QUERY_LEN):
            continue
        attention = _attention_match(match, order)
        outcomes.append(_rewrite(match) if attention is None else _rewrite_with_attention(match, attention))
    if outcomes:
        graph.lint()
        state.gm.recompile()
        logger.info("decode_cache: %d rotary + cache write(s) now call one kernel each", len(outcomes))
    return outcomes


def _is_rotary(node: fx.Node) -> bool:
    """``node`` calls the built-in rotate_half rotary kernel on (q, k, cos, sin) with ``unsqueeze_dim=1``."""
    call = node.target
    if node.op != "call_function" or not isinstance(call, FunctionKernelCall) or node.kwargs:
        return False
    from twinkle_triton.rotary import apply_rotary_pos_emb  # imported when a graph is rewritten

    return (call.kernel is apply_rotary_pos_emb and call.arg_names == ("q", "k", "cos", "sin")
            and call.constants.get("unsqueeze_dim", 1) == 1 and tuple(call.picks) == (0, 1) and len(node.args) == 4)


def _index_copy(node: fx.Node) -> tuple[fx.Node, fx.Node, fx.Node] | None:
    """(cache, index, source) of ``cache.index_copy_(2, index, source)`` whose result nobody reads."""
    if node.op != "call_method" or node.target != "index_copy_" or node.kwargs or len(node.args) != 4 or node.users:
        return None
    cache, dim, index, source = node.args
    cv = example_value(cache) if isinstance(cache, fx.Node) else None
    if dim not in (2, -2) or cv is None or cv.dim() != 4 or not isinstance(index, fx.Node):
        return None
    return cache, index, source


def _pieces(rotary: fx.Node) -> tuple[fx.Node, fx.Node] | None:
    """(rotated q, rotated k): the ``[0]`` and ``[1]`` items of the rotary call, its only readers."""
    items = {}
    for user in rotary.users:
        if user.op != "call_function" or user.target is not operator.getitem or user.args[1] not in (0, 1):
            return None
        items[user.args[1]] = user
    return (items[0], items[1]) if len(items) == 2 and len(rotary.users) == 2 else None


class _Match(NamedTuple):
    rotary: fx.Node
    q_rot: fx.Node  # the rotary call's [0]
    k_rot: fx.Node  # its [1], read only by the key copy
    key_copy: fx.Node  # keys.index_copy_(2, index, k_rot)
    value_copy: fx.Node  # values.index_copy_(2, index, v)
    last: fx.Node  # the later of the two copies: where the fused call goes
    keys: fx.Node
    values: fx.Node
    index: fx.Node
    v: fx.Node


def _match(rotary: fx.Node, order: dict[fx.Node, int]) -> _Match | None:
    """The rotary call and the cache write it feeds, if ``rotary`` is one."""
    if not _is_rotary(rotary):
        return None
    pieces = _pieces(rotary)
    if pieces is None or len(pieces[1].users) != 1:
        return None
    q_rot, k_rot = pieces
    key_copy = next(iter(k_rot.users))
    parsed = _index_copy(key_copy)
    if parsed is None or parsed[2] is not k_rot:
        return None
    keys, index, _ = parsed
    k_value = example_value(k_rot)
    for value_copy in index.users:
        other = _index_copy(value_copy) if value_copy is not key_copy else None
        if other is None or other[0] is keys or not isinstance(other[2], fx.Node):
            continue
        vv, cv = example_value(other[2]), example_value(other[0])
        if vv is None or vv.shape != k_value.shape or vv.dtype != k_value.dtype or cv.dtype != k_value.dtype:
            continue
        first, last = sorted((key_copy, value_copy), key=order.__getitem__)
        # the fused call goes where the later copy was: nothing may read the caches in between, and every
        # reader of the rotated q must come after
        between = [u for cache in (keys, other[0]) for u in cache.users
                   if u not in (key_copy, value_copy) and order[first] < order[u] <= order[last]]
        if not between and all(order[user] > order[last] for user in q_rot.users):
            return _Match(rotary, q_rot, k_rot, key_copy, value_copy, last, keys, other[0], index, other[2])
    return None


def _rewrite(m: _Match) -> Swapped:
    graph = m.rotary.graph
    q, k, cos, sin = m.rotary.args
    with graph.inserting_after(m.last):
        call = graph.call_function(rotary_cache_call, (q, k, m.v, cos, sin, m.keys, m.values, m.index))
    replaced = [m.rotary, m.key_copy, m.value_copy]
    call.meta.update(common_provenance(replaced))
    set_example_value(call, example_value(m.q_rot))
    location = region_location(replaced)
    m.q_rot.replace_all_uses_with(call)
    for node in (m.key_copy, m.value_copy, m.q_rot, m.k_rot, m.rotary):
        graph.erase_node(node)
    length = example_value(q).shape[2]
    return Swapped("function", f"rotary + KV cache write of {length} token(s)", location, _KERNEL,
                   "one launch: k and v written into the caches by the rotary kernel")


class _AttentionMatch(NamedTuple):
    attention: fx.Node  # twinkle.gqa_attention(q_rot, keys, values, mask, scale): where the fused call goes
    counter: tuple[fx.Node, fx.Node, fx.Node] | None  # (the cache layer's length, arange(L), length.add_(L))


def _attention_match(m: _Match, order: dict[fx.Node, int]) -> _AttentionMatch | None:
    """The grouped-query attention over ``m``'s caches that reads its rotated q, if it may move there, and the
    length counter its index comes from, if the counter's update may move there too (module docstring)."""
    users = list(m.q_rot.users)
    attention = users[0] if len(users) == 1 else None
    if attention is None or attention.target is not gqa_attention_call or attention.kwargs \
            or len(attention.args) != 5 or tuple(attention.args[:3]) != (m.q_rot, m.keys, m.values):
        return None
    # the caches are written at the attention now: nothing may read them in between
    if any(u is not attention and order[m.last] < order[u] < order[attention]
           for cache in (m.keys, m.values) for u in cache.users):
        return None
    counted = _counter_index(m.index, example_value(m.k_rot).shape[2])
    if counted is not None:
        counter, arange, update = counted
        # The update moves into the kernel only where nothing else reads the counter: a value computed from it
        # before the update (layer 0's positions and mask) may be recomputed by Inductor after the kernel, which
        # mutates it in place. Then the kernel takes the index as it is and the graph keeps the update.
        if set(counter.users) != {m.index, update} or set(m.index.users) != {m.key_copy, m.value_copy} \
                or list(arange.users) != [m.index] or not order[m.index] < order[update] < order[attention]:
            counted = None
    return _AttentionMatch(attention, counted)


def _counter_index(index: fx.Node, length: int) -> tuple[fx.Node, fx.Node, fx.Node] | None:
    """(counter, arange, update) where ``index`` is ``arange(length) + counter`` (either order) and the graph
    advances the counter by ``counter.add_(length)``, whose result nobody reads."""
    if index.op != "call_function" or index.target is not operator.add or len(index.args) != 2 or index.kwargs:
        return None
    for arange, counter in (index.args, reversed(index.args)):
        if not (isinstance(arange, fx.Node) and isinstance(counter, fx.Node)):
            return None
        if arange.op != "call_function" or arange.target is not torch.arange or tuple(arange.args) != (length,) \
                or set(arange.kwargs) - {"device"}:
            continue
        value = example_value(counter)
        if not isinstance(value, torch.Tensor) or value.dim() != 0 or value.is_floating_point():
            continue
        for update in counter.users:
            if update.op == "call_method" and update.target == "add_" and tuple(update.args) == (counter, length) \
                    and not update.kwargs and not update.users:
                return counter, arange, update
    return None


def _rewrite_with_attention(m: _Match, a: _AttentionMatch) -> Swapped:
    graph = m.rotary.graph
    q, k, cos, sin = m.rotary.args
    mask, scale = a.attention.args[3:]
    rows = {"cache_position": m.index} if a.counter is None else {"cache_length": a.counter[0]}
    with graph.inserting_before(a.attention):
        call = graph.call_function(rotary_cache_attention_call, (q, k, m.v, cos, sin, m.keys, m.values, mask, scale),
                                   rows)
    replaced = [m.rotary, m.key_copy, m.value_copy, a.attention]
    call.meta.update(common_provenance(replaced))
    set_example_value(call, example_value(a.attention))
    location = region_location(replaced)
    a.attention.replace_all_uses_with(call)
    for node in (a.attention, m.key_copy, m.value_copy, m.q_rot, m.k_rot, m.rotary):
        graph.erase_node(node)
    if a.counter is not None:
        _, arange, update = a.counter
        for node in (m.index, arange, update):
            graph.erase_node(node)
    length = example_value(q).shape[2]
    counter = "; the combine of its key splits advances the cache length" if a.counter is not None else ""
    return Swapped("function", f"rotary + KV cache write + attention of {length} token(s)", location,
                   _ATTENTION_KERNEL, f"two launches: the attention kernel rotates q and k and writes k and v into "
                   f"the caches{counter}")
