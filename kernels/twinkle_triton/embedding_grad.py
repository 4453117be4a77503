"""An embedding's weight gradient as one sum per looked-up row: ``embedding_grad_sums``, ``add_embedding_grad``.

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

``add_embedding_grad(out, scale, sums, slot)`` is that add done in place, where ``out`` may be overwritten (a tied
LM head's gradient the backward owns): ``out = out * scale + table``. With ``scale`` 1 it reads and writes only the
looked-up rows, so a tied embedding's gradient costs no pass over the vocabulary at all.

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
# add_embedding_grad: table rows one program owns, and the columns of one loop step over them.
_ADD_ROWS = 16
_ADD_BLOCK_H = 256


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


@triton.jit
def _add_embedding_grad_kernel(out_ptr, scale_ptr, sums_ptr, slot_ptr, n_rows, hidden, out_stride,
                               ROWS: tl.constexpr, BLOCK_H: tl.constexpr):
    # out[r] = out[r] * scale + sums[slot[r]] for each of this program's rows r: every row when scale is not 1,
    # else only the looked-up ones (slot >= 0). A row left alone is neither read nor written, so with scale 1
    # (a loss backpropagated as it is) the pass touches the looked-up rows, not the vocabulary.
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    in_table = rows < n_rows
    slot = tl.load(slot_ptr + rows, mask=in_table, other=-1)
    scale = tl.load(scale_ptr).to(tl.float32)
    looked_up = slot >= 0
    active = tl.where(scale != 1.0, in_table, in_table & looked_up)
    if tl.max(active.to(tl.int32), axis=0) > 0:
        for start in range(0, hidden, BLOCK_H):
            cols = start + tl.arange(0, BLOCK_H)
            mask = active[:, None] & (cols < hidden)[None, :]
            where = out_ptr + rows[:, None] * out_stride + cols[None, :]
            x = tl.load(where, mask=mask, other=0.0).to(tl.float32)
            s = tl.load(sums_ptr + tl.maximum(slot, 0)[:, None] * hidden + cols[None, :],
                        mask=mask & looked_up[:, None], other=0.0)
            tl.store(where, (x * scale + s).to(out_ptr.dtype.element_ty), mask=mask)


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


# ----------------------------------------------------------------------------- add_embedding_grad


def _add_embedding_grad_impl(out: Tensor, scale: Tensor, sums: Tensor, slot: Tensor) -> None:
    n_rows, hidden = out.shape
    if n_rows == 0 or hidden == 0:
        return
    if out.stride(-1) != 1:  # a copy would be updated in out's place
        raise ValueError(f"add_embedding_grad: out has strides {tuple(out.stride())}; pass contiguous rows.")
    sums, slot = sums.contiguous(), slot.contiguous()  # the kernel reads sums' rows at `hidden` apart
    block = next_power_of_2(hidden) if interpreting() else min(_ADD_BLOCK_H, next_power_of_2(hidden))
    wrap_triton(_add_embedding_grad_kernel)[(cdiv(n_rows, _ADD_ROWS),)](
        out, scale, sums, slot, n_rows, hidden, out.stride(0), ROWS=_ADD_ROWS, BLOCK_H=block, num_warps=4,
    )


def _add_embedding_grad_fake(out: Tensor, scale: Tensor, sums: Tensor, slot: Tensor) -> None:
    return None


# Opaque to Inductor, like embedding_grad_sums: the backend inserts it into backward graphs after AOTAutograd.
_add_embedding_grad_op = define_op(
    "add_embedding_grad", _add_embedding_grad_impl, fake=_add_embedding_grad_fake, mutates_args=("out",),
    inline_kernels=False, reference=lambda *args: add_embedding_grad_reference(*args),  # defined below
)


def add_embedding_grad(out: Tensor, scale: Tensor, sums: Tensor, slot: Tensor) -> None:
    """In place, ``out = out * scale + table``: a gradient (a tied LM head's) scaled and the embedding's weight
    gradient ``table`` added, from :func:`embedding_grad_sums`' ``sums`` and ``slot``.

    With ``scale`` 1 (a loss backpropagated as it is) only the looked-up rows are read and written; any other
    scale (a loss divided for gradient accumulation) rescales every row, in the same pass. ``scale`` is read on
    the device: no host synchronisation. Each row is computed in fp32 and rounded once.

    Args:
        out (`torch.Tensor`): ``[num_embeddings, hidden]``, floating, rows contiguous; updated in place.
        scale (`torch.Tensor`): a one-element floating tensor on ``out``'s device.
        sums (`torch.Tensor`): ``[tokens, hidden]`` fp32, from ``embedding_grad_sums``.
        slot (`torch.Tensor`): ``[num_embeddings]`` int64, from ``embedding_grad_sums``.

    Raises:
        TypeError: a tensor of the wrong kind (``sums`` not fp32, ``slot`` not int64).
        ValueError: shapes that do not match, strided rows, or tensors on different devices.

    Example:
        ```python
        sums, slot = embedding_grad_sums(input_ids, grad_embeds, None, head_grad.shape[0])
        add_embedding_grad(head_grad, grad_loss, sums, slot)   # head_grad is now the tied weight's gradient
        ```
    """
    check_tensors("add_embedding_grad", min_dim=0, out=out, scale=scale, sums=sums)
    check_tensors("add_embedding_grad", dtypes=ANY_DTYPE, out=out, slot=slot)
    if sums.dtype != torch.float32 or slot.dtype != torch.int64:
        raise TypeError(f"add_embedding_grad: sums is {sums.dtype} and slot {slot.dtype}; pass "
                        "embedding_grad_sums' outputs (fp32 sums, int64 slot).")
    if out.dim() != 2 or out.stride(-1) != 1 or scale.numel() != 1 or sums.dim() != 2 \
            or sums.shape[1] != out.shape[1] or tuple(slot.shape) != (out.shape[0],):
        raise ValueError(f"add_embedding_grad: out {tuple(out.shape)} (strides {tuple(out.stride())}), scale "
                         f"{tuple(scale.shape)}, sums {tuple(sums.shape)} and slot {tuple(slot.shape)} do not fit; "
                         "pass a [rows, hidden] out with contiguous rows, a one-element scale, [tokens, hidden] "
                         "sums and [rows] slot.")
    _add_embedding_grad_op(out, scale, sums, slot)


def add_embedding_grad_reference(out: Tensor, scale: Tensor, sums: Tensor, slot: Tensor) -> None:
    """Plain PyTorch ``add_embedding_grad`` (every row, in fp32)."""
    looked_up = slot >= 0
    table = sums[slot.clamp(min=0)] * looked_up[:, None] if looked_up.any() else 0.0  # sums may have no rows
    out.copy_(out.float() * scale.float().reshape(()) + table)
