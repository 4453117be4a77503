"""An embedding's weight gradient as the rows it changes: ``embedding_grad_rows``.

An embedding table's gradient is zero except in the rows of the looked-up indices. PyTorch's
backward (``embedding_dense_backward``, and Inductor's decomposition of it) builds it as a dense
table: an fp32 ``[num_embeddings, hidden]`` buffer is zeroed, every token's gradient row is
accumulated into it, and the table is cast to the weight's dtype. A tied embedding (the weight the
LM head shares) then adds that table to the head's gradient, one more pass over the vocabulary. At
Llama-3.2-1B's shape (128,256 x 2048, 4096 tokens) that is 0.73 ms of a training step on an H200 for
16 MB of gradient rows: 224 us to zero the 1 GB buffer, 32 us to scatter, 475 us to cast and add.

This op computes only the changed rows: ``rows, index = embedding_grad_rows(base, indices, grad,
mask)`` gives, for each token in the order of its sorted index, ``base[index[i]]`` plus the fp32 sum
of the gradient rows of every token with that index, rounded once to ``base``'s dtype, so that::

    base.index_put((index,), rows)   ==   base + embedding_dense_backward(grad, indices, ...)

(``base`` the head's gradient of a tied embedding, or zeros). Tokens that share an index all carry
the same row, so the writes agree whichever lands last. ``mask`` (optional, the tokens' shape) drops
tokens whose gradient the table does not take (the padding index); their rows count for nothing.

The kernel sums each index's tokens in one program, in the order of their positions (a stable sort),
so the result does not depend on scheduling; it reads its tokens' gradient rows ``TOKENS`` at a time,
so a frequent index (a padding token repeated over half a batch) costs a few loop steps, not one per
token.
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
# Columns of the hidden dimension one program covers (the GPU; the interpreter takes the whole row).
_BLOCK_H = 512


@triton.jit
def _embedding_grad_rows_kernel(
    sorted_ptr, order_ptr, ends_ptr, mask_ptr, grad_ptr, base_ptr, rows_ptr,
    hidden, grad_stride, base_stride,
    HAS_MASK: tl.constexpr, TOKENS: tl.constexpr, BLOCK_H: tl.constexpr,
):
    i = tl.program_id(0)
    index = tl.load(sorted_ptr + i)
    previous = tl.load(sorted_ptr + i - 1, mask=i > 0, other=-1)
    if previous != index:  # the first token of its index sums all of them; the others have nothing to do
        end = tl.load(ends_ptr + i)
        cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
        in_row = cols < hidden
        acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
        for start in range(i, end, TOKENS):
            offs = start + tl.arange(0, TOKENS)
            taken = offs < end
            token = tl.load(order_ptr + offs, mask=taken, other=0)
            if HAS_MASK:
                taken = taken & (tl.load(mask_ptr + token, mask=taken, other=0) != 0)
            g = tl.load(grad_ptr + token[:, None] * grad_stride + cols[None, :],
                        mask=taken[:, None] & in_row[None, :], other=0.0)
            acc += tl.sum(g.to(tl.float32), axis=0)
        row = tl.load(base_ptr + index * base_stride + cols, mask=in_row, other=0.0).to(tl.float32) + acc
        row = row.to(rows_ptr.dtype.element_ty)
        for start in range(i, end, TOKENS):
            offs = (start + tl.arange(0, TOKENS)).to(tl.int64)
            tl.store(rows_ptr + offs[:, None] * hidden + cols[None, :], tl.broadcast_to(row[None, :], (TOKENS, BLOCK_H)),
                     mask=(offs < end)[:, None] & in_row[None, :])


def _sorted_tokens(indices: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """The tokens' indices in sorted order (masked tokens as index 0, which they add nothing to) and the
    tokens in that order; a stable sort keeps each index's tokens in their positions' order."""
    flat = indices.reshape(-1).long()
    if mask is not None:
        flat = torch.where(mask.reshape(-1), flat, torch.zeros_like(flat))
    return torch.sort(flat, stable=True)


def _embedding_grad_rows_impl(base: Tensor, indices: Tensor, grad: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
    hidden = base.shape[-1]
    sorted_indices, order = _sorted_tokens(indices, mask)
    tokens = sorted_indices.numel()
    rows = base.new_empty((tokens, hidden))
    if tokens == 0 or hidden == 0:
        return rows, sorted_indices
    grad = grad.reshape(tokens, hidden)
    if grad.stride(-1) != 1:
        grad = grad.contiguous()
    base_rows = base if base.stride(-1) == 1 else base.contiguous()
    ends = torch.searchsorted(sorted_indices, sorted_indices, right=True)
    flags = mask.reshape(-1) if mask is not None else sorted_indices  # any tensor where there is no mask
    block = next_power_of_2(hidden) if interpreting() else min(_BLOCK_H, next_power_of_2(hidden))
    wrap_triton(_embedding_grad_rows_kernel)[(tokens, cdiv(hidden, block))](
        sorted_indices, order, ends, flags, grad, base_rows, rows, hidden, grad.stride(0), base_rows.stride(0),
        HAS_MASK=mask is not None, TOKENS=_TOKENS, BLOCK_H=block, num_warps=4,
    )
    return rows, sorted_indices


def _embedding_grad_rows_fake(base: Tensor, indices: Tensor, grad: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
    tokens = indices.numel()
    return base.new_empty((tokens, base.shape[-1])), indices.new_empty((tokens,), dtype=torch.int64)


# No autograd: the op computes a gradient, inside a backward graph. Opaque to Inductor (a custom op, not a
# triton_op): the backend inserts it into graphs AOTAutograd has already traced.
_embedding_grad_rows_op = define_op(
    "embedding_grad_rows", _embedding_grad_rows_impl, fake=_embedding_grad_rows_fake, inline_kernels=False,
    reference=lambda *args: embedding_grad_rows_reference(*args),  # defined below
)


def embedding_grad_rows(base: Tensor, indices: Tensor, grad: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The rows an embedding's weight gradient changes, added to ``base``, and where they go.

    Args:
        base (`torch.Tensor`): ``[num_embeddings, hidden]``, what the gradient is added to (a tied LM
            head's weight gradient, or zeros); its dtype is the rows'.
        indices (`torch.Tensor`): the looked-up indices, any shape, an integer dtype, each in
            ``[0, num_embeddings)`` where ``mask`` is true.
        grad (`torch.Tensor`): the lookup's output gradient, ``indices.shape + (hidden,)``, floating.
        mask (`torch.Tensor`, *optional*): bool, ``indices``' shape (or with a trailing 1): the tokens
            whose gradient the table takes (False for the padding index).

    Returns:
        `tuple[torch.Tensor, torch.Tensor]`: ``rows`` ``[tokens, hidden]`` in ``base``'s dtype and ``index``
        ``[tokens]`` int64 (the indices sorted; masked tokens as 0), with
        ``base.index_put((index,), rows)`` equal to ``base`` plus the embedding's dense weight gradient,
        each row's sum kept in fp32 and rounded once.

    Raises:
        TypeError: a tensor of the wrong kind (``indices`` not integer, ``mask`` not bool).
        ValueError: shapes that do not match, or tensors on different devices.

    Example:
        ```python
        rows, index = embedding_grad_rows(head_grad, input_ids, grad_embeds)
        weight_grad = head_grad.index_put((index,), rows)   # head_grad + the embedding's gradient
        ```
    """
    check_tensors("embedding_grad_rows", min_dim=1, base=base, grad=grad)
    check_tensors("embedding_grad_rows", dtypes=ANY_DTYPE, indices=indices, mask=mask, base=base)
    if indices.dtype.is_floating_point or indices.dtype.is_complex or indices.dtype == torch.bool:
        raise TypeError(f"embedding_grad_rows: indices has dtype {indices.dtype}; pass integer indices.")
    if base.dim() != 2 or tuple(grad.shape) != (*indices.shape, base.shape[1]):
        raise ValueError(f"embedding_grad_rows: base {tuple(base.shape)}, indices {tuple(indices.shape)} and grad "
                         f"{tuple(grad.shape)} do not match; pass base [num_embeddings, hidden] and grad "
                         "indices.shape + (hidden,).")
    if mask is not None and (mask.dtype != torch.bool or mask.numel() != indices.numel()):
        raise ValueError(f"embedding_grad_rows: mask is {mask.dtype} {tuple(mask.shape)}; pass a bool mask of "
                         f"indices' shape {tuple(indices.shape)}.")
    return _embedding_grad_rows_op(base, indices, grad, mask)


def embedding_grad_rows_reference(base: Tensor, indices: Tensor, grad: Tensor,
                                  mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Plain PyTorch ``embedding_grad_rows``: the dense fp32 table, read at the sorted indices."""
    sorted_indices, _ = _sorted_tokens(indices, mask)
    rows = grad.reshape(-1, base.shape[-1]).float()
    if mask is not None:
        rows = rows * mask.reshape(-1, 1)
    flat = indices.reshape(-1).long()
    if mask is not None:
        flat = torch.where(mask.reshape(-1), flat, 0)
    table = base.float().index_add(0, flat, rows)
    return table[sorted_indices].to(base.dtype), sorted_indices
