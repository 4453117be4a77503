"""An embedding's weight gradient as one sum per looked-up row: ``embedding_grad_sums``.

An embedding table's gradient is zero except in the rows of the looked-up indices. PyTorch's
backward (``embedding_dense_backward``, and Inductor's decomposition of it) builds it as a dense
table: an fp32 ``[num_embeddings, hidden]`` buffer is zeroed, every token's gradient row is
accumulated into it, and the table is cast to the weight's dtype. A tied embedding (the weight the
LM head shares) then adds that table to the head's gradient, one more pass over the vocabulary. At
Llama-3.2-1B's shape (128,256 x 2048, 4096 tokens) that is 0.73 ms of a training step on an H200 for
16 MB of gradient rows: 224 us to zero the 1 GB buffer, 32 us to scatter, 475 us to cast and add.

This op computes only the sums: ``sums, slot = embedding_grad_sums(indices, grad, mask, num_embeddings)``
holds, for each looked-up row, the fp32 sum of the gradient rows of its tokens, at ``sums[slot[row]]``
(``slot`` is -1 for rows no token looked up). Whoever adds the gradient to something reads the sums
through ``slot`` in the same pass (the backend's rewrite lets Inductor fuse that gather into the kernel
that writes the head's gradient), and nothing of the vocabulary's size is zeroed, written or read twice.
``mask`` (optional, the tokens' shape) drops tokens whose gradient the table does not take (the padding
index).

The kernel sums each index's tokens in the order of their positions (a stable sort), so the result does
not depend on scheduling: one program sums up to ``_SEGMENT`` of them, reading their gradient rows
``_TOKENS`` at a time, and a second kernel adds the segments' sums of an index with more tokens than that
(a padding token repeated over half a batch), in order.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._checks import ANY_DTYPE, check_tensors
from ._launch import cdiv, interpreting, next_power_of_2
from ._library import define_op, wrap_triton

# Tokens of one index a loop step reads: independent row loads in flight per program.
_TOKENS = 16
# Tokens of one index one program sums: an index looked up more often (a padding token over most of a batch)
# is summed by several programs, then their sums added in order, so no program walks thousands of tokens.
_SEGMENT = 256
# Columns of the hidden dimension one program covers (the GPU; the interpreter takes the whole row).
_BLOCK_H = 512


@triton.jit
def _embedding_grad_sums_kernel(
    sorted_ptr, order_ptr, heads_ptr, ends_ptr, mask_ptr, grad_ptr, sums_ptr, partial_ptr, hidden, grad_stride,
    SEGMENT: tl.constexpr, HAS_MASK: tl.constexpr, TOKENS: tl.constexpr, BLOCK_H: tl.constexpr,
):
    # Program i sums the tokens [i, i + SEGMENT) of its index when i starts a segment of the index's tokens
    # (the index's first token, or SEGMENT tokens after a segment's start); the other programs do nothing.
    i = tl.program_id(0)
    head = tl.load(heads_ptr + i)
    if (i - head) % SEGMENT == 0:
        end = tl.load(ends_ptr + i)
        stop = tl.minimum(end, i + SEGMENT)
        cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
        in_row = cols < hidden
        acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
        for start in range(i, stop, TOKENS):
            offs = start + tl.arange(0, TOKENS)
            taken = offs < stop
            token = tl.load(order_ptr + offs, mask=taken, other=0)
            if HAS_MASK:
                taken = taken & (tl.load(mask_ptr + token, mask=taken, other=0) != 0)
            g = tl.load(grad_ptr + token[:, None] * grad_stride + cols[None, :],
                        mask=taken[:, None] & in_row[None, :], other=0.0)
            acc += tl.sum(g.to(tl.float32), axis=0)
        # an index of one segment has its sum; the segments of a longer one are summed by the next kernel
        out = sums_ptr if end - head <= SEGMENT else partial_ptr
        tl.store(out + i.to(tl.int64) * hidden + cols, acc, mask=in_row)


@triton.jit
def _embedding_grad_segments_kernel(heads_ptr, ends_ptr, partial_ptr, sums_ptr, hidden,
                                    SEGMENT: tl.constexpr, BLOCK_H: tl.constexpr):
    # The first token's program of an index with more than SEGMENT tokens adds its segments' sums, in order.
    i = tl.program_id(0)
    end = tl.load(ends_ptr + i)
    if (tl.load(heads_ptr + i) == i) & (end - i > SEGMENT):
        cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
        in_row = cols < hidden
        acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
        for start in range(i, end, SEGMENT):
            row = i.to(tl.int64) + (start - i)  # 64-bit offsets (the loop's counter is 32-bit)
            acc += tl.load(partial_ptr + row * hidden + cols, mask=in_row, other=0.0)
        tl.store(sums_ptr + i.to(tl.int64) * hidden + cols, acc, mask=in_row)


def _flat_indices(indices: Tensor, num_embeddings: int) -> Tensor:
    """The indices as one int64 row, a negative index counted from the table's end (as ``index_put`` does)."""
    flat = indices.reshape(-1).long()
    return torch.where(flat < 0, flat + num_embeddings, flat)


def _sorted_tokens(indices: Tensor, mask: Tensor | None, num_embeddings: int) -> tuple[Tensor, Tensor]:
    """The tokens' indices in sorted order (masked tokens as index 0, which they add nothing to) and the
    tokens in that order; a stable sort keeps each index's tokens in their positions' order."""
    flat = _flat_indices(indices, num_embeddings)
    if mask is not None:
        flat = torch.where(mask.reshape(-1), flat, torch.zeros_like(flat))
    return torch.sort(flat, stable=True)


def _slots(sorted_indices: Tensor, heads: Tensor, num_embeddings: int) -> Tensor:
    """``slot[row]``: the sorted position of the first token of ``row`` (``heads``, each token's), -1 for none.
    Every token of a row writes the same position, so the writes agree whichever lands last."""
    return torch.full((num_embeddings,), -1, dtype=torch.int64, device=sorted_indices.device).index_put_(
        (sorted_indices,), heads)


def _embedding_grad_sums_impl(indices: Tensor, grad: Tensor, mask: Tensor | None,
                              num_embeddings: int) -> tuple[Tensor, Tensor]:
    hidden = grad.shape[-1]
    sorted_indices, order = _sorted_tokens(indices, mask, num_embeddings)
    tokens = sorted_indices.numel()
    sums = grad.new_zeros((tokens, hidden), dtype=torch.float32)
    heads = torch.searchsorted(sorted_indices, sorted_indices)
    slot = _slots(sorted_indices, heads, num_embeddings)
    if tokens == 0 or hidden == 0:
        return sums, slot
    grad = grad.reshape(tokens, hidden)
    if grad.stride(-1) != 1:
        grad = grad.contiguous()
    ends = torch.searchsorted(sorted_indices, sorted_indices, right=True)
    partial = torch.empty_like(sums)  # the segments' sums of indices with more than _SEGMENT tokens
    flags = mask.reshape(-1) if mask is not None else sorted_indices  # any tensor where there is no mask
    block = next_power_of_2(hidden) if interpreting() else min(_BLOCK_H, next_power_of_2(hidden))
    grid = (tokens, cdiv(hidden, block))
    wrap_triton(_embedding_grad_sums_kernel)[grid](
        sorted_indices, order, heads, ends, flags, grad, sums, partial, hidden, grad.stride(0),
        SEGMENT=_SEGMENT, HAS_MASK=mask is not None, TOKENS=_TOKENS, BLOCK_H=block, num_warps=4,
    )
    wrap_triton(_embedding_grad_segments_kernel)[grid](
        heads, ends, partial, sums, hidden, SEGMENT=_SEGMENT, BLOCK_H=block, num_warps=4,
    )
    return sums, slot


def _embedding_grad_sums_fake(indices: Tensor, grad: Tensor, mask: Tensor | None,
                              num_embeddings: int) -> tuple[Tensor, Tensor]:
    return (grad.new_empty((indices.numel(), grad.shape[-1]), dtype=torch.float32),
            indices.new_empty((num_embeddings,), dtype=torch.int64))


# No autograd: the op computes a gradient, inside a backward graph. Opaque to Inductor (a custom op, not a
# triton_op): the backend inserts it into graphs AOTAutograd has already traced.
_embedding_grad_sums_op = define_op(
    "embedding_grad_sums", _embedding_grad_sums_impl, fake=_embedding_grad_sums_fake, inline_kernels=False,
    reference=lambda *args: embedding_grad_sums_reference(*args),  # defined below
)


def embedding_grad_sums(indices: Tensor, grad: Tensor, mask: Tensor | None,
                        num_embeddings: int) -> tuple[Tensor, Tensor]:
    """An embedding's weight gradient as one fp32 sum per looked-up row, and where each row's sum is.

    Args:
        indices (`torch.Tensor`): the looked-up indices, any shape, an integer dtype, each in
            ``[-num_embeddings, num_embeddings)`` where ``mask`` is true; a negative index counts from the
            table's end, as in ``index_put``.
        grad (`torch.Tensor`): the lookup's output gradient, ``indices.shape + (hidden,)``, floating.
        mask (`torch.Tensor` or None): bool, ``indices``' shape (or with a trailing 1): the tokens whose
            gradient the table takes (False for the padding index); None for all.
        num_embeddings (`int`): the table's rows.

    Returns:
        `tuple[torch.Tensor, torch.Tensor]`: ``sums`` ``[tokens, hidden]`` fp32 and ``slot``
        ``[num_embeddings]`` int64, with the dense weight gradient (``embedding_dense_backward``) equal to
        ``sums[slot.clamp(min=0)] * (slot >= 0)[:, None]``: row ``r``'s gradient is ``sums[slot[r]]`` where
        ``slot[r] >= 0`` and zero elsewhere. Rows of ``sums`` no slot names are zero.

    Raises:
        TypeError: a tensor of the wrong kind (``indices`` not integer, ``mask`` not bool).
        ValueError: shapes that do not match, or tensors on different devices.

    Example:
        ```python
        sums, slot = embedding_grad_sums(input_ids, grad_embeds, None, weight.shape[0])
        weight_grad = head_grad + (sums[slot.clamp(min=0)] * (slot >= 0)[:, None]).to(head_grad.dtype)
        ```
    """
    check_tensors("embedding_grad_sums", min_dim=1, grad=grad)
    check_tensors("embedding_grad_sums", dtypes=ANY_DTYPE, indices=indices, mask=mask, grad=grad)
    if indices.dtype.is_floating_point or indices.dtype.is_complex or indices.dtype == torch.bool:
        raise TypeError(f"embedding_grad_sums: indices has dtype {indices.dtype}; pass integer indices.")
    if tuple(grad.shape[:-1]) != tuple(indices.shape):
        raise ValueError(f"embedding_grad_sums: indices {tuple(indices.shape)} and grad {tuple(grad.shape)} do not "
                         "match; pass grad of shape indices.shape + (hidden,).")
    if mask is not None and (mask.dtype != torch.bool or mask.numel() != indices.numel()):
        raise ValueError(f"embedding_grad_sums: mask is {mask.dtype} {tuple(mask.shape)}; pass a bool mask of "
                         f"indices' shape {tuple(indices.shape)}.")
    return _embedding_grad_sums_op(indices, grad, mask, int(num_embeddings))


def embedding_grad_sums_reference(indices: Tensor, grad: Tensor, mask: Tensor | None,
                                  num_embeddings: int) -> tuple[Tensor, Tensor]:
    """Plain PyTorch ``embedding_grad_sums``: the dense fp32 table, read at each row's first sorted token."""
    sorted_indices, _ = _sorted_tokens(indices, mask, num_embeddings)
    values = grad.reshape(-1, grad.shape[-1]).float()
    flat = _flat_indices(indices, num_embeddings)
    if mask is not None:
        values = values * mask.reshape(-1, 1)
        flat = torch.where(mask.reshape(-1), flat, 0)
    table = values.new_zeros((num_embeddings, values.shape[-1])).index_add(0, flat, values)
    heads = torch.ones_like(sorted_indices, dtype=torch.bool)
    heads[1:] = sorted_indices[1:] != sorted_indices[:-1]
    sums = torch.where(heads[:, None], table[sorted_indices], 0.0)
    return sums, _slots(sorted_indices, torch.searchsorted(sorted_indices, sorted_indices), num_embeddings)
