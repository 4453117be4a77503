"""A sum of matrix products as one chain of GEMMs that accumulate: ``twinkle_fx::matmul_sum``.

A layer input read by several linears gets the sum of their input gradients. In a decoder layer's backward graph
that is q, k and v's, and gate and up's::

    dx = mm(dq, wq) + mm(dk, wk) + mm(dv, wv)          # three GEMMs, then a kernel reading three products

Inductor runs each GEMM on its own (cuBLAS) and adds the products in one more kernel, which reads every product and
writes the sum: at Llama-3.2-1B's shape (4096 tokens x 2048, bf16) 67 MB for q/k/v's, about 15 us a layer. After
this rewrite::

    dx = twinkle_fx.matmul_sum([dq, dk, dv], [wq, wk, wv])

the first GEMM writes its product and each next one adds its own into it (cuBLAS's ``beta = 1`` epilogue,
``Tensor.addmm_``), reading the running sum where it writes it: the add kernel's passes are gone, the GEMMs read
one product each more. Timed alone (one H200, CUDA-graph replays; docs/performance.md has the table): q/k/v's 97
-> 81 us at Llama-3.2-1B, 204 -> 183 at Llama-3.2-3B, 37 -> 31 at Qwen2-0.5B; gate/up's 110 -> 105 at Qwen2-0.5B,
601 -> 590 at Llama-3.2-3B, and 352 -> 362-378 at Llama-3.2-1B (replays back to back at the power cap; profiled
once, the accumulating GEMM took as long as the plain one). In the training step the device time a step fell by
0.43 ms at Qwen2-0.5B and 0.80 ms at Llama-3.2-1B.

The products are summed in the order of their inner dimension, the largest first (its GEMM writes, the smaller
ones accumulate); each GEMM rounds the running sum once to the dtype: n roundings for n products, where the add of
the rounded products makes n + 1.

Rewritten: a tree of ``aten.add.Tensor`` (no ``alpha``, no broadcasting, one dtype) whose leaves are all products
``aten.mm`` of one shape (or views of them: the graph reshapes the tokens' dimensions), each read only by the
sum, and whose result only opaque ops read (a custom op such as the swapped norms' backward, an extern GEMM, the
graph's output): where an Inductor kernel reads it, Inductor fuses the add into that kernel, and the rewrite would
only move the reads into the GEMMs. Left alone: sums with any other term, and graphs on the CPU outside Triton's
interpreter (nothing was measured there; under the interpreter the tests take the GPU's graphs). The backend runs
it on every graph (:mod:`.post_grad`) unless ``options={"matmul_sums": False}`` or the registry's graph rewrite
``matmul_sums`` is removed.
"""

from __future__ import annotations

import functools
import logging
import os
import sys

import torch
import torch.fx as fx
from torch import Tensor

from ...core.torch_internals import is_higher_order_op, known_equal, op_namespace
from .post_grad import PostGradRewrite, call, erase_unused, fake_mode_of, on_kernel_device, source_uuid, value

logger = logging.getLogger(__name__)

__all__ = ["MATMUL_SUMS", "REWRITE", "matmul_sum", "rewrite_matmul_sums"]

MATMUL_SUMS = "matmul_sums"  # its name in the registry

_aten = torch.ops.aten
_VIEWS = (_aten.view.default, _aten.reshape.default, _aten._unsafe_view.default)
# ops whose inputs Inductor materialises as they are: an add read only by these is a kernel of its own
_EXTERN = (_aten.mm.default, _aten.addmm.default, _aten.bmm.default, _aten.baddbmm.default)


# --------------------------------------------------------------------------------------------- the op


@torch.library.custom_op("twinkle_fx::matmul_sum", mutates_args=())
def _matmul_sum(a: list[Tensor], b: list[Tensor]) -> Tensor:
    out = torch.mm(a[0], b[0])
    for left, right in zip(a[1:], b[1:]):
        out.addmm_(left, right)  # beta = 1: cuBLAS reads the running sum in its epilogue and writes it in place
    return out


@_matmul_sum.register_fake
def _matmul_sum_fake(a: list[Tensor], b: list[Tensor]) -> Tensor:
    return a[0].new_empty((a[0].shape[0], b[0].shape[1]))


def _setup_context(ctx, inputs, output) -> None:
    a, b = inputs
    ctx.n = len(a)
    ctx.save_for_backward(*a, *b)


def _backward(ctx, grad: Tensor):
    saved = ctx.saved_tensors
    a, b = saved[:ctx.n], saved[ctx.n:]
    grad_a = [grad @ right.mT if ctx.needs_input_grad[0] else None for right in b]
    grad_b = [left.mT @ grad if ctx.needs_input_grad[1] else None for left in a]
    return grad_a, grad_b


_matmul_sum.register_autograd(_backward, setup_context=_setup_context)


def matmul_sum(a: list[Tensor], b: list[Tensor]) -> Tensor:
    """``sum(a[i] @ b[i])`` of 2-D matrices of one dtype and device: the first product written by a GEMM, each
    next one added into it by a GEMM that accumulates (``beta = 1``), with no kernel of its own for the sum.
    Differentiable.

    Raises:
        ValueError: no products, ``a`` and ``b`` of different lengths, a matrix that is not 2-D, inner
            dimensions that differ, or products of different shapes (the message names the pair).
        TypeError: dtypes or devices that differ.

    Examples:
        >>> a, b = [torch.ones(3, 4), torch.ones(3, 2)], [torch.ones(4, 5), torch.ones(2, 5)]
        >>> matmul_sum(a, b)[0].tolist()
        [6.0, 6.0, 6.0, 6.0, 6.0]
    """
    _check(a, b)
    return _matmul_sum(list(a), list(b))


def _check(a, b) -> None:
    if len(a) != len(b) or not a:
        raise ValueError(f"matmul_sum: a has {len(a)} matrices and b {len(b)}; pass the same number, at least one.")
    shape = None
    for i, (left, right) in enumerate(zip(a, b)):
        for name, t in ((f"a[{i}]", left), (f"b[{i}]", right)):
            if not isinstance(t, Tensor) or t.dim() != 2:
                raise ValueError(f"matmul_sum: {name} is not a 2-D tensor ({getattr(t, 'shape', type(t))}); "
                                 "reshape it to (rows, columns).")
            if t.dtype != a[0].dtype or t.device != a[0].device:
                raise TypeError(f"matmul_sum: {name} is {t.dtype} on {t.device}, a[0] {a[0].dtype} on "
                                f"{a[0].device}; pass one dtype and device.")
        if left.shape[1] != right.shape[0]:
            raise ValueError(f"matmul_sum: a[{i}] {tuple(left.shape)} @ b[{i}] {tuple(right.shape)}: inner "
                             "dimensions differ.")
        product = (left.shape[0], right.shape[1])
        if shape is not None and product != shape:
            raise ValueError(f"matmul_sum: a[{i}] @ b[{i}] is {product}, a[0] @ b[0] {shape}; the products must "
                             "have one shape.")
        shape = product


# --------------------------------------------------------------------------------------------- the rewrite


def rewrite_matmul_sums(graph: fx.Graph) -> int:
    """Rewrite every sum of products of ``graph`` that qualifies (see the module docstring) in place and return
    how many; the caller recompiles its module. Logged at INFO."""
    fake_mode, rewritten = None, 0
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    # a sum the loop rewrites erases only nodes before it (its terms), which the loop has passed
    for node in list(graph.nodes):
        if not _is_sum(node) or _folded_into_a_larger_sum(node) or not on_kernel_device(node, interpreted) \
                or not all(map(_opaque, node.users)):
            continue
        products = _products(node)
        if products is None:
            continue
        if fake_mode is None:
            fake_mode = fake_mode_of(graph) or False
        _rewrite(graph, node, products, fake_mode or None)
        rewritten += 1
    if rewritten:
        graph.lint()
        logger.info("matmul_sums: %d sum(s) of matrix products as GEMMs that accumulate (twinkle_fx::matmul_sum)",
                    rewritten)
    return rewritten


def _is_sum(node: fx.Node) -> bool:
    return (node.op == "call_function" and node.target is _aten.add.Tensor and len(node.args) == 2
            and not node.kwargs and all(isinstance(a, fx.Node) for a in node.args))


def _folded_into_a_larger_sum(node: fx.Node) -> bool:
    """Whether ``node`` is a term of the sum that reads it (that sum is the one rewritten)."""
    return len(node.users) == 1 and _is_sum(next(iter(node.users))) and _same_type(node, next(iter(node.users)))


def _products(root: fx.Node) -> list[fx.Node] | None:
    """The ``aten.mm`` nodes whose products ``root`` adds, largest inner dimension first; None unless every term
    is such a product (or a view of one) of one shape, read only by the sum."""
    terms, stack = [], [root]
    while stack:
        node = stack.pop()
        if _is_sum(node) and (node is root or len(node.users) == 1) and _same_type(node, root):
            stack.extend(reversed(node.args))
        else:
            terms.append(node)
    products = []
    for term in terms:
        if not _same_type(term, root) or len(term.users) != 1:
            return None
        mm = term.args[0] if term.target in _VIEWS else term
        if mm.target is not _aten.mm.default or len(mm.users) != 1:
            return None
        products.append(mm)
    shape = value(products[0]).shape
    if len(products) < 2 or not all(_same_shape(value(mm).shape, shape) for mm in products) \
            or not known_equal(shape[0] * shape[1], value(root).numel()):
        return None
    # a symbolic inner dimension keeps the graph's order
    return sorted(products, key=lambda mm: -_static(value(mm.args[0]).shape[1]))


def _static(size) -> int:
    return size if isinstance(size, int) else 0


def _same_shape(a, b) -> bool:
    """Equal for every size the graph may take (dynamic shapes: sizes are SymInts, compared without a guard)."""
    return len(a) == len(b) and all(known_equal(x, y) for x, y in zip(a, b))


def _same_type(a: fx.Node, b: fx.Node) -> bool:
    va, vb = value(a), value(b)
    return (isinstance(va, Tensor) and isinstance(vb, Tensor) and _same_shape(va.shape, vb.shape)
            and va.dtype == vb.dtype and va.device == vb.device)


def _opaque(user: fx.Node) -> bool:
    """Whether ``user`` reads its inputs as Inductor materialises them (no fusion of an add into it): the graph's
    output, a custom op, a higher-order op (a ``triton_op``'s kernel launches, as AOTAutograd traces them), an
    extern GEMM, or a view only such users read."""
    if user.op == "output":
        return True
    if user.op != "call_function":
        return False
    if user.target in _VIEWS:
        return all(map(_opaque, user.users))
    if is_higher_order_op(user.target) or user.target in _EXTERN:
        return True
    return op_namespace(user.target) not in (None, "aten", "prims")


def _rewrite(graph: fx.Graph, root: fx.Node, products: list[fx.Node], fake_mode) -> None:
    # the terms' view of their product to the sum's shape, whose size arguments are the graph's own (symbolic
    # sizes are nodes there); none when the products have the sum's shape
    view = next((user for mm in products for user in mm.users if user.target in _VIEWS), None)
    with graph.inserting_before(root):
        total = call(graph, fake_mode, torch.ops.twinkle_fx.matmul_sum.default,
                     ([mm.args[0] for mm in products], [mm.args[1] for mm in products]))
        if view is not None:
            total = call(graph, fake_mode, _aten.view.default, (total, view.args[1]))
    root.replace_all_uses_with(total)
    erase_unused(graph, root, lambda n: _is_sum(n) or n.target in _VIEWS or n.target is _aten.mm.default)


def _uuid() -> str:
    return source_uuid("twinkle_fx.matmul_sums", sys.modules[__name__])


REWRITE = PostGradRewrite(MATMUL_SUMS, rewrite_matmul_sums, functools.cache(_uuid))
