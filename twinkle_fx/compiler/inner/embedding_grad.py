"""The embedding's weight gradient in a backward graph: the rows it changes, not a dense table.

AOTAutograd's backward graph computes an embedding's weight gradient as a dense table,
``embedding_dense_backward(grad, indices, num_embeddings, padding_idx, False)``, which Inductor
decomposes into an fp32 ``[num_embeddings, hidden]`` buffer of zeros, an accumulating index-put of
every token's gradient row, and a cast to the weight's dtype. With tied embeddings (Llama-3.2, Qwen2
small models, Gemma) the weight is also the LM head's, and one more kernel adds the two gradients::

    head_grad = ...                                   # the LM head's (the fused loss's) weight gradient
    table = embedding_dense_backward(grad, ids, V, padding_idx, False)
    weight_grad = head_grad + table

After this rewrite::

    sums, slot = twinkle_triton.embedding_grad_sums(ids, grad, mask, V)   # [tokens, hidden] fp32, [V]
    weight_grad = (head_grad.float() + sums[slot.clamp(min=0)] * (slot >= 0)[:, None]).to(head_grad.dtype)

The op sums each looked-up row's tokens (tens of MB); the gather of those sums through ``slot`` is
pointwise, so Inductor fuses it into the one kernel that writes the weight's gradient, together with
what computes the head's gradient (the fused loss scales its saved gradient by the loss's there). No
vocabulary-sized buffer is zeroed or read besides the head's gradient. An untied embedding gets the
same without the head's term. Measured on one H200 at Llama-3.2-1B's shape (vocabulary 128,256 x
2048, 4096 tokens, bf16), the dense table and the add took 0.73 ms a training step (224 us zeroing the
fp32 buffer, 32 us scattering, 475 us casting and adding) for 16 MB of gradient rows.

Where the head's gradient is a buffer the backward owns, scaled, the add goes into it in place::

    weight_grad = saved_head_grad * grad_loss + gathered_sums              # before
    twinkle_triton.add_embedding_grad(saved_head_grad, grad_loss, sums, slot)  # after; weight_grad is that buffer

The fused loss computes its weight gradient in the forward and saves it; the backward scales it by the
loss's gradient. When AOTAutograd donates that saved tensor to the backward (read once: not with
``retain_graph=True``), the op scales it and adds the looked-up rows' sums where it lies, reading the
scale on the device: with a scale of 1 (a loss backpropagated as it is) only the looked-up rows are read
and written, and the vocabulary-sized pass that wrote the weight's gradient (0.26 ms a step at
Llama-3.2-1B's shape on an H200) is gone; with any other scale every row is scaled in the same pass.

Each row's tokens are summed in fp32 and the row rounded once, after adding the head's gradient: the
dense path rounds the table and then the sum, so results agree within one rounding. Sums of duplicate
indices are deterministic (a stable sort; see ``twinkle_triton.embedding_grad``), where Inductor's
index-put accumulates with atomics.

Rewritten: ``aten.embedding_dense_backward`` (graphs for ``aot_eager``) and Inductor's decomposition
of it (``_unsafe_masked_index_put_accumulate`` of rows into a ``full`` of zeros, then a cast; in torch
2.11 an accumulating ``_unsafe_index_put`` of rows a ``where`` zeroed at the padding index); left
alone: ``scale_grad_by_freq=True``, a sum of two dtypes, devices the kernel does not run on. The
backend runs it on every graph (:mod:`.post_grad`; only backward graphs hold the dense gradient), unless
``options={"embedding_grad": False}`` or the registry's graph rewrite ``embedding_grad`` is removed. Under
``aot_eager`` the gather and the add run as separate eager ops (fp32 temporaries of the table's size): that path
checks the numbers; Inductor's is the fast one.
"""

from __future__ import annotations

import functools
import logging
import operator
import sys
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from .post_grad import (PostGradRewrite, donated_scaled_input, erase_unused, fake_mode_of, kernel_module,
                        on_kernel_device, source_uuid)
from .post_grad import call as call_node
from .post_grad import value as _val

logger = logging.getLogger(__name__)

__all__ = ["EMBEDDING_GRAD", "REWRITE", "rewrite_embedding_grads"]

EMBEDDING_GRAD = "embedding_grad"  # its name in the registry

_aten = torch.ops.aten
_CONVERT = torch.ops.prims.convert_element_type.default
# the ops of the dense gradient the rewrite replaces, erased once nothing reads them
_DENSE_PATH = (_aten.embedding_dense_backward.default, _aten._unsafe_masked_index_put_accumulate.default,
               _aten._unsafe_index_put.default, _aten.index_put.default, _aten.where.self, _aten.full.default,
               _aten.add.Tensor, _CONVERT)


@dataclass
class _DenseGrad:
    """An embedding's dense weight gradient found in the graph: ``table`` is the node whose value it is."""

    table: fx.Node
    indices: fx.Node
    grad: fx.Node
    mask: fx.Node | None  # a bool node, or None
    padding_idx: int  # for embedding_dense_backward: a mask to build; -1 for none
    mask_drops: bool = False  # the mask is True for the tokens to leave out (the kernel's keeps them)


def rewrite_embedding_grads(graph: fx.Graph) -> int:
    """Rewrite every dense embedding weight gradient of ``graph`` in place (see the module docstring) and
    return how many; the caller recompiles its module. Logged at INFO."""
    if _kernel_module() is None:
        return 0
    fake_mode = None
    rewritten = in_place = 0
    for node in list(graph.nodes):
        if getattr(node, "_erased", False):  # a node an earlier rewrite in this loop erased
            continue
        found = _dense_grad(node)
        if found is None or not _runs_kernels(found.table):
            continue
        if fake_mode is None:  # the graph's fake tensors, once: the new nodes' values are computed under it
            fake_mode = fake_mode_of(graph) or False
        in_place += _rewrite(graph, found, fake_mode or None)
        rewritten += 1
    if rewritten:
        graph.lint()
        logger.info("embedding_grad: %d embedding weight gradient(s) of a backward graph from the looked-up rows' "
                    "sums, %d added in place to a tied head's gradient\n(twinkle_triton.embedding_grad_sums, "
                    "twinkle_triton.add_embedding_grad)", rewritten, in_place)
    return rewritten


def _uuid() -> str:
    """This rewrite's and its kernel's source, hashed: a change to either is a new cache key."""
    return source_uuid("twinkle_fx.embedding_grad", sys.modules[__name__], _kernel_module())


def _kernel_module():
    """``twinkle_triton.embedding_grad`` (importing it defines ``twinkle::embedding_grad_sums``), or None where
    the kernels do not import."""
    return kernel_module(EMBEDDING_GRAD, "twinkle_triton.embedding_grad")


def _runs_kernels(node: fx.Node) -> bool:
    """Whether the kernel runs where ``node`` lives; elsewhere the op would run its dense reference, no gain."""
    from twinkle_triton._library import KERNELS_RUN_ON_CPU

    return on_kernel_device(node, KERNELS_RUN_ON_CPU)


def _dense_grad(node: fx.Node) -> _DenseGrad | None:
    if node.op != "call_function":
        return None
    if node.target is _aten.embedding_dense_backward.default:
        grad, indices, _, padding_idx, scale_by_freq = node.args[:5]
        if scale_by_freq:
            return None
        return _DenseGrad(node, indices, grad, None, int(padding_idx))
    if node.target is _aten._unsafe_masked_index_put_accumulate.default:
        zeros, mask, indices, values = node.args
        dropped = None
    elif node.target in (_aten._unsafe_index_put.default, _aten.index_put.default) and len(node.args) == 4 \
            and node.args[3] is True:
        # torch 2.11 decomposes without a mask: the padding tokens' rows zeroed by a where, then an
        # accumulating index-put (negative indices count from the end; the kernel does the same)
        (zeros, indices, values, _), mask, dropped = node.args, None, _padding_where(node.args[2])
        if dropped is not None:
            values, mask = dropped.args[2], dropped.args[0]
    else:
        return None
    if not (_is_zeros(zeros) and len(zeros.users) == 1 and len(indices) == 1 and isinstance(indices[0], fx.Node)):
        return None
    index_shape, value, mask_value = _shape(indices[0]), _val(values), _val(mask)
    # rows of the table's width, one per index, and one mask entry per index: the embedding's gradient
    if index_shape is None or value is None or tuple(value.shape) != (*index_shape, _val(zeros).shape[1]):
        return None
    if mask is not None and (mask_value is None or mask_value.dtype != torch.bool
                             or tuple(mask_value.shape) not in (index_shape, (*index_shape, 1))):
        return None
    # the decomposition casts the gradient to fp32 first; the kernel reads it as it is and sums in fp32
    if isinstance(values, fx.Node) and values.target is _CONVERT and len(values.users) == 1 \
            and _dtype(values.args[0]) in (torch.bfloat16, torch.float16):
        values = values.args[0]
    table = node
    if len(node.users) == 1 and (cast := next(iter(node.users))).target is _CONVERT:
        table = cast
    return _DenseGrad(table, indices[0], values, mask, -1, mask_drops=dropped is not None)


def _padding_where(values) -> fx.Node | None:
    """``where(mask, 0, rows)`` (a ``masked_fill`` of the rows of ``mask``'s tokens), or None."""
    if not (isinstance(values, fx.Node) and values.target is _aten.where.self and len(values.users) == 1):
        return None
    zero = values.args[1]
    if not isinstance(zero, fx.Node) or _shape(zero) != ():
        return None
    if (zero.target is _aten.scalar_tensor.default and zero.args[0] == 0) \
            or (zero.target is _aten.full.default and zero.args[1] == 0):
        return values
    return None


def _is_zeros(node) -> bool:
    return (isinstance(node, fx.Node) and node.target is _aten.full.default and node.args[1] == 0
            and _val(node) is not None and _val(node).dim() == 2)


def _rewrite(graph: fx.Graph, found: _DenseGrad, fake_mode: Any) -> bool:
    """Replace ``found`` (and a tied head's add) in ``graph``; whether the sums went in place into the head's
    gradient."""
    table = found.table
    val = _val(table)
    target, head = table, None
    if len(table.users) == 1:  # tied: the head's gradient plus this table
        add = next(iter(table.users))
        if add.target is _aten.add.Tensor and not add.kwargs and len(add.args) == 2:
            other = add.args[1] if add.args[0] is table else add.args[0]
            if isinstance(other, fx.Node) and _same_tensor_type(other, table) and other is not table:
                target, head = add, other

    def call(op, *args) -> fx.Node:
        return call_node(graph, fake_mode, op, args)

    owned = _owned_scaled_gradient(head) if head is not None else None
    with graph.inserting_before(target):
        mask = found.mask
        if mask is not None and found.mask_drops:
            mask = call(_aten.logical_not.default, mask)
        if mask is None and found.padding_idx >= 0:
            mask = call(_aten.ne.Scalar, found.indices, found.padding_idx)
        pair = call(torch.ops.twinkle.embedding_grad_sums.default, found.indices, found.grad, mask, val.shape[0])
        sums, slot = call(operator.getitem, pair, 0), call(operator.getitem, pair, 1)
        if owned is not None:
            # the head's gradient is a buffer the backward may overwrite: scaled and the rows added in place
            # (only the looked-up rows touched when the scale is 1), and that buffer is the weight's gradient
            buffer, scale = owned
            call(torch.ops.twinkle.add_embedding_grad.default, buffer, scale, sums, slot)
            target.replace_all_uses_with(buffer)
            erase_unused(graph, target, lambda n: n.target in _DENSE_PATH or n is head)
            return True
        # each row's sum gathered through its slot, zero where no token looked it up: pointwise ops Inductor fuses
        # into the kernel that writes the result, with the head's gradient and whatever computes it
        gathered = call(_aten.index.Tensor, sums, [call(_aten.clamp_min.default, slot, 0)])
        looked_up = call(_aten.unsqueeze.default, call(_aten.ge.Scalar, slot, 0), 1)
        out = call(_aten.mul.Tensor, gathered, looked_up)  # fp32
        if head is not None:
            head32 = head if val.dtype == torch.float32 else call(_CONVERT, head, torch.float32)
            out = call(_aten.add.Tensor, head32, out)
        if val.dtype != torch.float32:
            out = call(_CONVERT, out, val.dtype)
    target.replace_all_uses_with(out)
    erase_unused(graph, target, lambda n: n.target in _DENSE_PATH)
    return False


def _owned_scaled_gradient(head: fx.Node) -> tuple[fx.Node, fx.Node] | None:
    """``(buffer, scale)`` when ``head`` (read only by the add of the embedding's gradient) is a donated backward
    input times the loss's gradient (:func:`.post_grad.donated_scaled_input`) in rows of contiguous elements, the
    layout ``add_embedding_grad`` takes; else None."""
    owned = donated_scaled_input(head)
    if owned is None:
        return None
    b = _val(owned[0])
    return owned if b.dim() == 2 and b.stride(-1) == 1 else None


def _shape(node) -> tuple[int, ...] | None:
    value = _val(node)
    return tuple(value.shape) if isinstance(value, torch.Tensor) else None


def _dtype(node) -> torch.dtype | None:
    value = _val(node)
    return value.dtype if isinstance(value, torch.Tensor) else None


def _same_tensor_type(a: fx.Node, b: fx.Node) -> bool:
    va, vb = _val(a), _val(b)
    return (isinstance(va, torch.Tensor) and isinstance(vb, torch.Tensor) and va.dtype == vb.dtype
            and va.shape == vb.shape and va.device == vb.device)


REWRITE = PostGradRewrite(EMBEDDING_GRAD, rewrite_embedding_grads, functools.cache(_uuid))
