"""LM head + cross-entropy without materialising the (tokens x vocab) logits.

``fused_linear_cross_entropy(x, weight, target, bias)`` equals
``F.cross_entropy(F.linear(x, weight, bias).float(), target, ignore_index=..., reduction=...)``,
optionally with label smoothing, a z-loss (``z_loss * logsumexp(logits)**2`` per token, PaLM) and
logit soft-capping (``softcap * tanh(logits / softcap)``, Gemma 2) applied to the logits first.

Three strategies compute it, one module each:

- ``strategy="chunked"`` (this module; the default, and whenever ``chunk_size`` is given): cuBLAS
  computes the logits of ``chunk_size`` tokens into one reused buffer, a Triton row kernel turns them
  into the loss and, in place, into d(loss)/d(logits) up to a factor per row (one pass over the logits,
  below); cuBLAS then writes grad_x and accumulates grad_W, the factors applied to grad_x's rows and to
  the chunk's x. Gradients are computed in the forward (like Liger), exact, but the logits chunk costs
  ``chunk_size * vocab * itemsize`` bytes (``LOGITS_CHUNK_BYTES``, 512 MiB by default). It supports
  ``reduction`` mean/sum without the options above.
- ``strategy="vocab_chunked"`` (:mod:`.fused_linear_cross_entropy_vocab_chunked`; exact, low memory,
  the default when an option the chunked strategy lacks is asked for without ``filter_eps``): the
  tiled forward, and a backward that recomputes the logits a vocabulary chunk at a time.
- ``strategy="tiled"`` (:mod:`.fused_linear_cross_entropy_tiled`): the logits only ever exist as one
  tile in registers; with ``filter_eps`` it skips the tiles whose gradient is below it (fast, not
  exact), without it exact and slow.

Measured by ``twinkle-fx bench --micro`` on an H100 (torch 2.11, triton 3.6; 4096 tokens x 896 ->
151936 vocab, bf16, every 7th label -100, forward + backward, one run): tiled with
``filter_eps="auto"`` 4.67 ms / 0.261 GiB extra; Cut Cross-Entropy (filtering by default) 6.71 /
0.262; Inductor 6.82 / 1.42; chunked (exact, the default) 6.8 / 0.55; eager 15.3 / 6.96.
The exact strategies on one H100 (tools/flce_vocab_sweep.py, same shape, one run; relative error of
grad_x against fp32 in brackets, weights at init scale): chunked 7.02 ms / 0.550 GiB (3.0e-3);
vocab_chunked 9.40 ms / 0.312 GiB with 4096-column chunks (3.0e-3), 9.18 / 0.344 with 8192, 8.79 / 0.406
with 16384, 18.3 / 0.297 with 2048 (host-bound), measured when its backward rounded the
logits to bf16 (it takes them in fp32 now, 4 bytes more per chunk entry); beside them tiled with
``filter_eps="auto"`` 4.67 / 0.261 (2.0e-2: it drops the flat softmax's small entries), Cut
Cross-Entropy 6.61 / 0.262 (2.0e-2, filtering too), Inductor 6.60 / 1.42 (3.0e-3).

Why no exact strategy has the filtered one's memory at its speed: on that shape the two gradients
alone are 0.2604 GiB (grad_W 0.2536, grad_x 0.0068), so there is no room for a logits chunk (the
chunked strategy's three matmuls) or an fp32 accumulator; exact gradients then need grad_W tiles added
in bf16 under locks (37 ms, and 1.2e-2 from fp32 after the bf16 adds) or the logits recomputed per
column block of grad_W (six or more matmul passes against three).

Semantics: ``reduction="mean"`` divides by the number of non-ignored targets; with every target
ignored the mean is nan (0/0) and gradients are zero, exactly like ``F.cross_entropy``;
``reduction="sum"`` gives 0 then, ``"none"`` a zero per token. The loss is fp32 (fp64 for fp64
inputs). Out-of-range targets are not checked (that would synchronise the device); such rows get
loss = lse.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._checks import ANY_DTYPE, check_tensors
from ._flce_autograd import gradient_buffers
from ._launch import (accumulation_dtype, cdiv, compute_dtype, interpreting, loop_block, next_power_of_2,
                      persistent_programs)
from ._library import define_op
from .fused_linear_cross_entropy_tiled import row_loss_reference, tiled_op
from .fused_linear_cross_entropy_vocab_chunked import default_vocab_chunk, vocab_chunked_op

LOGITS_CHUNK_BYTES = 512 * 1024 * 1024
# The row kernels' launches: columns per loop step over the vocabulary, warps, programs per SM (each looping over
# rows); the two-pass kernel's gradient pass may walk the row backwards (its first reads are then the columns the
# max/sum pass read last, still in L2). "one_pass": None makes the gradients take two passes too. One H200, bf16,
# the kernel alone over a chunk's logits (tools/flce_chunked_sweep.py, docs/performance/flce-chunked-h200.json):
# two passes at their best (the setting below) 0.394 ms a 1366-row chunk at Qwen2-0.5B's head, 0.500 / 0.507 a
# 2048-row chunk at Llama-3.2-1B's / -3B's (3.1 TB/s of three passes); one pass with four programs an SM, 8 warps and
# 4K columns 0.276, 0.323 and 0.327 (3.0-3.3 TB/s of two passes), two programs with 16 warps and 8K 0.281-0.351,
# eight with 4 warps and 2K 0.290-0.311. The loss and gradients stay 3e-3 from fp32 (relative), as PyTorch's in bf16.
ROW_KERNEL = {
    "one_pass": {"block": 4096, "warps": 8, "programs_per_sm": 4},
    "two_passes": {"block": 16384, "warps": 32, "programs_per_sm": 2, "reverse": True},
}
# One pass: a row's logits x are replaced by exp(x - s), s the largest logit of the row's first block, while the
# sum of exp(x - s) accumulates; the gradient is then a * exp(x - s) with a = exp(s - lse) * scale per row, and the
# target's entry exp(x_t - s) - exp(lse - s). A later block whose largest logit exceeds s by more than
# SHIFT_SPREAD moves s there (the stored entries stay at most exp(SHIFT_SPREAD), far from overflowing in bf16,
# fp32 or fp64 and in the GEMMs' fp32 sums over the vocabulary); a row whose s moved redoes its blocks, scaled to
# the gradient (a = 1). fp16's range (exp(11) overflows it) keeps the two-pass kernel.
SHIFT_SPREAD = 32.0
_ONE_PASS_DTYPES = (torch.bfloat16, torch.float32, torch.float64)


@triton.jit
def _fused_linear_cross_entropy_fwd_kernel(
    logits_ptr, target_ptr, loss_ptr, scale_ptr, logits_row_stride, n_rows, n_cols, ignore_index,
    COMPUTE_GRAD: tl.constexpr, BLOCK: tl.constexpr, COMPUTE_DTYPE: tl.constexpr, REVERSE: tl.constexpr,
):
    """Two passes over each row: the max and sum of exp, then (``COMPUTE_GRAD``) the gradient in place."""
    for row32 in range(tl.program_id(0), n_rows, tl.num_programs(0)):
        row = tl.cast(row32, tl.int64)
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
            n_blocks = tl.cdiv(n_cols, BLOCK)
            for block in range(n_blocks):
                start = ((n_blocks - 1 - block) if REVERSE else block) * BLOCK
                cols = start + tl.arange(0, BLOCK)
                mask = cols < n_cols
                x = tl.load(row_ptr + cols, mask=mask, other=0.0).to(COMPUTE_DTYPE)
                grad = (tl.exp(x - lse) - tl.where(cols == target, 1.0, 0.0)) * scale
                tl.store(row_ptr + cols, grad.to(logits_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _fused_linear_cross_entropy_one_pass_kernel(
    logits_ptr, target_ptr, loss_ptr, scale_ptr, row_scale_ptr, shifts_ptr, logits_row_stride, n_rows, n_cols,
    ignore_index, SPREAD: tl.constexpr, BLOCK: tl.constexpr, COMPUTE_DTYPE: tl.constexpr,
):
    """One pass over each row: the loss, and in place the gradient divided by the row's ``row_scale`` (the comment
    above ``SHIFT_SPREAD``); a row whose shift moved is made the gradient itself in a second pass."""
    n_blocks = tl.cdiv(n_cols, BLOCK)
    for row32 in range(tl.program_id(0), n_rows, tl.num_programs(0)):
        row = tl.cast(row32, tl.int64)
        row_ptr = logits_ptr + row * logits_row_stride
        target = tl.load(target_ptr + row).to(tl.int64)
        valid = target != ignore_index
        in_range = valid & (target >= 0) & (target < n_cols)
        # read before the row is overwritten
        target_logit = tl.load(row_ptr + target, mask=in_range, other=0.0).to(COMPUTE_DTYPE)
        s = tl.full([], float("-inf"), COMPUTE_DTYPE)  # -inf until a block has a finite logit
        moves = 0
        d = tl.zeros([BLOCK], COMPUTE_DTYPE)  # per-lane sums of exp(x - s)
        for block in range(n_blocks):
            cols = block * BLOCK + tl.arange(0, BLOCK)
            mask = cols < n_cols
            x = tl.load(row_ptr + cols, mask=mask, other=float("-inf")).to(COMPUTE_DTYPE)
            block_max = tl.max(x, axis=0)
            new_s = tl.where(block_max > s + SPREAD, block_max, s)  # -inf + SPREAD is -inf; nan never moves s
            moves += (new_s != s).to(tl.int32)
            # the sums so far to the new shift (0 while s was -inf: every exp so far was 0)
            d = d * tl.exp(tl.where(s == float("-inf"), 0.0, s - new_s))
            s = new_s
            e = tl.exp(x - tl.where(s == float("-inf"), 0.0, s))
            d += e
            tl.store(row_ptr + cols, e.to(logits_ptr.dtype.element_ty), mask=mask)
            tl.store(shifts_ptr + row * n_blocks + block, s)
        s_safe = tl.where(s == float("-inf"), 0.0, s)
        lse = s_safe + tl.log(tl.sum(d, axis=0))
        tl.store(loss_ptr + row, tl.where(valid, lse - target_logit, 0.0))
        # scale is 1 (sum) or 1 / n_valid (mean, inf when nothing is valid: then no row is valid
        # and every row is multiplied by 0, never by inf).
        scale = tl.where(valid, tl.load(scale_ptr).to(COMPUTE_DTYPE), 0.0)
        tl.debug_barrier()  # the row's stores above, before it is read or written again
        if moves > 1:  # blocks stored at two shifts: make the row the gradient itself
            for block in range(n_blocks):
                cols = block * BLOCK + tl.arange(0, BLOCK)
                mask = cols < n_cols
                s_block = tl.load(shifts_ptr + row * n_blocks + block)
                e = tl.load(row_ptr + cols, mask=mask, other=0.0).to(COMPUTE_DTYPE)
                grad = (e * tl.exp(tl.where(s_block == float("-inf"), 0.0, s_block) - lse)
                        - tl.where(cols == target, 1.0, 0.0)) * scale
                tl.store(row_ptr + cols, grad.to(logits_ptr.dtype.element_ty), mask=mask)
            tl.store(row_scale_ptr + row, 1.0)
        else:
            target_entry = tl.exp(target_logit - s_safe) - tl.exp(lse - s_safe)
            tl.store(row_ptr + target, target_entry.to(logits_ptr.dtype.element_ty), mask=in_range)
            tl.store(row_scale_ptr + row, tl.exp(s_safe - lse) * scale)


def _row_programs(n_rows: int, device: torch.device, launch: dict) -> int:
    """``programs_per_sm`` programs an SM, each looping over rows; 0: a program a row."""
    per_sm = launch["programs_per_sm"]
    return persistent_programs(n_rows, device, per_sm=per_sm) if per_sm else max(n_rows, 1)


# Chunk size of the chunked strategy: extra memory is grad_W plus one logits chunk, ``chunk_size *
# vocab * itemsize``. Small chunks are slow: every chunk re-reads and re-writes grad_W (272 MB at vocab
# 151936 x 896) and its GEMMs have a small M. H200, torch 2.11, 4096 tokens x 896 -> 151936, bf16, fwd+bwd:
#     chunk rows   128     256     512     1024    2048    4096
#     ms           13.62   8.85    7.12    6.55    6.66    6.29
#     extra GiB    0.297   0.333   0.405   0.550   0.840   1.420
# The budget, 512 MiB, over 320 (H200, torch 2.11, 4096 tokens, fwd+bwd, chunk rows: ms): at Llama-3.2-1B's head
# (2048 -> 128256) 1280: 11.76, 2048: 11.13; at Llama-3.2-3B's (3072) 1280: 17.28, 2048: 16.95; at Qwen2-0.5B's
# 1024: 7.10 (0.55 GiB extra), 1366: 7.00 (0.65 GiB). Fewer chunks: fewer grad_W updates, each a pass over grad_W.
def default_chunk_size(vocab_size: int, dtype: torch.dtype, n_rows: int | None = None) -> int:
    """Rows per chunk so that one logits chunk stays within ``LOGITS_CHUNK_BYTES`` (whole 256-row
    tiles when at least one fits, else a multiple of 16, at least 16). Given the ``n_rows`` to split:
    as many chunks as that takes, of equal size (the last one a few rows smaller). Under a 320 MiB budget 4096
    rows at vocab 128256 made three chunks of 1280 and a last one of 256 rows, whose grad_W update (a pass over
    all of grad_W, like every chunk's) ran at half the matmul speed of the others (H200)."""
    rows = LOGITS_CHUNK_BYTES // max(1, vocab_size * dtype.itemsize)
    rows = rows // 256 * 256 if rows >= 256 else max(16, rows // 16 * 16)
    if isinstance(n_rows, int) and n_rows > rows:  # a symbolic row count keeps the budget's size
        chunks = -(-n_rows // rows)
        rows = -(-n_rows // chunks)
    return rows


def _mm_accumulated(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` with the result in the accumulation dtype (fp32 from bf16 inputs), rounded once from there."""
    out_dtype = accumulation_dtype(a.dtype)
    if a.dtype == out_dtype:
        return torch.mm(a, b)
    if a.device.type == "cuda":
        return torch.mm(a, b, out_dtype=out_dtype)
    return torch.mm(a.to(out_dtype), b.to(out_dtype))  # no mixed-dtype mm here; exact, and not a fast path


def _add_mm(out: Tensor, a: Tensor, b: Tensor, *, first: bool) -> None:
    """``out = a @ b`` for the first chunk (no zero-fill, no first read), else ``out += a @ b``."""
    if first:
        torch.mm(a, b, out=out)
    else:
        out.addmm_(a, b)


def _fused_linear_cross_entropy_impl(
    x: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None, ignore_index: int, reduction: str,
    chunk_size: int, compute_grad_x: bool, compute_grad_weight: bool, compute_grad_bias: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    grad_x, grad_weight, grad_bias = gradient_buffers(
        x, weight, bias, compute_grad_x, compute_grad_weight, compute_grad_bias
    )
    compute_grad = compute_grad_x or compute_grad_weight or compute_grad_bias
    hidden, vocab = x.shape[-1], weight.shape[0]
    # the row kernel reads the labels at unit stride
    x2, target1 = x.reshape(-1, hidden), target.reshape(-1).contiguous()
    grad_x2 = grad_x.view(-1, hidden) if compute_grad_x else grad_x
    n_rows = x2.shape[0]
    loss_dtype = accumulation_dtype(x.dtype)
    row_loss = torch.empty(n_rows, dtype=loss_dtype, device=x.device)
    n_valid = (target1 != ignore_index).sum()
    # A device tensor, so mean's 1/n_valid never synchronises the host.
    scale = (1.0 / n_valid.to(loss_dtype)) if reduction == "mean" else torch.ones((), dtype=loss_dtype, device=x.device)
    grad_bias_acc = torch.zeros(vocab, dtype=loss_dtype, device=x.device) if compute_grad_bias else None
    chunk_rows = min(chunk_size, n_rows)
    logits_buffer = x.new_empty((chunk_rows, vocab))
    # the bias's gradient sums the gradient's columns, which one pass leaves scaled per row
    one_pass = (ROW_KERNEL["one_pass"] is not None and compute_grad and not compute_grad_bias
                and x.dtype in _ONE_PASS_DTYPES)
    launch = ROW_KERNEL["one_pass" if one_pass else "two_passes"]
    block = loop_block(vocab, min(next_power_of_2(vocab), launch["block"]))
    num_warps = 1 if interpreting() else launch["warps"]
    if one_pass:
        row_scale = torch.empty(chunk_rows, dtype=loss_dtype, device=x.device)
        shifts = torch.empty(chunk_rows * cdiv(vocab, block), dtype=loss_dtype, device=x.device)
        scaled_x_buffer = x.new_empty((chunk_rows, hidden)) if compute_grad_weight else None
    for start in range(0, n_rows, chunk_size):
        end = min(start + chunk_size, n_rows)
        x_chunk = x2[start:end]
        logits = logits_buffer[: end - start]
        if bias is None:
            torch.mm(x_chunk, weight.t(), out=logits)
        else:
            torch.addmm(bias, x_chunk, weight.t(), out=logits)
        grid = (_row_programs(end - start, x.device, launch),)
        if one_pass:
            _fused_linear_cross_entropy_one_pass_kernel[grid](
                logits, target1[start:end], row_loss[start:end], scale, row_scale, shifts, logits.stride(0),
                end - start, vocab, ignore_index, SPREAD=SHIFT_SPREAD, BLOCK=block,
                COMPUTE_DTYPE=compute_dtype(x.dtype), num_warps=num_warps,
            )
            # `logits` now holds d(loss)/d(logits) for the chunk divided by `row_scale` row by row
            factors = row_scale[: end - start, None]
            if compute_grad_x:
                torch.mul(_mm_accumulated(logits, weight), factors, out=grad_x2[start:end])
            if compute_grad_weight:
                scaled_x = torch.mul(x_chunk, factors, out=scaled_x_buffer[: end - start])  # rounded once
                _add_mm(grad_weight, logits.t(), scaled_x, first=start == 0)
            continue
        _fused_linear_cross_entropy_fwd_kernel[grid](
            logits, target1[start:end], row_loss[start:end], scale, logits.stride(0), end - start, vocab, ignore_index,
            COMPUTE_GRAD=compute_grad, BLOCK=block, COMPUTE_DTYPE=compute_dtype(x.dtype),
            REVERSE=launch["reverse"], num_warps=num_warps,
        )
        if not compute_grad:
            continue
        # `logits` now holds d(loss)/d(logits) for the chunk.
        if compute_grad_x:
            torch.mm(logits, weight, out=grad_x2[start:end])
        if compute_grad_weight:
            _add_mm(grad_weight, logits.t(), x_chunk, first=start == 0)
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
    loss = x.new_empty((), dtype=accumulation_dtype(x.dtype))
    return (loss, *gradient_buffers(x, weight, bias, compute_grad_x, compute_grad_weight, compute_grad_bias))


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


# strategy="chunked". Opaque to Inductor even on a GPU (a custom_op, not a triton_op): the impl reuses one logits
# buffer across chunks through out= matmuls, in-place addmm_ and an in-place kernel, which a traced
# (functionalized) impl would turn into a fresh tensor per chunk, losing the bounded memory that is
# the op's point; and it runs once per step, so its ~0.3 ms of dispatch is ~1% of the step. Autograd
# wired by hand (define_op), not declared with define_differentiable_op: the gradients are computed in
# the forward and the backward only scales them, in place when eager.
_fused_linear_cross_entropy_op = define_op(
    "fused_linear_cross_entropy", _fused_linear_cross_entropy_impl, fake=_fused_linear_cross_entropy_fake,
    backward=_fused_linear_cross_entropy_backward, setup_context=_fused_linear_cross_entropy_setup_context,
    inline_kernels=False,
    # the loss; the gradients then come from autograd through the reference
    reference=lambda x, weight, target, bias, ignore_index, reduction, *_: (
        fused_linear_cross_entropy_reference(x, weight, target, bias, ignore_index, reduction), None, None, None),
)


_STRATEGIES = ("tiled", "chunked", "vocab_chunked")
_REDUCTIONS = ("mean", "sum", "none")


def _resolve_filter_eps(filter_eps: float | str | None, dtype: torch.dtype) -> float:
    if filter_eps is None:
        return 0.0
    if filter_eps == "auto":
        # what Cut Cross-Entropy uses: entries below eps/32 of the dtype (2^-12 for bf16) are far
        # under one rounding step of any gradient entry they would be added to at order-1 scale
        return torch.finfo(dtype).eps / 32
    return float(filter_eps)


def _check(x, weight, target, bias, reduction, options) -> None:
    op = "fused_linear_cross_entropy"
    check_tensors(op, min_dim=1, x=x, weight=weight, bias=bias)
    check_tensors(op, dtypes=ANY_DTYPE, x=x, target=target)
    strategy, chunk_size = options["strategy"], options["chunk_size"]
    if strategy not in (None, *_STRATEGIES):
        raise ValueError(f"{op}: strategy={strategy!r}; use one of {_STRATEGIES} or None (tiled, or chunked "
                         "when chunk_size is given).")
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{op}: reduction={reduction!r}; use one of {_REDUCTIONS}.")
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
    if chunk_size is not None and (not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1):
        raise ValueError(f"{op}: chunk_size={chunk_size!r}; pass a positive int, or None for the default.")
    if not 0.0 <= options["label_smoothing"] <= 1.0:
        raise ValueError(f"{op}: label_smoothing={options['label_smoothing']!r}; pass a float in [0, 1].")
    if options["z_loss"] < 0:
        raise ValueError(f"{op}: z_loss={options['z_loss']!r}; pass a float >= 0 (the weight of lse**2).")
    if options["softcap"] is not None and not options["softcap"] > 0:
        raise ValueError(f"{op}: softcap={options['softcap']!r}; pass a positive float (Gemma 2: 30.0) or None.")
    eps = options["filter_eps"]
    if not (eps is None or eps == "auto" or (isinstance(eps, (int, float)) and not isinstance(eps, bool) and eps >= 0)):
        raise ValueError(f"{op}: filter_eps={eps!r}; pass 'auto', a float >= 0, or None (exact gradients).")
    if strategy == "vocab_chunked":
        if eps is not None or options["fp32_accumulation"]:
            raise ValueError(f"{op}: filter_eps / fp32_accumulation apply to strategy='tiled'; "
                             "strategy='vocab_chunked' is exact and accumulates grad_x in fp32 already.")
    elif strategy == "chunked" or (strategy is None and chunk_size is not None):
        extras = [k for k in ("label_smoothing", "z_loss", "softcap") if options[k]]
        if reduction == "none" or extras:
            asked = extras + (["reduction='none'"] if reduction == "none" else [])
            raise ValueError(f"{op}: the chunked strategy (chunk_size={chunk_size!r}) supports reduction "
                             f"'mean' / 'sum' only, without {', '.join(asked)}; use strategy='vocab_chunked' (exact) or 'tiled'.")
    elif chunk_size is not None:
        raise ValueError(f"{op}: chunk_size={chunk_size!r} applies to strategy='chunked' (tokens) or "
                         f"'vocab_chunked' (vocabulary columns), not {strategy!r}.")


def fused_linear_cross_entropy(
    x: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None = None, ignore_index: int = -100,
    reduction: str = "mean", *, label_smoothing: float = 0.0, z_loss: float = 0.0, softcap: float | None = None,
    strategy: str | None = None, chunk_size: int | None = None, filter_eps: float | str | None = None,
    fp32_accumulation: bool = False,
) -> Tensor:
    """``F.cross_entropy(F.linear(x, weight, bias).float(), target, ...)`` without the logits.

    Args:
        x (`torch.Tensor`): ``[..., hidden]`` hidden states.
        weight (`torch.Tensor`): ``[vocab, hidden]`` (the LM head), x's dtype.
        target (`torch.Tensor`): integer labels shaped ``x.shape[:-1]``.
        bias (`torch.Tensor`, *optional*): ``[vocab]``.
        ignore_index (`int`, defaults to -100): targets excluded from the loss and the mean.
        reduction (`str`, defaults to ``"mean"``): ``"mean"``, ``"sum"`` or ``"none"`` (a loss per token,
            shaped like ``target``).
        label_smoothing (`float`, defaults to 0): as ``F.cross_entropy(label_smoothing=...)``.
        z_loss (`float`, defaults to 0): adds ``z_loss * logsumexp(logits)**2`` per non-ignored token.
        softcap (`float`, *optional*): logits become ``softcap * tanh(logits / softcap)`` first (Gemma 2's
            ``final_logit_softcapping``).
        strategy (`str`, *optional*): ``"chunked"``, ``"vocab_chunked"`` or ``"tiled"``; by default
            chunked (exact, and as fast as Inductor); vocab_chunked (exact) when an option chunked lacks
            is asked for (``label_smoothing``, ``z_loss``, ``softcap``, ``reduction="none"``); tiled when
            ``filter_eps`` or ``fp32_accumulation`` is given. See the module docstring.
        chunk_size (`int`, *optional*): chunked strategy: tokens per logits chunk (default: chunks of
            equal size within 512 MiB each); vocab_chunked: vocabulary entries per chunk (default: one chunk
            of fp32 logits and their gradient within ``VOCAB_CHUNK_BYTES``, 96 MiB).
        filter_eps (`float` or `"auto"` or `None`, defaults to `None`): tiled strategy: skip the
            gradient products of a tile whose d(loss)/d(logits) entries are all below this (``"auto"``:
            2^-12 in bf16, Cut Cross-Entropy's default); `None` is exact. Filtering is fast (4.7 ms
            against 6.8 on the shape above) but not exact, and most inexact where the softmax is flat:
            at random initialisation (32k vocab, bf16, H100) it put the final norm's weight gradient
            35% away from fp32, where plain PyTorch bf16 is 3% away. Use it on trained models only.
        fp32_accumulation (`bool`, defaults to `False`): tiled strategy: accumulate grad_x and grad_W in
            fp32 (costs an fp32 copy of the weight's size) instead of in their own dtype.

    Returns:
        `torch.Tensor`: fp32 loss (fp64 for fp64 inputs), a scalar or per token (``"none"``).

    Raises:
        TypeError: x, weight or bias is not a floating-point tensor.
        ValueError: an unknown option value, an option the chosen strategy lacks, shapes/dtypes that
            F.linear / F.cross_entropy reject, or tensors on two devices.

    Example:
        ```python
        loss = fused_linear_cross_entropy(hidden[:, :-1], model.lm_head.weight, labels[:, 1:])
        loss.backward()
        ```
    """
    if strategy is None and chunk_size is None:
        if filter_eps is not None or fp32_accumulation:
            strategy = "tiled"
        elif label_smoothing or z_loss or softcap is not None or reduction == "none":
            strategy = "vocab_chunked"  # exact; 9.4 ms where exact tiling takes 37 (module docstring)
        else:
            strategy = "chunked"
    options = {"label_smoothing": float(label_smoothing), "z_loss": float(z_loss), "softcap": softcap,
               "strategy": strategy, "chunk_size": chunk_size, "filter_eps": filter_eps,
               "fp32_accumulation": fp32_accumulation}
    _check(x, weight, target, bias, reduction, options)
    grad = torch.is_grad_enabled()
    hidden = x.shape[-1]
    target1 = target.reshape(-1).contiguous()
    if strategy == "vocab_chunked":
        x2 = x.reshape(-1, hidden)
        chunk = chunk_size if chunk_size is not None else default_vocab_chunk(x2.shape[0], weight.shape[0], x.dtype)
        row_loss, _ = vocab_chunked_op(
            x2, weight, target1, None if bias is None else bias.contiguous(), int(ignore_index),
            float(label_smoothing), float(z_loss), float(softcap or 0.0), int(chunk),
        )
        return _reduce(row_loss, target, target1, reduction, ignore_index)
    if strategy == "chunked" or (strategy is None and chunk_size is not None):
        if chunk_size is None:
            chunk_size = default_chunk_size(weight.shape[0], x.dtype, x.numel() // max(1, hidden))
        return _fused_linear_cross_entropy_op(
            x, weight, target, bias, int(ignore_index), reduction, chunk_size,
            grad and x.requires_grad, grad and weight.requires_grad,
            grad and bias is not None and bias.requires_grad,
        )[0]
    row_loss, _, _ = tiled_op(
        x.reshape(-1, hidden), weight, target1, None if bias is None else bias.contiguous(), int(ignore_index),
        float(label_smoothing), float(z_loss), float(softcap or 0.0), _resolve_filter_eps(filter_eps, x.dtype),
        bool(fp32_accumulation),
    )
    return _reduce(row_loss, target, target1, reduction, ignore_index)


def _reduce(row_loss: Tensor, target: Tensor, target1: Tensor, reduction: str, ignore_index: int) -> Tensor:
    if reduction == "none":
        return row_loss.reshape(target.shape)
    if reduction == "sum":
        return row_loss.sum()
    return row_loss.sum() / (target1 != ignore_index).sum()


def fused_linear_cross_entropy_reference(
    x: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None = None, ignore_index: int = -100,
    reduction: str = "mean", *, label_smoothing: float = 0.0, z_loss: float = 0.0, softcap: float | None = None,
    strategy: str | None = None, chunk_size: int | None = None, filter_eps: float | str | None = None,
    fp32_accumulation: bool = False,
) -> Tensor:
    """Plain PyTorch ``fused_linear_cross_entropy`` (materialises the logits; strategy, chunk_size,
    filter_eps and fp32_accumulation choose how the fused op computes and do not apply here)."""
    loss = row_loss_reference(x, weight, target, bias, ignore_index, label_smoothing, z_loss, softcap)
    return _reduce(loss, target, target.reshape(-1), reduction, ignore_index)
