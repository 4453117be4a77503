"""LM head + cross-entropy without materialising the (tokens x vocab) logits.

``fused_linear_cross_entropy(x, weight, target, bias)`` equals
``F.cross_entropy(F.linear(x, weight, bias).float(), target, ignore_index=..., reduction=...)``.

Tokens are processed in chunks of ``chunk_size`` rows. Per chunk: cuBLAS computes the logits into
one reused ``[chunk_size, vocab]`` buffer (in x's dtype, rounded like ``F.linear``); a Triton
kernel computes each row's loss (online max / log-sum-exp in fp32) and, when gradients are needed,
overwrites the logits in place with d(loss)/d(logits) = (softmax - onehot) * scale; cuBLAS then
writes ``grad_x[chunk] = grad_logits @ W`` and accumulates ``grad_W += grad_logits^T @ x[chunk]``
(and grad_bias). Gradients are computed in forward (like Liger), so backward only multiplies them
by the incoming gradient: in place in eager mode, as a plain multiply when traced by torch.compile.
That needs no kernel, so this op, unlike the others, has no ``twinkle::..._backward`` custom op.

Chunk size: extra memory is ``grad_W`` (the weight's size, needed by any implementation) plus one
logits chunk, ``chunk_size * vocab * itemsize``. Small chunks are slow: every chunk re-reads and
re-writes grad_W (272 MB at vocab 151936 x 896) and its GEMMs have a small M. Measured on an H200
(torch 2.11, 4096 tokens x 896 -> 151936 vocab, bf16, forward + backward; eager unfused 12.51 ms /
6.96 GiB, Inductor 6.62 ms / 1.42 GiB):

    chunk rows   128     256     512     1024    2048    4096
    ms           13.62   8.85    7.12    6.55    6.66    6.29
    extra GiB    0.297   0.333   0.405   0.550   0.840   1.420

The default keeps one logits chunk within ``LOGITS_CHUNK_BYTES`` = 320 MiB, rounded down to whole
256-row GEMM tiles: 1024 rows for that workload, Inductor's speed at 0.08x the eager memory.
Pass ``chunk_size`` to trade speed for memory.

Semantics: ``reduction="mean"`` divides by the number of non-ignored targets; with every target
ignored the mean is nan (0/0) and gradients are zero, exactly like ``F.cross_entropy``;
``reduction="sum"`` gives 0 then. ``"none"`` is not supported (precomputed gradients assume one
scalar loss). The loss is fp32 (fp64 for fp64 inputs). Out-of-range targets are not checked
(that would synchronise the device); the kernel masks the read, so such rows get loss = lse.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._launch import compute_dtype, interpreting
from ._library import define_op

LOGITS_CHUNK_BYTES = 320 * 1024 * 1024
_REDUCTIONS = ("mean", "sum")
# Columns per loop step over the vocabulary: 8K fp32 over 16 warps is 16 values a thread in
# flight; untuned (see README.md).
_VOCAB_BLOCK = 8192
_VOCAB_WARPS = 16


@triton.jit
def _fused_linear_cross_entropy_fwd_kernel(
    logits_ptr, target_ptr, loss_ptr, scale_ptr, logits_row_stride, n_cols, ignore_index,
    COMPUTE_GRAD: tl.constexpr, BLOCK: tl.constexpr, COMPUTE_DTYPE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * logits_row_stride
    target = tl.load(target_ptr + row).to(tl.int64)
    valid = target != ignore_index
    # Per-lane running max and sum of exp; lanes are merged once after the loop.
    m = tl.full([BLOCK], float("-inf"), COMPUTE_DTYPE)
    d = tl.zeros([BLOCK], COMPUTE_DTYPE)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(row_ptr + cols, mask=cols < n_cols, other=float("-inf")).to(COMPUTE_DTYPE)
        m_new = tl.maximum(m, x)
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # all -inf so far: avoid inf - inf
        d = d * tl.exp(m - shift) + tl.exp(x - shift)
        m = m_new
    row_max = tl.max(m, axis=0)
    lse = row_max + tl.log(tl.sum(d * tl.exp(m - row_max), axis=0))
    in_range = valid & (target >= 0) & (target < n_cols)
    target_logit = tl.load(row_ptr + target, mask=in_range, other=0.0).to(COMPUTE_DTYPE)
    tl.store(loss_ptr + row, tl.where(valid, lse - target_logit, 0.0))
    if COMPUTE_GRAD:
        # scale is 1 (sum) or 1 / n_valid (mean, inf when nothing is valid: then no row is valid
        # and every row is multiplied by 0, never by inf).
        scale = tl.where(valid, tl.load(scale_ptr).to(COMPUTE_DTYPE), 0.0)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < n_cols
            x = tl.load(row_ptr + cols, mask=mask, other=0.0).to(COMPUTE_DTYPE)
            grad = (tl.exp(x - lse) - tl.where(cols == target, 1.0, 0.0)) * scale
            tl.store(row_ptr + cols, grad.to(logits_ptr.dtype.element_ty), mask=mask)


def default_chunk_size(vocab_size: int, dtype: torch.dtype) -> int:
    """Rows per chunk so that one logits chunk stays within ``LOGITS_CHUNK_BYTES`` (whole 256-row
    tiles when at least one fits, else a multiple of 16, at least 16)."""
    rows = LOGITS_CHUNK_BYTES // max(1, vocab_size * torch.empty((), dtype=dtype).element_size())
    return rows // 256 * 256 if rows >= 256 else max(16, rows // 16 * 16)


def _loss_dtype(x: Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _grad_shapes(x, weight, bias, compute_grad_x, compute_grad_weight, compute_grad_bias):
    """(grad_x, grad_weight, grad_bias) buffers; [0]-sized where not computed."""
    none = x.new_empty(0)
    return (
        torch.empty_like(x, memory_format=torch.contiguous_format) if compute_grad_x else none,
        torch.empty_like(weight, memory_format=torch.contiguous_format) if compute_grad_weight else x.new_empty(0),
        torch.empty_like(bias, memory_format=torch.contiguous_format) if compute_grad_bias else x.new_empty(0),
    )


def _fused_linear_cross_entropy_impl(
    x: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None, ignore_index: int, reduction: str,
    chunk_size: int, compute_grad_x: bool, compute_grad_weight: bool, compute_grad_bias: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    grad_x, grad_weight, grad_bias = _grad_shapes(
        x, weight, bias, compute_grad_x, compute_grad_weight, compute_grad_bias
    )
    compute_grad = compute_grad_x or compute_grad_weight or compute_grad_bias
    hidden, vocab = x.shape[-1], weight.shape[0]
    x2, target1 = x.reshape(-1, hidden), target.reshape(-1)
    grad_x2 = grad_x.view(-1, hidden) if compute_grad_x else grad_x
    n_rows = x2.shape[0]
    loss_dtype = _loss_dtype(x)
    row_loss = torch.empty(n_rows, dtype=loss_dtype, device=x.device)
    n_valid = (target1 != ignore_index).sum()
    # A device tensor, so mean's 1/n_valid never synchronises the host.
    scale = (1.0 / n_valid.to(loss_dtype)) if reduction == "mean" else torch.ones((), dtype=loss_dtype, device=x.device)
    grad_bias_acc = torch.zeros(vocab, dtype=loss_dtype, device=x.device) if compute_grad_bias else None
    logits_buffer = x.new_empty((min(chunk_size, n_rows), vocab))
    if interpreting():
        block, num_warps = min(triton.next_power_of_2(vocab), 65536), 1
    else:
        block, num_warps = min(triton.next_power_of_2(vocab), _VOCAB_BLOCK), _VOCAB_WARPS
    for start in range(0, n_rows, chunk_size):
        end = min(start + chunk_size, n_rows)
        x_chunk = x2[start:end]
        logits = logits_buffer[: end - start]
        if bias is None:
            torch.mm(x_chunk, weight.t(), out=logits)
        else:
            torch.addmm(bias, x_chunk, weight.t(), out=logits)
        _fused_linear_cross_entropy_fwd_kernel[(end - start,)](
            logits, target1[start:end], row_loss[start:end], scale, logits.stride(0), vocab, ignore_index,
            COMPUTE_GRAD=compute_grad, BLOCK=block, COMPUTE_DTYPE=compute_dtype(x.dtype), num_warps=num_warps,
        )
        if not compute_grad:
            continue
        # `logits` now holds d(loss)/d(logits) for the chunk.
        if compute_grad_x:
            torch.mm(logits, weight, out=grad_x2[start:end])
        if compute_grad_weight:
            if start == 0:
                torch.mm(logits.t(), x_chunk, out=grad_weight)  # no zero-fill, no first read
            else:
                grad_weight.addmm_(logits.t(), x_chunk)
        if compute_grad_bias:
            grad_bias_acc += logits.sum(0, dtype=loss_dtype)
    if n_rows == 0 and compute_grad_weight:
        grad_weight.zero_()
    if compute_grad_bias:
        grad_bias.copy_(grad_bias_acc)
    loss = row_loss.sum() * scale
    return loss, grad_x, grad_weight, grad_bias


def _fused_linear_cross_entropy_fake(
    x: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None, ignore_index: int, reduction: str,
    chunk_size: int, compute_grad_x: bool, compute_grad_weight: bool, compute_grad_bias: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    loss = x.new_empty((), dtype=_loss_dtype(x))
    return (loss, *_grad_shapes(x, weight, bias, compute_grad_x, compute_grad_weight, compute_grad_bias))


def _fused_linear_cross_entropy_setup_context(ctx, inputs, output):
    gradients = output[1:]
    # The gradient outputs are results, not functions of the inputs: no gradient flows into them,
    # and none is materialised (a zero grad_weight-sized tensor) for them in backward.
    ctx.mark_non_differentiable(*gradients)
    ctx.set_materialize_grads(False)
    # Kept as detached attributes rather than saved tensors: backward scales them in place, which
    # the saved-tensor version check would reject on a second backward. Detached, so that no
    # output -> grad_fn -> ctx -> output reference cycle keeps them alive.
    ctx.gradients = tuple(g.detach() for g in gradients)
    ctx.computed = inputs[-3:]
    ctx.applied_scale = None


def _fused_linear_cross_entropy_backward(ctx, grad_loss, *_grads_of_gradient_outputs):
    if grad_loss is None:  # the loss was not used (grads are not materialised)
        return (None,) * 10
    grad_x, grad_weight, grad_bias = ctx.gradients
    if type(grad_loss) is torch.Tensor and not torch.compiler.is_compiling():
        # Eager: scale in place; a second grad_weight-sized tensor would double the op's memory.
        # A second backward through the same graph (retain_graph=True, gradcheck) rescales by
        # new / previous scale; if the previous scale was exactly 0 the gradients come out nan
        # (loud, not silently wrong).
        factor = grad_loss if ctx.applied_scale is None else grad_loss / ctx.applied_scale
        for grad in (grad_x, grad_weight, grad_bias):
            grad.mul_(factor.to(grad.dtype))
        ctx.applied_scale = grad_loss
    else:
        # Traced (AOTAutograd/Inductor): a graph must not mutate forward outputs (the partitioner
        # rejects it), and a plain multiply lets Inductor fuse it and reuse the saved buffers,
        # which AOTAutograd donates to the backward graph.
        grad_x, grad_weight, grad_bias = (g * grad_loss.to(g.dtype) for g in (grad_x, grad_weight, grad_bias))
    computed_x, computed_weight, computed_bias = ctx.computed
    return (
        grad_x if computed_x else None,
        grad_weight if computed_weight else None,
        None,
        grad_bias if computed_bias else None,
        None, None, None, None, None, None,
    )


# Opaque to Inductor even on a GPU (a custom_op, not a triton_op): the impl reuses one logits
# buffer across chunks through out= matmuls, in-place addmm_ and an in-place kernel, which a traced
# (functionalized) impl would turn into a fresh tensor per chunk, losing the bounded memory that is
# the op's point; and it runs once per step, so its ~0.3 ms of dispatch is ~1% of the step.
_fused_linear_cross_entropy_op = define_op(
    "fused_linear_cross_entropy", _fused_linear_cross_entropy_impl, fake=_fused_linear_cross_entropy_fake,
    backward=_fused_linear_cross_entropy_backward, setup_context=_fused_linear_cross_entropy_setup_context,
    inline_kernels=False,
)


def _check(x, weight, target, bias, reduction, chunk_size) -> None:
    op = "fused_linear_cross_entropy"
    if reduction not in _REDUCTIONS:
        raise ValueError(
            f"{op}: reduction={reduction!r}; use one of {_REDUCTIONS} (gradients are precomputed for a "
            f"scalar loss), or {op}_reference for 'none'."
        )
    if x.dim() == 0 or weight.dim() != 2 or weight.shape[1] != x.shape[-1]:
        raise ValueError(
            f"{op}: x is {tuple(x.shape)} and weight is {tuple(weight.shape)}; pass x [..., hidden] "
            "and weight [vocab, hidden] (an nn.Linear / lm_head weight)."
        )
    if target.shape != x.shape[:-1] or target.dtype.is_floating_point or target.dtype.is_complex:
        raise ValueError(
            f"{op}: target is {tuple(target.shape)} {target.dtype}; pass integer class indices shaped "
            f"like x without its last dimension, {tuple(x.shape[:-1])}."
        )
    if weight.dtype != x.dtype or (bias is not None and bias.dtype != x.dtype):
        raise ValueError(
            f"{op}: dtypes x={x.dtype}, weight={weight.dtype}, bias={None if bias is None else bias.dtype}; "
            "cast them to one dtype (as F.linear requires)."
        )
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"{op}: bias is {tuple(bias.shape)}; pass [vocab] = [{weight.shape[0]}].")
    if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError(f"{op}: chunk_size={chunk_size!r}; pass a positive int, or None for the default.")


def fused_linear_cross_entropy(
    x: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None = None, ignore_index: int = -100,
    reduction: str = "mean", *, chunk_size: int | None = None,
) -> Tensor:
    """``F.cross_entropy(F.linear(x, weight, bias).float(), target, ...)`` without full logits.

    Args:
        x (`torch.Tensor`): ``[..., hidden]`` hidden states.
        weight (`torch.Tensor`): ``[vocab, hidden]`` (the LM head), x's dtype.
        target (`torch.Tensor`): integer labels shaped ``x.shape[:-1]``.
        bias (`torch.Tensor`, *optional*): ``[vocab]``.
        ignore_index (`int`, defaults to -100): targets excluded from the loss and the mean.
        reduction (`str`, defaults to ``"mean"``): ``"mean"`` or ``"sum"``.
        chunk_size (`int`, *optional*): tokens per chunk; default keeps one logits chunk within
            320 MiB (see the module docstring).

    Returns:
        `torch.Tensor`: scalar fp32 loss (fp64 for fp64 inputs).

    Raises:
        ValueError: unsupported reduction, or shapes/dtypes that F.linear / F.cross_entropy reject.

    Example:
        ```python
        loss = fused_linear_cross_entropy(hidden[:, :-1], model.lm_head.weight, labels[:, 1:])
        loss.backward()
        ```
    """
    _check(x, weight, target, bias, reduction, chunk_size)
    if chunk_size is None:
        chunk_size = default_chunk_size(weight.shape[0], x.dtype)
    grad = torch.is_grad_enabled()
    return _fused_linear_cross_entropy_op(
        x, weight, target, bias, int(ignore_index), reduction, chunk_size,
        grad and x.requires_grad, grad and weight.requires_grad,
        grad and bias is not None and bias.requires_grad,
    )[0]


def fused_linear_cross_entropy_reference(
    x: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None = None, ignore_index: int = -100,
    reduction: str = "mean", *, chunk_size: int | None = None,
) -> Tensor:
    """Plain PyTorch ``fused_linear_cross_entropy`` (materialises the logits; chunk_size unused)."""
    logits = torch.nn.functional.linear(x, weight, bias).float()
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=ignore_index, reduction=reduction
    )
