"""The vocab-chunked strategy of :func:`~.fused_linear_cross_entropy.fused_linear_cross_entropy`
(``strategy="vocab_chunked"``, and the default when an option the chunked strategy lacks is asked for
without ``filter_eps``): exact, low memory; the backward recomputes the logits a vocabulary chunk at a time.

The forward is the tiled strategy's (:func:`~.fused_linear_cross_entropy_tiled.tiled_forward`:
logsumexp per token over fp32 logits, no logits kept); the backward goes over the vocabulary in chunks:
cuBLAS recomputes one chunk's logits (all tokens) in fp32 into one reused buffer, a Triton kernel turns
them into d(loss)/d(logits) in the input dtype, cuBLAS writes that chunk's rows of grad_W once (one
rounding, no read-modify-write, no atomics) and adds its share of grad_x into an fp32 tokens x hidden
accumulator. The logits are fp32 in both passes: a softmax of logits rounded to bf16 against a
logsumexp of fp32 ones does not sum to 1, and the whole row's gradient is off by the difference.
Extra memory: the gradients, the accumulator and one chunk of ``VOCAB_CHUNK_BYTES``. It
computes the logits twice (four matmuls against the chunked strategy's three), so it is slower than
chunked and faster than exact tiling (measurements in :mod:`.fused_linear_cross_entropy`).
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._flce_autograd import backward_fake, input_gradients, keep_for_backward
from ._float_args import fp32
from ._launch import accumulation_dtype, compute_dtype, interpreting, loop_block
from ._library import define_op
from .fused_linear_cross_entropy_tiled import row_loss_reference, stable_tanh, tiled_forward

# Bytes of the one chunk (tokens x vocab columns) the vocab-chunked backward reuses: its fp32 logits and,
# for bf16 / fp16 inputs, their gradient in the input dtype (6 bytes a column per token in bf16); the
# columns per chunk follow from the token count (whole 256-column tiles, at least 256). Swept by
# tools/flce_vocab_sweep.py on an H100 (4096 x 896 -> 151936, bf16, fwd+bwd, ms / extra GiB), when the
# chunk was the bf16 logits alone (2 bytes a column per token; the extra GiB now grows by 4 bytes each):
#     chunk columns         1024          2048          4096          8192          16384
#     tiled forward         26.6 / 0.289  18.3 / 0.297  9.40 / 0.312  9.18 / 0.344  8.79 / 0.406
#     cublas forward        33.3 / 0.289  19.0 / 0.297  11.6 / 0.312  9.06 / 0.344  8.53 / 0.406
# Below 4096 columns the ~100+ chunks are host-bound (launches); above, the extra memory grows faster than
# the time falls. 96 MiB keeps 4096 columns at that shape (0.06 GiB more than the bf16 chunk: the fp32
# logits); not yet re-measured with them.
VOCAB_CHUNK_BYTES = 96 * 1024 * 1024
# Which forward computes the per-row logsumexp: "tiled" (the Triton matmul with an online-LSE epilogue
# above: no logits, no chunk buffer, one launch) or "cublas" (cuBLAS logits chunks and a row kernel per
# chunk: launch-bound with many chunks, see the sweep above).
VOCAB_CHUNKED_FORWARD = "tiled"
# Columns per program of the row kernels; untuned.
_CHUNK_BLOCK = 1024


@triton.jit
def _flce_chunk_stats_kernel(
    logits_ptr, target_ptr, part_ptr, row_stride, col0, n_cols, N, softcap,
    HAS_SOFTCAP: tl.constexpr, BLOCK: tl.constexpr, COMPUTE_DTYPE: tl.constexpr,
):
    """One row of one logits chunk (columns col0.. of the vocabulary): the row's max, sum of
    exp(logit - max), target logit (0 unless the target is in the chunk) and sum of logits, after
    soft-capping, into part[0..3, row]."""
    softcap = fp32(softcap)
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * row_stride
    target = tl.load(target_ptr + row).to(tl.int64) - col0
    m = tl.full([BLOCK], float("-inf"), COMPUTE_DTYPE)
    s = tl.zeros([BLOCK], COMPUTE_DTYPE)
    t = tl.zeros([BLOCK], COMPUTE_DTYPE)
    total = tl.zeros([BLOCK], COMPUTE_DTYPE)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        z = tl.load(row_ptr + cols, mask=mask, other=0.0).to(COMPUTE_DTYPE)
        if HAS_SOFTCAP:
            z = softcap * stable_tanh(z / softcap)
        t += tl.where(cols == target, z, 0.0)
        total += tl.where(mask, z, 0.0)
        z = tl.where(mask, z, float("-inf"))
        m_new = tl.maximum(m, z)
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # lanes with no column yet
        s = s * tl.exp(m - shift) + tl.exp(z - shift)
        m = m_new
    row_max = tl.max(m, axis=0)
    tl.store(part_ptr + row, row_max)
    tl.store(part_ptr + N + row, tl.sum(s * tl.exp(m - row_max), axis=0))
    tl.store(part_ptr + 2 * N + row, tl.sum(t, axis=0))
    tl.store(part_ptr + 3 * N + row, tl.sum(total, axis=0))


@triton.jit
def _flce_chunk_grad_kernel(
    logits_ptr, grad_ptr, target_ptr, lse_ptr, dloss_ptr, row_stride, grad_row_stride, col0, n_cols, V,
    ignore_index, softcap, smoothing, z_loss,
    HAS_SOFTCAP: tl.constexpr, BLOCK: tl.constexpr, COMPUTE_DTYPE: tl.constexpr,
):
    """One row x BLOCK columns of an fp32 logits chunk become d(loss)/d(logits) in grad's dtype
    (grad may be the logits chunk itself): (softmax * (1 + 2 z_loss lse) - (1 - smoothing) onehot
    - smoothing / V) * dloss[row] (times 1 - tanh^2 of the cap with soft-capping); 0 for an ignored row."""
    softcap, smoothing, z_loss = fp32(softcap), fp32(smoothing), fp32(z_loss)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    target = tl.load(target_ptr + row).to(tl.int64)
    dloss = tl.where(target != ignore_index, tl.load(dloss_ptr + row).to(COMPUTE_DTYPE), 0.0)
    lse = tl.load(lse_ptr + row).to(COMPUTE_DTYPE)
    z = tl.load(logits_ptr + row * row_stride + cols, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    if HAS_SOFTCAP:
        cap = stable_tanh(z / softcap)
        z = softcap * cap
    g = tl.exp(z - lse) * (1.0 + 2.0 * z_loss * lse)
    g = g - tl.where(cols == target - col0, 1.0 - smoothing, 0.0) - smoothing / V
    g = g * dloss
    if HAS_SOFTCAP:
        g = g * (1.0 - cap * cap)
    tl.store(grad_ptr + row * grad_row_stride + cols, g.to(grad_ptr.dtype.element_ty), mask=mask)


def _chunk_element_bytes(dtype: torch.dtype) -> int:
    """Bytes a chunk takes per logit: the logits in fp32 (fp64 for fp64), and for bf16 / fp16 inputs
    their gradient in the input dtype beside them (the matmuls take it in that dtype)."""
    acc = accumulation_dtype(dtype)
    size = torch.empty((), dtype=acc).element_size()
    return size if dtype == acc else size + torch.empty((), dtype=dtype).element_size()


def default_vocab_chunk(n_rows: int, vocab_size: int, dtype: torch.dtype) -> int:
    """Vocabulary columns per chunk so that ``n_rows x columns`` logits and their gradient fit
    ``VOCAB_CHUNK_BYTES``."""
    cols = VOCAB_CHUNK_BYTES // max(1, n_rows * _chunk_element_bytes(dtype))
    return min(vocab_size, max(256, cols // 256 * 256))


def _logits_chunk(buffer: Tensor, x: Tensor, weight: Tensor, bias: Tensor | None, col0: int, col1: int) -> Tensor:
    """x @ weight[col0:col1].T (+ bias) into the front of ``buffer`` (fp32, fp64 for fp64), as a contiguous
    [N, col1 - col0]. In fp32, not rounded to the input dtype: the forward's logsumexp is taken over fp32
    logits, and a softmax of rounded logits against it would not sum to 1 (a bf16 logit of 256.5 is 256)."""
    logits = buffer[: x.shape[0] * (col1 - col0)].view(x.shape[0], col1 - col0)
    w = weight[col0:col1].t()
    b = None if bias is None else bias[col0:col1]
    if x.dtype != logits.dtype and not x.is_cuda:
        # the CPU has no mm with out_dtype; products of bf16 / fp16 values are exact in fp32
        x, w, b = x.to(logits.dtype), w.to(logits.dtype), None if b is None else b.to(logits.dtype)
    if x.dtype == logits.dtype:
        if b is None:
            torch.mm(x, w, out=logits)
        else:
            torch.addmm(b, x, w, out=logits)
    else:  # cuBLAS: bf16 / fp16 products accumulated in fp32 and written as they are
        torch.mm(x, w, out_dtype=logits.dtype, out=logits)
        if b is not None:
            logits.add_(b)
    return logits


def _row_grid_block(n_cols: int) -> tuple[int, int]:
    """(BLOCK, num_warps) of the row kernels over a chunk of ``n_cols`` columns."""
    return loop_block(n_cols, _CHUNK_BLOCK), 1 if interpreting() else 4


def _flce_vocab_forward_cublas(x, weight, target, bias, softcap, chunk) -> Tensor:
    """part[chunks, 4, N] (max, sum of exp, target logit, logit sum per row and chunk) from cuBLAS chunks."""
    n, v = x.shape[0], weight.shape[0]
    starts = range(0, v, chunk)
    part = torch.empty((len(starts), 4, n), dtype=accumulation_dtype(x.dtype), device=x.device)
    buffer = torch.empty(n * min(chunk, v), dtype=accumulation_dtype(x.dtype), device=x.device)
    block, warps = _row_grid_block(min(chunk, v))
    for i, col0 in enumerate(starts):
        col1 = min(col0 + chunk, v)
        logits = _logits_chunk(buffer, x, weight, bias, col0, col1)
        _flce_chunk_stats_kernel[(n,)](
            logits, target, part[i], logits.stride(0), col0, col1 - col0, n, softcap,
            HAS_SOFTCAP=softcap > 0, BLOCK=block, COMPUTE_DTYPE=compute_dtype(x.dtype), num_warps=warps,
        )
    return part


def _flce_vocab_impl(
    x: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None, ignore_index: int, label_smoothing: float,
    z_loss: float, softcap: float, chunk: int,
) -> tuple[Tensor, Tensor]:
    """(loss per row, logsumexp per row) of x [N, D]; ignored rows get 0."""
    n, v = x.shape[0], weight.shape[0]
    valid = target != ignore_index
    if VOCAB_CHUNKED_FORWARD == "tiled" or n == 0:
        row_loss, lse, _ = tiled_forward(x, weight, target, bias, ignore_index, label_smoothing, z_loss,
                                         softcap, 0.0, False)
        return row_loss, lse
    part = _flce_vocab_forward_cublas(x, weight, target, bias, softcap, chunk)
    row_max, row_sum, target_logit, logit_sum = part.unbind(1)
    lse = torch.where(valid, torch.logsumexp(row_max + torch.log(row_sum), dim=0), 0.0)
    loss = lse - (1.0 - label_smoothing) * target_logit.sum(0) - label_smoothing / v * logit_sum.sum(0)
    if z_loss:
        loss = loss + z_loss * lse * lse
    return torch.where(valid, loss, 0.0), lse


def _flce_vocab_fake(x, weight, target, bias, ignore_index, label_smoothing, z_loss, softcap, chunk):
    dtype = accumulation_dtype(x.dtype)
    return x.new_empty(x.shape[0], dtype=dtype), x.new_empty(x.shape[0], dtype=dtype)


def _add_product_fp32(acc: Tensor, a: Tensor, b: Tensor) -> None:
    """acc (fp32/fp64) += a @ b with a, b in the input dtype: one rounding of the final sum, not one per chunk."""
    if a.dtype == acc.dtype:
        acc.addmm_(a, b)
    elif a.is_cuda:
        acc.add_(torch.mm(a, b, out_dtype=acc.dtype))  # cuBLAS accumulates bf16/fp16 products in fp32
    else:  # the CPU has no mm with out_dtype; bf16 x bf16 products are exact in fp32
        acc.addmm_(a.to(acc.dtype), b.to(acc.dtype))


def _flce_vocab_backward_impl(
    x: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None, lse: Tensor, grad_loss: Tensor,
    ignore_index: int, label_smoothing: float, z_loss: float, softcap: float, chunk: int,
    compute_grad_x: bool, compute_grad_weight: bool, compute_grad_bias: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """(grad_x, grad_weight, grad_bias) of sum(grad_loss * loss per row); [0]-sized where not asked.

    Each vocabulary chunk: cuBLAS recomputes its logits in fp32 into one reused buffer, a Triton kernel
    turns them into d(loss)/d(logits) in the input dtype (in place for fp32 / fp64), cuBLAS writes that
    chunk's rows of grad_W once (one rounding, no read-modify-write) and adds its share of grad_x into an
    fp32 N x D accumulator."""
    n, d = x.shape
    v = weight.shape[0]
    acc_dtype = accumulation_dtype(x.dtype)
    grad_x = torch.zeros((n, d), dtype=acc_dtype, device=x.device) if compute_grad_x else x.new_empty(0)
    grad_w = (torch.empty_like(weight, memory_format=torch.contiguous_format) if compute_grad_weight
              else x.new_empty(0))
    grad_b = torch.empty(v, dtype=acc_dtype, device=x.device) if compute_grad_bias else x.new_empty(0)
    if n == 0:
        grad_w.zero_()
        grad_b.zero_()
    else:
        buffer = torch.empty(n * min(chunk, v), dtype=acc_dtype, device=x.device)
        # the gradient in the input dtype (the matmuls' operand), or in place of the logits
        grad_buffer = x.new_empty(n * min(chunk, v)) if x.dtype != acc_dtype else buffer
        block, warps = _row_grid_block(min(chunk, v))
        for col0 in range(0, v, chunk):
            col1 = min(col0 + chunk, v)
            logits = _logits_chunk(buffer, x, weight, bias, col0, col1)
            g = grad_buffer[: logits.numel()].view(logits.shape)
            _flce_chunk_grad_kernel[(n, triton.cdiv(col1 - col0, block))](
                logits, g, target, lse, grad_loss, logits.stride(0), g.stride(0), col0, col1 - col0, v,
                ignore_index, softcap, label_smoothing, z_loss,
                HAS_SOFTCAP=softcap > 0, BLOCK=block, COMPUTE_DTYPE=compute_dtype(x.dtype), num_warps=warps,
            )
            if compute_grad_weight:
                torch.mm(g.t(), x, out=grad_w[col0:col1])
            if compute_grad_x:
                _add_product_fp32(grad_x, g, weight[col0:col1])
            if compute_grad_bias:
                torch.sum(g, dim=0, dtype=acc_dtype, out=grad_b[col0:col1])
    return (grad_x.to(x.dtype) if compute_grad_x else grad_x, grad_w,
            grad_b.to(x.dtype) if compute_grad_bias else grad_b)


_flce_vocab_backward_op = define_op(
    "fused_linear_cross_entropy_vocab_chunked_backward", _flce_vocab_backward_impl, fake=backward_fake,
    inline_kernels=False,
)


def _flce_vocab_backward(ctx, grad_loss, _grad_lse):
    return input_gradients(_flce_vocab_backward_op, ctx, grad_loss)


# A custom op (opaque to Inductor): the backward reuses one buffer through out= matmuls and an in-place
# kernel, which a traced impl would turn into a fresh tensor per chunk. Autograd wired by hand
# (define_op), as the tiled strategy's and for its reason: the backward computes only the gradients asked for.
vocab_chunked_op = define_op(
    "fused_linear_cross_entropy_vocab_chunked", _flce_vocab_impl, fake=_flce_vocab_fake,
    backward=_flce_vocab_backward, setup_context=keep_for_backward, inline_kernels=False,
    reference=lambda *args: (row_loss_reference(*args[:8]), None),
)
