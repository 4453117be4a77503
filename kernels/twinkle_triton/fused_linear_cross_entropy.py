"""LM head + cross-entropy without materialising the (tokens x vocab) logits.

``fused_linear_cross_entropy(x, weight, target, bias)`` equals
``F.cross_entropy(F.linear(x, weight, bias).float(), target, ignore_index=..., reduction=...)``,
optionally with label smoothing, a z-loss (``z_loss * logsumexp(logits)**2`` per token, PaLM) and
logit soft-capping (``softcap * tanh(logits / softcap)``, Gemma 2) applied to the logits first.

Three strategies compute it.

``strategy="tiled"``: the logits only ever exist as one ``BLOCK_M x BLOCK_N`` tile
in registers. The forward kernel is a matmul over token tiles x vocab tiles whose epilogue keeps
each row's running max / sum of exp (and the target logit), so it writes 16 bytes a token and
never a logit. The backward kernel recomputes each logits tile, turns it into d(loss)/d(logits)
in registers, and adds ``tile @ W[tile cols]`` into grad_x and ``tile^T @ x[tile rows]`` into
grad_W. Tokens whose label is ``ignore_index`` are sorted out first and cost nothing. The extra
memory is the gradients themselves (grad_W is the weight's size, grad_x the input's) plus a few
hundred KiB. With ``filter_eps`` (``"auto"``: 2^-12 for bf16, Cut Cross-Entropy's default) a tile
whose gradient entries are all smaller than ``filter_eps`` (before the incoming gradient is applied)
adds nothing: with a 150k vocabulary most tiles hold only probabilities around 1e-5, so the two
backward matmuls run for a fraction of the tiles; but where the softmax is flat (a model at
initialisation) those small entries are most of the gradient, and dropping them is far from exact.
``filter_eps=None`` (the default) is exact, and slow on this strategy (every tile adds under a lock:
37 ms on the shape below). Gradients are added
under a per-tile lock in the gradient's dtype, or with fp32 atomics into fp32 buffers with
``fp32_accumulation=True`` (one more weight-sized fp32 buffer, 2x the weight's bytes for bf16).
Accumulation order varies between runs (not bitwise deterministic).

``strategy="vocab_chunked"`` (exact, low memory; the default when an option the chunked strategy lacks is
asked for without ``filter_eps``): the forward is the tiled strategy's (logsumexp per token, no logits);
the backward goes over the vocabulary in chunks: cuBLAS recomputes one chunk's logits (all tokens) into
one reused buffer, a Triton kernel turns them in place into d(loss)/d(logits), cuBLAS writes that
chunk's rows of grad_W once (one rounding, no read-modify-write, no atomics) and adds its share of
grad_x into an fp32 tokens x hidden accumulator. Extra memory: the gradients, the accumulator and one
chunk of ``VOCAB_CHUNK_BYTES``. It computes the logits twice (four matmuls against the chunked
strategy's three), so it is slower than chunked and faster than exact tiling.

``strategy="chunked"`` (the default, and whenever ``chunk_size`` is given): cuBLAS computes the logits of
``chunk_size`` tokens into one reused buffer, a Triton row kernel turns them into the loss and, in
place, into d(loss)/d(logits); cuBLAS then writes grad_x and accumulates grad_W. Gradients are
computed in the forward (like Liger), exact, but the logits chunk costs ``chunk_size * vocab *
itemsize`` bytes (``LOGITS_CHUNK_BYTES``, 320 MiB by default). It supports ``reduction`` mean/sum
without the options above.

Measured by ``twinkle-fx bench --micro`` on an H100 (torch 2.11, triton 3.6; 4096 tokens x 896 ->
151936 vocab, bf16, every 7th label -100, forward + backward, one run): tiled with
``filter_eps="auto"`` 4.67 ms / 0.261 GiB extra; Cut Cross-Entropy (filtering by default) 6.71 /
0.262; Inductor 6.82 / 1.42; chunked (exact, the default) 6.8 / 0.55; eager 15.3 / 6.96.
Most of the tiled backward's gain comes from the forward's per-tile logit maximum: the backward
skips a tile without computing it when no entry can reach ``filter_eps`` (see the kernel).
The exact strategies on one H100 (tools/flce_vocab_sweep.py, same shape, one run; relative error of
grad_x against fp32 in brackets, weights at init scale): chunked 7.02 ms / 0.550 GiB (3.0e-3);
vocab_chunked 9.40 ms / 0.312 GiB with 32 MiB chunks (3.0e-3), 9.18 / 0.344 with 64 MiB, 8.79 / 0.406
with 128 MiB, 18.3 / 0.297 with 16 MiB (host-bound: ~150 chunks); beside them tiled with
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
from ._launch import accumulation_dtype, compute_dtype, dot_options, interpreting, multiprocessor_count
from ._library import define_op

LOGITS_CHUNK_BYTES = 320 * 1024 * 1024
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


# Chunk size of the chunked strategy: extra memory is grad_W plus one logits chunk, ``chunk_size *
# vocab * itemsize``. Small chunks are slow: every chunk re-reads and re-writes grad_W (272 MB at vocab
# 151936 x 896) and its GEMMs have a small M. H200, torch 2.11, 4096 tokens x 896 -> 151936, bf16, fwd+bwd:
#     chunk rows   128     256     512     1024    2048    4096
#     ms           13.62   8.85    7.12    6.55    6.66    6.29
#     extra GiB    0.297   0.333   0.405   0.550   0.840   1.420
def default_chunk_size(vocab_size: int, dtype: torch.dtype) -> int:
    """Rows per chunk so that one logits chunk stays within ``LOGITS_CHUNK_BYTES`` (whole 256-row
    tiles when at least one fits, else a multiple of 16, at least 16)."""
    rows = LOGITS_CHUNK_BYTES // max(1, vocab_size * torch.empty((), dtype=dtype).element_size())
    return rows // 256 * 256 if rows >= 256 else max(16, rows // 16 * 16)


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
    loss = x.new_empty((), dtype=accumulation_dtype(x.dtype))
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


# ---------------------------------------------------------------------------------------------
# strategy="tiled": logits tiles in registers only
# ---------------------------------------------------------------------------------------------

# Tile sizes (BLOCK_M tokens x BLOCK_N vocab, BLOCK_K hidden per matmul step; BLOCK_D hidden per
# gradient add), warps and pipeline stages; SPLITS_PER_SM: vocab ranges per token tile so that
# (token tiles x ranges) ~ SPLITS_PER_SM x SMs programs run. Chosen by tools/flce_sweep.py on an
# H100 at the shape above: forward 128x256x64, 8 warps, 3 stages,
# 2.6-2.9 ms (128x128 4 warps: 3.9); backward 64x128, 4 warps: 4.7 ms fwd+bwd, vs 5.3-6.6 for 128-row
# or 256-column tiles; 64x64 was faster (4.1) but filters finer, 2.02e-2 from fp32 instead of 1.99e-2.
# Module-level so the sweep and the tests can set them.
TILED_FORWARD = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3, "SPLITS_PER_SM": 1}
TILED_BACKWARD = {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "BLOCK_D": 64, "num_warps": 4, "num_stages": 3}

_STRATEGIES = ("tiled", "chunked", "vocab_chunked")
_TILED_REDUCTIONS = ("mean", "sum", "none")


@triton.jit
def _tanh(u):
    # 1 - 2 / (exp(2u) + 1): saturates to +-1 without inf / inf (tl has no tanh under the interpreter)
    return 1.0 - 2.0 / (tl.exp(2.0 * u) + 1.0)


@triton.jit
def _valid_rows(order_ptr, n_valid, pid_m, BLOCK_M: tl.constexpr):
    """Rows of token tile ``pid_m``: the non-ignored tokens come first in ``order``."""
    idx = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask = idx < n_valid
    rows = tl.load(order_ptr + idx, mask=mask, other=0).to(tl.int64)
    return rows, mask


@triton.jit
def _logits_tile(
    x_ptr, w_ptr, bias_ptr, rows, row_mask, cols, col_mask, D, stride_xn, stride_xd, stride_wv, stride_wd, softcap,
    HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, ACC_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    DOT_UPCAST: tl.constexpr, ACC_IN_DOT: tl.constexpr,
):
    """(logits tile [BLOCK_M, BLOCK_N] after bias and soft-capping, tanh of the cap or None)."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), ACC_DTYPE)
    ks = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + rows[:, None] * stride_xn + ks[None, :] * stride_xd
    w_ptrs = w_ptr + cols[None, :] * stride_wv + ks[:, None] * stride_wd
    for k in range(0, tl.cdiv(D, BLOCK_K)):
        if EVEN_K:
            a = tl.load(x_ptrs, mask=row_mask[:, None], other=0.0)
            b = tl.load(w_ptrs, mask=col_mask[None, :], other=0.0)
        else:
            k_mask = ks < D - k * BLOCK_K
            a = tl.load(x_ptrs, mask=row_mask[:, None] & k_mask[None, :], other=0.0)
            b = tl.load(w_ptrs, mask=col_mask[None, :] & k_mask[:, None], other=0.0)
        if DOT_UPCAST:
            acc += tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision=DOT_PRECISION)
        elif ACC_IN_DOT:
            acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        else:
            # fp32 / fp64 inputs: triton 3.6 rejects their accumulator operand on an H100 (a
            # CompilationError in tl.dot's accumulator check); a separate add is equivalent
            acc += tl.dot(a, b, input_precision=DOT_PRECISION)
        x_ptrs += BLOCK_K * stride_xd
        w_ptrs += BLOCK_K * stride_wd
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=col_mask, other=0.0).to(ACC_DTYPE)[None, :]
    cap = acc
    if HAS_SOFTCAP:
        cap = _tanh(acc / softcap)
        acc = softcap * cap
    return acc, cap


@triton.jit
def _flce_tiled_fwd_kernel(
    x_ptr, w_ptr, bias_ptr, target_ptr, order_ptr, n_valid_ptr, part_ptr, tile_max_ptr,
    N, V, D, stride_xn, stride_xd, stride_wv, stride_wd, tiles_per_split, n_v_tiles, softcap,
    HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_SMOOTHING: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
    ACC_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr, ACC_IN_DOT: tl.constexpr,
):
    """Per (token tile, vocab range): each row's max, sum of exp(logit - max), target logit and
    (label smoothing) sum of logits over the range, into part[range, 0..3, row]; and each tile's
    largest logit into tile_max[token tile, vocab tile] (the backward's bound for skipping tiles)."""
    pid_m = tl.program_id(0)
    pid_s = tl.program_id(1)
    n_valid = tl.load(n_valid_ptr)
    if pid_m * BLOCK_M >= n_valid:
        return
    rows, row_mask = _valid_rows(order_ptr, n_valid, pid_m, BLOCK_M)
    target = tl.load(target_ptr + rows, mask=row_mask, other=-1).to(tl.int64)
    m_i = tl.full([BLOCK_M], float("-inf"), ACC_DTYPE)
    s_i = tl.zeros([BLOCK_M], ACC_DTYPE)
    target_logit = tl.zeros([BLOCK_M], ACC_DTYPE)
    logit_sum = tl.zeros([BLOCK_M], ACC_DTYPE)
    first = pid_s * tiles_per_split
    last = tl.minimum(first + tiles_per_split, tl.cdiv(V, BLOCK_N))
    for tile in range(first, last):
        cols = (tile * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
        col_mask = cols < V
        z, _cap = _logits_tile(
            x_ptr, w_ptr, bias_ptr, rows, row_mask, cols, col_mask, D, stride_xn, stride_xd, stride_wv, stride_wd,
            softcap, HAS_BIAS, HAS_SOFTCAP, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, ACC_DTYPE, DOT_PRECISION, DOT_UPCAST,
            ACC_IN_DOT,
        )
        target_logit += tl.sum(tl.where(cols[None, :] == target[:, None], z, 0.0), axis=1)
        if HAS_SMOOTHING:
            logit_sum += tl.sum(tl.where(col_mask[None, :], z, 0.0), axis=1)
        z = tl.where(col_mask[None, :], z, float("-inf"))
        tile_max = tl.max(tl.max(tl.where(row_mask[:, None], z, float("-inf")), axis=1), axis=0)
        tl.store(tile_max_ptr + pid_m * n_v_tiles + tile, tile_max)
        m_new = tl.maximum(m_i, tl.max(z, axis=1))  # every tile has a real column: finite
        s_i = s_i * tl.exp(m_i - m_new) + tl.sum(tl.exp(z - m_new[:, None]), axis=1)
        m_i = m_new
    out = part_ptr + pid_s * 4 * N + rows
    tl.store(out, m_i, mask=row_mask)
    tl.store(out + N, s_i, mask=row_mask)
    tl.store(out + 2 * N, target_logit, mask=row_mask)
    tl.store(out + 3 * N, logit_sum, mask=row_mask)


@triton.jit
def _add_product(
    a, b_rows, b_mask, stride_bd, out_rows, out_mask, locks, D,
    BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr, ATOMIC: tl.constexpr, DOT_PRECISION: tl.constexpr,
    DOT_UPCAST: tl.constexpr,
):
    """out[rows, :] += a @ b[rows_b, :], BLOCK_D columns at a time: fp32 atomics (ATOMIC), else a
    read-add-write of the column block under its lock (works for every dtype)."""
    ds = tl.arange(0, BLOCK_D)
    for d in range(0, tl.cdiv(D, BLOCK_D)):
        cols = d * BLOCK_D + ds
        if EVEN_D:
            b_mask2 = b_mask[:, None]
            o_mask = out_mask[:, None]
        else:
            b_mask2 = b_mask[:, None] & (cols < D)[None, :]
            o_mask = out_mask[:, None] & (cols < D)[None, :]
        b = tl.load(b_rows + cols[None, :] * stride_bd, mask=b_mask2, other=0.0)
        if DOT_UPCAST:
            part = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision=DOT_PRECISION)
        else:
            part = tl.dot(a, b, input_precision=DOT_PRECISION)
        o_ptrs = out_rows + cols[None, :]
        if ATOMIC:
            tl.atomic_add(o_ptrs, part, mask=o_mask)
        else:
            lock = locks + d
            while tl.atomic_cas(lock, 0, 1) == 1:
                pass
            # .cg: read from L2, where the previous holder of the lock wrote, never a stale L1 line
            current = tl.load(o_ptrs, mask=o_mask, other=0.0, cache_modifier=".cg")
            tl.store(o_ptrs, (current.to(part.dtype) + part).to(o_ptrs.dtype.element_ty), mask=o_mask)
            tl.debug_barrier()
            tl.atomic_xchg(lock, 0)


@triton.jit
def _flce_tiled_bwd_kernel(
    x_ptr, w_ptr, bias_ptr, target_ptr, order_ptr, n_valid_ptr, lse_ptr, dloss_ptr, tile_max_ptr,
    dx_ptr, dw_ptr, db_ptr, locks_ptr,
    N, V, D, stride_xn, stride_xd, stride_wv, stride_wd,
    softcap, smoothing, z_loss, filter_eps, n_m_tiles, fwd_block_m, fwd_block_n, fwd_n_v_tiles,
    HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, COMPUTE_DX: tl.constexpr, COMPUTE_DW: tl.constexpr,
    COMPUTE_DB: tl.constexpr, FILTER: tl.constexpr, SKIP_BY_BOUND: tl.constexpr, ATOMIC: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
    EVEN_K: tl.constexpr, EVEN_D: tl.constexpr, ACC_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    DOT_UPCAST: tl.constexpr, ACC_IN_DOT: tl.constexpr,
):
    """One (token tile, vocab tile): recompute the logits, form d(loss)/d(logits), add its products
    into grad_x, grad_W (and grad_bias)."""
    pid = tl.program_id(0)
    # token tiles vary fastest: the programs running together share one W tile (read once from
    # HBM) and x (a few MiB) stays in L2
    pid_m = pid % n_m_tiles
    pid_v = pid // n_m_tiles
    n_valid = tl.load(n_valid_ptr)
    if pid_m * BLOCK_M >= n_valid:
        return
    rows, row_mask = _valid_rows(order_ptr, n_valid, pid_m, BLOCK_M)
    target = tl.load(target_ptr + rows, mask=row_mask, other=-1).to(tl.int64)
    lse = tl.load(lse_ptr + rows, mask=row_mask, other=0.0).to(ACC_DTYPE)
    if SKIP_BY_BOUND:
        # Skip the tile before computing it when no entry can pass the filter: no target in it and
        # softmax <= exp(largest logit of the covering forward tile - smallest lse of the rows).
        # With a 150k vocabulary that is nearly every tile, so the backward matmuls run for few.
        first_col = pid_v * BLOCK_N
        has_target = tl.max(((target >= first_col) & (target < first_col + BLOCK_N)).to(tl.int32), axis=0)
        if has_target == 0:
            lse_min = tl.min(tl.where(row_mask, lse, float("inf")), axis=0)
            lse_abs = tl.max(tl.where(row_mask, tl.abs(lse), 0.0), axis=0)
            tile_max = tl.load(tile_max_ptr + (pid_m * BLOCK_M // fwd_block_m) * fwd_n_v_tiles + first_col // fwd_block_n)
            if tl.exp(tile_max - lse_min) * (1.0 + 2.0 * z_loss * lse_abs) < filter_eps:
                return
    cols = (pid_v * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    col_mask = cols < V
    z, cap = _logits_tile(
        x_ptr, w_ptr, bias_ptr, rows, row_mask, cols, col_mask, D, stride_xn, stride_xd, stride_wv, stride_wd,
        softcap, HAS_BIAS, HAS_SOFTCAP, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, ACC_DTYPE, DOT_PRECISION, DOT_UPCAST,
            ACC_IN_DOT,
    )
    # d loss / d z = softmax * (1 + 2 z_loss lse) - (1 - smoothing) onehot - smoothing / V
    g = tl.exp(z - lse[:, None]) * (1.0 + 2.0 * z_loss * lse)[:, None]
    g = g - tl.where(cols[None, :] == target[:, None], 1.0 - smoothing, 0.0) - smoothing / V
    g = tl.where(row_mask[:, None] & col_mask[None, :], g, 0.0)
    if FILTER:
        if tl.max(tl.max(tl.abs(g), axis=1), axis=0) < filter_eps:
            return
    g = g * tl.load(dloss_ptr + rows, mask=row_mask, other=0.0).to(ACC_DTYPE)[:, None]
    if HAS_SOFTCAP:
        g = g * (1.0 - cap * cap)
    if COMPUTE_DB:
        tl.atomic_add(db_ptr + cols, tl.sum(g, axis=0).to(db_ptr.dtype.element_ty), mask=col_mask)
    gq = g.to(x_ptr.dtype.element_ty)
    n_d = tl.cdiv(D, BLOCK_D)
    if COMPUTE_DX:
        _add_product(gq, w_ptr + cols[:, None] * stride_wv, col_mask, stride_wd, dx_ptr + rows[:, None] * D,
                     row_mask, locks_ptr + pid_m * n_d, D, BLOCK_D, EVEN_D, ATOMIC, DOT_PRECISION, DOT_UPCAST)
    if COMPUTE_DW:
        _add_product(tl.trans(gq), x_ptr + rows[:, None] * stride_xn, row_mask, stride_xd, dw_ptr + cols[:, None] * D,
                     col_mask, locks_ptr + (n_m_tiles + pid_v) * n_d, D, BLOCK_D, EVEN_D, ATOMIC, DOT_PRECISION, DOT_UPCAST)


def _fit(block: int, size: int) -> int:
    """``block``, or less for small sizes (at least 16, tl.dot's minimum)."""
    return max(16, min(block, triton.next_power_of_2(max(size, 1))))


def _valid_order(target: Tensor, ignore_index: int) -> tuple[Tensor, Tensor]:
    """(row indices with the non-ignored rows first, number of non-ignored rows as a device tensor)."""
    ignored = target == ignore_index
    order = torch.argsort(ignored.to(torch.int8), stable=True).to(torch.int32)
    return order, (~ignored).sum(dtype=torch.int32).reshape(1)


def _flce_tiled_impl(
    x: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None, ignore_index: int, label_smoothing: float,
    z_loss: float, softcap: float, filter_eps: float, fp32_accumulation: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """(loss per row, logsumexp per row, largest logit per tile) of x [N, D]; ignored rows get 0."""
    n, d = x.shape
    v = weight.shape[0]
    loss_dtype = accumulation_dtype(x.dtype)
    order, n_valid = _valid_order(target, ignore_index)
    cfg = TILED_FORWARD
    (block_m, block_n), block_k = _forward_tiles(v), _fit(cfg["BLOCK_K"], d)
    n_m_tiles, n_v_tiles = triton.cdiv(max(n, 1), block_m), triton.cdiv(v, block_n)
    # +inf (never skip) where no forward tile wrote: rows that are all ignored
    tile_max = torch.full((triton.cdiv(n, block_m), n_v_tiles), float("inf"), dtype=torch.float32, device=x.device)
    if x.device.type == "cuda" and not interpreting():
        programs = cfg["SPLITS_PER_SM"] * multiprocessor_count(x.device)
        splits = max(1, min(n_v_tiles, programs // n_m_tiles))
    else:
        splits = min(n_v_tiles, 2)  # still several ranges, so the interpreter tests the merge
    tiles_per_split = triton.cdiv(n_v_tiles, splits)
    splits = triton.cdiv(n_v_tiles, tiles_per_split)
    part = torch.zeros((splits, 4, n), dtype=loss_dtype, device=x.device)
    if n:
        _flce_tiled_fwd_kernel[(n_m_tiles, splits)](
            x, weight, bias, target, order, n_valid, part, tile_max, n, v, d, x.stride(0), x.stride(1),
            weight.stride(0), weight.stride(1), tiles_per_split, n_v_tiles, softcap,
            HAS_BIAS=bias is not None, HAS_SOFTCAP=softcap > 0, HAS_SMOOTHING=label_smoothing > 0,
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, EVEN_K=d % block_k == 0,
            ACC_DTYPE=compute_dtype(x.dtype), **dot_options(x.dtype, fp32_like_matmul=True),
            ACC_IN_DOT=x.dtype in (torch.bfloat16, torch.float16),
            num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        )
    valid = target != ignore_index
    row_max, row_sum, target_logit, logit_sum = part.unbind(1)
    lse = torch.logsumexp(row_max + torch.log(row_sum), dim=0)
    lse = torch.where(valid, lse, 0.0)
    loss = lse - (1.0 - label_smoothing) * target_logit.sum(0) - label_smoothing / v * logit_sum.sum(0)
    if z_loss:
        loss = loss + z_loss * lse * lse
    return torch.where(valid, loss, 0.0), lse, tile_max


def _forward_tiles(vocab: int) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N) of the forward: the tile_max grid, which the backward reads."""
    return TILED_FORWARD["BLOCK_M"], _fit(TILED_FORWARD["BLOCK_N"], vocab)


def _flce_tiled_fake(x, weight, target, bias, ignore_index, label_smoothing, z_loss, softcap, filter_eps,
                     fp32_accumulation):
    dtype = accumulation_dtype(x.dtype)
    block_m, block_n = _forward_tiles(weight.shape[0])
    tiles = ((x.shape[0] + block_m - 1) // block_m, (weight.shape[0] + block_n - 1) // block_n)
    return (x.new_empty(x.shape[0], dtype=dtype), x.new_empty(x.shape[0], dtype=dtype),
            x.new_empty(tiles, dtype=torch.float32))


def _flce_tiled_backward_impl(
    x: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None, lse: Tensor, grad_loss: Tensor, tile_max: Tensor,
    fwd_block_m: int, fwd_block_n: int, ignore_index: int, label_smoothing: float, z_loss: float, softcap: float,
    filter_eps: float, fp32_accumulation: bool, compute_grad_x: bool, compute_grad_weight: bool,
    compute_grad_bias: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """(grad_x, grad_weight, grad_bias) for d(sum of grad_loss * loss per row); [0]-sized where not asked."""
    n, d = x.shape
    v = weight.shape[0]
    atomic = fp32_accumulation or x.dtype in (torch.float32, torch.float64)
    acc_dtype = accumulation_dtype(x.dtype) if atomic else x.dtype
    grad_x = torch.zeros((n, d), dtype=acc_dtype, device=x.device) if compute_grad_x else x.new_empty(0)
    grad_w = torch.zeros((v, d), dtype=acc_dtype, device=x.device) if compute_grad_weight else x.new_empty(0)
    grad_b = torch.zeros(v, dtype=accumulation_dtype(x.dtype), device=x.device) if compute_grad_bias else x.new_empty(0)
    cfg = TILED_BACKWARD
    block_m, block_n = cfg["BLOCK_M"], _fit(cfg["BLOCK_N"], v)
    block_k, block_d = _fit(cfg["BLOCK_K"], d), _fit(cfg["BLOCK_D"], d)
    n_m_tiles, n_v_tiles = triton.cdiv(max(n, 1), block_m), triton.cdiv(v, block_n)
    if n and (compute_grad_x or compute_grad_weight or compute_grad_bias):
        order, n_valid = _valid_order(target, ignore_index)
        locks = torch.zeros((n_m_tiles + n_v_tiles) * triton.cdiv(d, block_d), dtype=torch.int32, device=x.device)
        _flce_tiled_bwd_kernel[(n_m_tiles * n_v_tiles,)](
            x, weight, bias, target, order, n_valid, lse, grad_loss, tile_max, grad_x, grad_w, grad_b, locks,
            n, v, d, x.stride(0), x.stride(1), weight.stride(0), weight.stride(1),
            softcap, label_smoothing, z_loss, filter_eps, n_m_tiles, fwd_block_m, fwd_block_n, tile_max.shape[1],
            HAS_BIAS=bias is not None, HAS_SOFTCAP=softcap > 0, COMPUTE_DX=compute_grad_x,
            COMPUTE_DW=compute_grad_weight, COMPUTE_DB=compute_grad_bias, FILTER=filter_eps > 0,
            # the bound needs each backward tile inside one forward tile (powers of two: not smaller), and is
            # useless when label smoothing alone puts every entry above filter_eps
            SKIP_BY_BOUND=(filter_eps > 0 and fwd_block_m >= block_m and fwd_block_n >= block_n
                           and label_smoothing / v < filter_eps),
            ATOMIC=atomic,
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, BLOCK_D=block_d,
            EVEN_K=d % block_k == 0, EVEN_D=d % block_d == 0, ACC_DTYPE=compute_dtype(x.dtype),
            **dot_options(x.dtype, fp32_like_matmul=True),
            ACC_IN_DOT=x.dtype in (torch.bfloat16, torch.float16),
            num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        )
    if atomic and acc_dtype != x.dtype:
        grad_x, grad_w = grad_x.to(x.dtype), grad_w.to(x.dtype)
    return grad_x, grad_w, (grad_b.to(x.dtype) if compute_grad_bias else grad_b)


def _flce_tiled_backward_fake(x, weight, target, bias, lse, grad_loss, tile_max, fwd_block_m, fwd_block_n,
                              ignore_index, label_smoothing, z_loss, softcap, filter_eps, fp32_accumulation,
                              compute_grad_x, compute_grad_weight, compute_grad_bias):
    return (
        torch.empty_like(x, memory_format=torch.contiguous_format) if compute_grad_x else x.new_empty(0),
        torch.empty_like(weight, memory_format=torch.contiguous_format) if compute_grad_weight else x.new_empty(0),
        torch.empty_like(bias, memory_format=torch.contiguous_format) if compute_grad_bias else x.new_empty(0),
    )


_flce_tiled_backward_op = define_op(
    "fused_linear_cross_entropy_tiled_backward", _flce_tiled_backward_impl, fake=_flce_tiled_backward_fake,
    inline_kernels=False,
)


def _flce_tiled_setup_context(ctx, inputs, output):
    x, weight, target, bias = inputs[:4]
    ctx.options = inputs[4:]
    ctx.forward_tiles = _forward_tiles(weight.shape[0])
    ctx.mark_non_differentiable(output[1], output[2])
    ctx.save_for_backward(x, weight, target, bias, output[1], output[2])


def _flce_tiled_backward(ctx, grad_loss, _grad_lse, _grad_tile_max):
    if grad_loss is None:
        return (None,) * 10
    x, weight, target, bias, lse, tile_max = ctx.saved_tensors
    need_x, need_w, _, need_b = ctx.needs_input_grad[:4]
    grad_x, grad_w, grad_b = _flce_tiled_backward_op(
        x, weight, target, bias, lse, grad_loss.contiguous(), tile_max, *ctx.forward_tiles, *ctx.options,
        need_x, need_w, need_b and bias is not None,
    )
    return (grad_x if need_x else None, grad_w if need_w else None, None,
            grad_b if need_b and bias is not None else None, None, None, None, None, None, None)


# A custom op (opaque to Inductor): the kernels use locks and atomics, and a traced impl would gain
# nothing, the op being two launches per step. Autograd wired by hand (define_op), not declared with
# define_differentiable_op: the backward op is told which gradients autograd needs (needs_input_grad),
# so it skips the weight-sized products nobody asked for.
_flce_tiled_op = define_op(
    "fused_linear_cross_entropy_tiled", _flce_tiled_impl, fake=_flce_tiled_fake, backward=_flce_tiled_backward,
    setup_context=_flce_tiled_setup_context, inline_kernels=False,
    reference=lambda *args: (_row_loss_reference(*args[:8]), None, None),
)


# ---------------------------------------------------------------------------------------------
# strategy="vocab_chunked": exact, low memory; the backward recomputes the logits a vocabulary chunk at a time
# ---------------------------------------------------------------------------------------------

# Bytes of the one logits chunk (tokens x vocab columns) the vocab-chunked backward reuses; the columns
# per chunk follow from the token count (whole 256-column tiles, at least 256). Swept by
# tools/flce_vocab_sweep.py on an H100 (4096 x 896 -> 151936, bf16, fwd+bwd, ms / extra GiB):
#     chunk MiB (columns)   8 (1024)      16 (2048)     32 (4096)     64 (8192)     128 (16384)
#     tiled forward         26.6 / 0.289  18.3 / 0.297  9.40 / 0.312  9.18 / 0.344  8.79 / 0.406
#     cublas forward        33.3 / 0.289  19.0 / 0.297  11.6 / 0.312  9.06 / 0.344  8.53 / 0.406
# Below 32 MiB the ~100+ chunks are host-bound (launches); above, the extra memory grows faster than the
# time falls. 32 MiB: the low memory that is this strategy's reason to exist, 0.2 ms from 64 MiB.
VOCAB_CHUNK_BYTES = 32 * 1024 * 1024
# Which forward computes the per-row logsumexp: "tiled" (the Triton matmul with an online-LSE epilogue
# above: no logits, no chunk buffer, one launch) or "cublas" (cuBLAS logits chunks and a row kernel per
# chunk: launch-bound with many chunks, see the sweep above).
VOCAB_CHUNKED_FORWARD = "tiled"
# Columns per program of the row kernels; untuned.
_CHUNK_BLOCK = 1024


def default_vocab_chunk(n_rows: int, vocab_size: int, dtype: torch.dtype) -> int:
    """Vocabulary columns per chunk so that ``n_rows x columns`` logits fit ``VOCAB_CHUNK_BYTES``."""
    cols = VOCAB_CHUNK_BYTES // max(1, n_rows * torch.empty((), dtype=dtype).element_size())
    return min(vocab_size, max(256, cols // 256 * 256))


@triton.jit
def _flce_chunk_stats_kernel(
    logits_ptr, target_ptr, part_ptr, row_stride, col0, n_cols, N, softcap,
    HAS_SOFTCAP: tl.constexpr, BLOCK: tl.constexpr, COMPUTE_DTYPE: tl.constexpr,
):
    """One row of one logits chunk (columns col0.. of the vocabulary): the row's max, sum of
    exp(logit - max), target logit (0 unless the target is in the chunk) and sum of logits, after
    soft-capping, into part[0..3, row]."""
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
            z = softcap * _tanh(z / softcap)
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
    logits_ptr, target_ptr, lse_ptr, dloss_ptr, row_stride, col0, n_cols, V, ignore_index,
    softcap, smoothing, z_loss,
    HAS_SOFTCAP: tl.constexpr, BLOCK: tl.constexpr, COMPUTE_DTYPE: tl.constexpr,
):
    """In place, one row x BLOCK columns of a logits chunk become d(loss)/d(logits):
    (softmax * (1 + 2 z_loss lse) - (1 - smoothing) onehot - smoothing / V) * dloss[row]
    (times 1 - tanh^2 of the cap with soft-capping); 0 for an ignored row."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    ptrs = logits_ptr + row * row_stride + cols
    target = tl.load(target_ptr + row).to(tl.int64)
    dloss = tl.where(target != ignore_index, tl.load(dloss_ptr + row).to(COMPUTE_DTYPE), 0.0)
    lse = tl.load(lse_ptr + row).to(COMPUTE_DTYPE)
    z = tl.load(ptrs, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    if HAS_SOFTCAP:
        cap = _tanh(z / softcap)
        z = softcap * cap
    g = tl.exp(z - lse) * (1.0 + 2.0 * z_loss * lse)
    g = g - tl.where(cols == target - col0, 1.0 - smoothing, 0.0) - smoothing / V
    g = g * dloss
    if HAS_SOFTCAP:
        g = g * (1.0 - cap * cap)
    tl.store(ptrs, g.to(logits_ptr.dtype.element_ty), mask=mask)


def _logits_chunk(buffer: Tensor, x: Tensor, weight: Tensor, bias: Tensor | None, col0: int, col1: int) -> Tensor:
    """x @ weight[col0:col1].T (+ bias) into the front of ``buffer``, as a contiguous [N, col1 - col0]."""
    logits = buffer[: x.shape[0] * (col1 - col0)].view(x.shape[0], col1 - col0)
    if bias is None:
        torch.mm(x, weight[col0:col1].t(), out=logits)
    else:
        torch.addmm(bias[col0:col1], x, weight[col0:col1].t(), out=logits)
    return logits


def _row_grid_block() -> tuple[int, int]:
    return (_CHUNK_BLOCK, 4) if not interpreting() else (256, 1)


def _flce_vocab_forward_cublas(x, weight, target, bias, softcap, chunk) -> Tensor:
    """part[chunks, 4, N] (max, sum of exp, target logit, logit sum per row and chunk) from cuBLAS chunks."""
    n, v = x.shape[0], weight.shape[0]
    starts = range(0, v, chunk)
    part = torch.empty((len(starts), 4, n), dtype=accumulation_dtype(x.dtype), device=x.device)
    buffer = x.new_empty(n * min(chunk, v))
    block, warps = _row_grid_block()
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
        row_loss, lse, _ = _flce_tiled_impl(x, weight, target, bias, ignore_index, label_smoothing, z_loss,
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

    Each vocabulary chunk: cuBLAS recomputes its logits into one reused buffer, a Triton kernel turns
    them into d(loss)/d(logits) in place, cuBLAS writes that chunk's rows of grad_W once (one rounding,
    no read-modify-write) and adds its share of grad_x into an fp32 N x D accumulator."""
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
        buffer = x.new_empty(n * min(chunk, v))
        block, warps = _row_grid_block()
        for col0 in range(0, v, chunk):
            col1 = min(col0 + chunk, v)
            g = _logits_chunk(buffer, x, weight, bias, col0, col1)
            _flce_chunk_grad_kernel[(n, triton.cdiv(col1 - col0, block))](
                g, target, lse, grad_loss, g.stride(0), col0, col1 - col0, v, ignore_index,
                softcap, label_smoothing, z_loss,
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


def _flce_vocab_backward_fake(x, weight, target, bias, lse, grad_loss, ignore_index, label_smoothing, z_loss,
                              softcap, chunk, compute_grad_x, compute_grad_weight, compute_grad_bias):
    return _flce_tiled_backward_fake(x, weight, target, bias, lse, grad_loss, None, 0, 0, ignore_index,
                                     label_smoothing, z_loss, softcap, 0.0, False, compute_grad_x,
                                     compute_grad_weight, compute_grad_bias)


_flce_vocab_backward_op = define_op(
    "fused_linear_cross_entropy_vocab_chunked_backward", _flce_vocab_backward_impl, fake=_flce_vocab_backward_fake,
    inline_kernels=False,
)


def _flce_vocab_setup_context(ctx, inputs, output):
    x, weight, target, bias = inputs[:4]
    ctx.options = inputs[4:]
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(x, weight, target, bias, output[1])


def _flce_vocab_backward(ctx, grad_loss, _grad_lse):
    if grad_loss is None:
        return (None,) * 9
    x, weight, target, bias, lse = ctx.saved_tensors
    need_x, need_w, _, need_b = ctx.needs_input_grad[:4]
    grad_x, grad_w, grad_b = _flce_vocab_backward_op(
        x, weight, target, bias, lse, grad_loss.contiguous(), *ctx.options, need_x, need_w,
        need_b and bias is not None,
    )
    return (grad_x if need_x else None, grad_w if need_w else None, None,
            grad_b if need_b and bias is not None else None, None, None, None, None, None)


# A custom op (opaque to Inductor): the backward reuses one buffer through out= matmuls and an in-place
# kernel, which a traced impl would turn into a fresh tensor per chunk. Autograd wired by hand
# (define_op), as the tiled strategy's and for its reason: the backward computes only the gradients asked for.
_flce_vocab_op = define_op(
    "fused_linear_cross_entropy_vocab_chunked", _flce_vocab_impl, fake=_flce_vocab_fake,
    backward=_flce_vocab_backward, setup_context=_flce_vocab_setup_context, inline_kernels=False,
    reference=lambda *args: (_row_loss_reference(*args[:8]), None),
)


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
    if reduction not in _TILED_REDUCTIONS:
        raise ValueError(f"{op}: reduction={reduction!r}; use one of {_TILED_REDUCTIONS}.")
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
        chunk_size (`int`, *optional*): chunked strategy: tokens per logits chunk (default: one chunk
            within 320 MiB); vocab_chunked: vocabulary entries per chunk (default: one chunk within
            ``VOCAB_CHUNK_BYTES``, 32 MiB).
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
        row_loss, _ = _flce_vocab_op(
            x2, weight, target1, None if bias is None else bias.contiguous(), int(ignore_index),
            float(label_smoothing), float(z_loss), float(softcap or 0.0), int(chunk),
        )
        return _reduce(row_loss, target, target1, reduction, ignore_index)
    if strategy == "chunked" or (strategy is None and chunk_size is not None):
        if chunk_size is None:
            chunk_size = default_chunk_size(weight.shape[0], x.dtype)
        return _fused_linear_cross_entropy_op(
            x, weight, target, bias, int(ignore_index), reduction, chunk_size,
            grad and x.requires_grad, grad and weight.requires_grad,
            grad and bias is not None and bias.requires_grad,
        )[0]
    row_loss, _, _ = _flce_tiled_op(
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
    logits = torch.nn.functional.linear(x, weight, bias).to(accumulation_dtype(x.dtype))
    if softcap:
        logits = softcap * torch.tanh(logits / softcap)
    logits, target1 = logits.reshape(-1, logits.shape[-1]), target.reshape(-1)
    loss = torch.nn.functional.cross_entropy(logits, target1, ignore_index=ignore_index, reduction="none",
                                             label_smoothing=label_smoothing)
    valid = target1 != ignore_index
    if z_loss:
        loss = loss + z_loss * torch.logsumexp(logits, dim=-1).square() * valid
    if reduction == "none":
        return loss.reshape(target.shape)
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / valid.sum()


def _row_loss_reference(x: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None, ignore_index: int,
                        label_smoothing: float, z_loss: float, softcap: float) -> Tensor:
    """The loss per row of the tiled and vocab-chunked ops (x [N, D], softcap 0 for none), in plain PyTorch."""
    return fused_linear_cross_entropy_reference(x, weight, target, bias, ignore_index, "none",
                                                label_smoothing=label_smoothing, z_loss=z_loss, softcap=softcap or None)
