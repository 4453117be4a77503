"""A gradient the forward computed, scaled by the loss's gradient in place: no pass over it when that is 1.

The fused loss computes the LM head's weight gradient in the forward (the logits are gone by the backward) and
saves it; the backward graph AOTAutograd traces multiplies it by the gradient the loss receives and returns the
product as the weight's gradient. For an untied head (Qwen3-MoE, Mixtral, Llama-3-8B) nothing else is added to it,
so Inductor writes the product in a kernel of its own: the whole ``[vocabulary, hidden]`` gradient read and written
(1.2 GB at Qwen3-30B-A3B's 151,936 x 2048 in bf16, 0.29 ms of a 28 ms training step on an H200), for a
multiplication by 1 whenever the loss is backpropagated as it is::

    head_grad = saved_head_grad * grad_loss                 # before: a pass over the vocabulary
    twinkle_triton.scale_in_place(saved_head_grad, grad_loss)  # after; the graph returns saved_head_grad

When AOTAutograd donates the saved tensor to the backward (read once: not with ``retain_graph=True``) and the
product is what the graph returns, the rewrite scales it where it lies (``twinkle::scale_in_place``, which reads the
scale on the device and touches nothing when it is 1) and returns that buffer. Any other scale (a loss divided for
gradient accumulation) multiplies every element in fp32 and rounds once, as Inductor's kernel did: the same bits.
A tied head's product, which the embedding's gradient is added to, is the ``embedding_grad`` rewrite's
(:mod:`.embedding_grad`, ``twinkle_triton.add_embedding_grad``).

The backend runs it on every graph after ``embedding_grad`` (:mod:`.post_grad`), unless
``options={"scaled_gradient": False}`` or the registry's graph rewrite ``scaled_gradient`` is removed.
"""

from __future__ import annotations

import functools
import logging
import sys

import torch
import torch.fx as fx

from .post_grad import PostGradRewrite, donated_scaled_input, fake_mode_of, kernel_module, on_kernel_device, source_uuid
from .post_grad import call as call_node
from .post_grad import value as _val

logger = logging.getLogger(__name__)

__all__ = ["SCALED_GRADIENT", "REWRITE", "rewrite_scaled_gradients"]

SCALED_GRADIENT = "scaled_gradient"  # its name in the registry


def rewrite_scaled_gradients(graph: fx.Graph) -> int:
    """Scale every returned product of a donated backward input and the loss's gradient in place (see the module
    docstring) and return how many; the caller recompiles its module. Logged at INFO."""
    if _kernel_module() is None:
        return 0
    output = graph.output_node()
    fake_mode, rewritten = None, 0
    for mul in graph.find_nodes(op="call_function", target=torch.ops.aten.mul.Tensor):
        owned = donated_scaled_input(mul) if set(mul.users) == {output} else None
        if owned is None or not _takes(owned[0]):
            continue
        if fake_mode is None:  # the graph's fake tensors, once
            fake_mode = fake_mode_of(graph) or False
        buffer, scale = owned
        with graph.inserting_before(mul):
            call_node(graph, fake_mode or None, torch.ops.twinkle.scale_in_place.default, (buffer, scale))
        mul.replace_all_uses_with(buffer)
        graph.erase_node(mul)
        rewritten += 1
    if rewritten:
        graph.lint()
        logger.info("scaled_gradient: %d gradient(s) a backward graph returns scaled in place "
                    "(twinkle_triton.scale_in_place)", rewritten)
    return rewritten


def _takes(buffer: fx.Node) -> bool:
    """Whether the kernel runs where ``buffer`` lives (elsewhere the op would run its reference, no gain) and takes
    it: contiguous. A returned product is a kernel of its own either way (nothing reads it to fuse it into)."""
    from twinkle_triton._library import KERNELS_RUN_ON_CPU

    return on_kernel_device(buffer, KERNELS_RUN_ON_CPU) and _val(buffer).is_contiguous()


def _uuid() -> str:
    """This rewrite's and its kernel's source, hashed: a change to either is a new cache key."""
    return source_uuid("twinkle_fx.scaled_gradient", sys.modules[__name__], _kernel_module())


def _kernel_module():
    """``twinkle_triton.scale_in_place`` (importing it defines ``twinkle::scale_in_place``), or None where the
    kernels do not import."""
    return kernel_module(SCALED_GRADIENT, "twinkle_triton.scale_in_place")


REWRITE = PostGradRewrite(SCALED_GRADIENT, rewrite_scaled_gradients, functools.cache(_uuid))
