"""The backward wiring that the tiled (:mod:`.fused_linear_cross_entropy_tiled`) and vocab-chunked
(:mod:`.fused_linear_cross_entropy_vocab_chunked`) strategies share, and the gradient buffers of
every strategy.

Both forward ops take ``(x, weight, target, bias, *options)`` and return the loss per row followed
by statistics only their backward reads (the logsumexp per row; the tiled one also the largest
logit per tile). Both backward ops take ``(x, weight, target, bias, lse, grad_loss, *other
statistics, *launch values, *options, compute_grad_x, compute_grad_weight, compute_grad_bias)`` and
return ``(grad_x, grad_weight, grad_bias)``, computing only the gradients autograd asks for.
"""

from collections.abc import Callable

import torch
from torch import Tensor


def gradient_buffers(x: Tensor, weight: Tensor, bias: Tensor | None, compute_grad_x: bool,
                     compute_grad_weight: bool, compute_grad_bias: bool) -> tuple[Tensor, Tensor, Tensor]:
    """(grad_x, grad_weight, grad_bias) buffers of every strategy; [0]-sized where not computed."""
    none = x.new_empty(0)
    return (
        torch.empty_like(x, memory_format=torch.contiguous_format) if compute_grad_x else none,
        torch.empty_like(weight, memory_format=torch.contiguous_format) if compute_grad_weight else x.new_empty(0),
        torch.empty_like(bias, memory_format=torch.contiguous_format) if compute_grad_bias else x.new_empty(0),
    )


def backward_fake(x, weight, target, bias, *arguments):
    """The fake of both backward ops: their last three arguments say which gradients exist."""
    return gradient_buffers(x, weight, bias, *arguments[-3:])


def keep_for_backward(ctx, inputs, output, *launch) -> None:
    """The ``setup_context`` of both forward ops: the inputs and statistics are saved, the options
    and ``launch`` (values the backward op takes after the statistics, such as the tiled forward's
    tile shape) kept on ``ctx``; the statistics have no gradient."""
    x, weight, target, bias = inputs[:4]
    ctx.options = inputs[4:]
    ctx.launch = launch
    ctx.mark_non_differentiable(*output[1:])
    ctx.save_for_backward(x, weight, target, bias, *output[1:])


def input_gradients(backward_op: Callable, ctx, grad_loss: Tensor | None) -> tuple:
    """The backward of both forward ops through ``backward_op``: gradients for x, weight and bias
    (those autograd needs), None for the target and the options."""
    if grad_loss is None:
        return (None,) * (4 + len(ctx.options))
    x, weight, target, bias, lse, *statistics = ctx.saved_tensors
    need_x, need_w, _, need_b = ctx.needs_input_grad[:4]
    need_b = need_b and bias is not None
    grad_x, grad_w, grad_b = backward_op(
        x, weight, target, bias, lse, grad_loss.contiguous(), *statistics, *ctx.launch, *ctx.options,
        need_x, need_w, need_b,
    )
    return (grad_x if need_x else None, grad_w if need_w else None, None, grad_b if need_b else None,
            *(None,) * len(ctx.options))
