"""A top-k over a short last dimension (a mixture-of-experts router's) in one kernel of ours.

Inductor has no lowering for ``aten.topk``: it runs torch's kernels, a radix selection and a sort (32.9 us a call for
4096 tokens of 128 experts, each Qwen3-30B-A3B layer's router, replayed in a CUDA graph on an H200; the kernel 6.7)::

    weights, experts = aten.topk(router_probs, 8)             # before: two torch kernels
    weights, experts = twinkle.topk(router_probs, 8)          # after: one Triton kernel

The rewrite takes an ``aten.topk`` of the largest values (sorted or not: the op's are sorted) along the last
dimension of a float16, bfloat16 or float32 tensor on a GPU, rows of at most ``twinkle_triton.topk.MAX_ROW``
elements and ``k`` up to ``MAX_K``; the values are the same, the indices too where a row's values differ (among
equal values the op takes the lower index first, which torch's kernel does not promise). The backward graph AOTAutograd
traced reads only the indices, whichever kernel chose them.

The backend runs it on every graph (:mod:`.post_grad`) when ``options={"topk": True}`` asks for it (and the registry's
graph rewrite ``topk`` is in place). It is off by default: where a row's values tie, the kernel and torch's choose
different indices (torch's choice is unspecified, and not the same on the CPU and a GPU), and a router whose weights
start at zero scores every expert alike, so the compiled model would route its tokens to other experts than the
uncompiled one.
"""

from __future__ import annotations

import functools
import logging
import sys

import torch
import torch.fx as fx

from .post_grad import PostGradRewrite, fake_mode_of, kernel_module, on_kernel_device, source_uuid
from .post_grad import call as call_node
from .post_grad import value as _val

logger = logging.getLogger(__name__)

__all__ = ["TOPK", "REWRITE", "rewrite_topk"]

TOPK = "topk"  # its name in the registry


def rewrite_topk(graph: fx.Graph) -> int:
    """Replace every ``aten.topk`` the kernel takes (see the module docstring) by ``twinkle::topk`` and return how
    many; the caller recompiles its module. Logged at INFO."""
    module = _kernel_module()
    if module is None:
        return 0
    fake_mode, rewritten = None, 0
    for node in graph.find_nodes(op="call_function", target=torch.ops.aten.topk.default):
        arguments = _arguments(node, module)
        if arguments is None:
            continue
        if fake_mode is None:  # the graph's fake tensors, once
            fake_mode = fake_mode_of(graph) or False
        with graph.inserting_before(node):
            replacement = call_node(graph, fake_mode or None, torch.ops.twinkle.topk.default, arguments)
        node.replace_all_uses_with(replacement)
        graph.erase_node(node)
        rewritten += 1
    if rewritten:
        graph.lint()
        logger.info("topk: %d top-k selection(s) run as twinkle_triton.topk", rewritten)
    return rewritten


def _arguments(node: fx.Node, module) -> tuple[fx.Node, int] | None:
    """``(x, k)`` when ``node`` is ``aten.topk(x, k, dim, largest, sorted)`` the kernel takes: the largest values
    along the last dimension, ``x`` on the kernels' device in a dtype they take with rows of at most ``MAX_ROW``,
    ``k`` a number up to ``MAX_K``; else None."""
    from twinkle_triton._library import KERNELS_RUN_ON_CPU

    names = ("self", "k", "dim", "largest", "sorted")
    given = {**dict(zip(names, node.args)), **node.kwargs}
    x, k = given.get("self"), given.get("k")
    dim, largest = given.get("dim", -1), given.get("largest", True)
    t = _val(x) if isinstance(x, fx.Node) else None
    if not isinstance(t, torch.Tensor) or not isinstance(k, int) or largest is not True or not isinstance(dim, int):
        return None
    if t.dim() == 0 or dim not in (-1, t.dim() - 1) or t.dtype not in module.DTYPES:
        return None
    row = t.shape[-1]
    if not isinstance(row, int) or row > module.MAX_ROW or not 0 <= k <= min(module.MAX_K, row):
        return None
    return (x, k) if on_kernel_device(x, KERNELS_RUN_ON_CPU) else None


def _uuid() -> str:
    """This rewrite's and its kernel's source, hashed: a change to either is a new cache key."""
    return source_uuid("twinkle_fx.topk", sys.modules[__name__], _kernel_module())


def _kernel_module():
    """``twinkle_triton.topk`` (importing it defines ``twinkle::topk``), or None where the kernels do not import."""
    return kernel_module(TOPK, "twinkle_triton.topk")


REWRITE = PostGradRewrite(TOPK, rewrite_topk, functools.cache(_uuid))
