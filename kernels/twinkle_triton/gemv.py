"""Linears on a few rows (decode): ``gemv(x, weights)`` and ``gemv_swiglu(x, gate_weight, up_weight)``.

At a decode step a linear multiplies one token (or a few) by its whole weight: the kernel is a
stream over the weight, bound by memory bandwidth and, for the small projections, by latency.
cuBLAS reads these weights at 0.4-1.7 TB/s at the Qwen2-0.5B shape on an H200 (its GEMV for one
row of 896 against 1152 or 4864 columns), and a transformer layer issues several of them plus the
kernels around them (a bias, the SwiGLU product, the concatenation of q/k/v weights that a fused
projection reads). These kernels take those jobs in one launch each:

- ``gemv(x, [wq, wk, wv], [bq, bk, bv])`` is ``x @ cat(weights).T + cat(biases)`` without
  concatenating anything: each program reads a few rows of one weight (the program index says which),
  so q, k and v come out of one launch into one ``[..., Nq + Nk + Nv]`` output. ``residual=r`` adds
  ``r`` in the same pass (a projection followed by the residual add: o_proj, down_proj);
- ``gemv_swiglu(x, wg, wu)`` is ``silu(x @ wg.T) * (x @ wu.T)``: both weights streamed by the
  same program, the SwiGLU product computed before anything is written;
- ``norm_weight=g, eps=e`` (either op) normalizes ``x`` first as transformers' RMSNorm does: each
  program reads all of ``x`` anyway, so it accumulates the rows' sums of squares in the same loop over K,
  multiplies ``x`` by ``g`` as it loads it, and scales the dot products by ``1 / rms`` at the end. The
  decoder layer's norm before q/k/v and before the MLP then costs no launch of its own.

Each program computes ``BLOCK_N`` output columns for every row of ``x``: it reads its weight rows
once in tiles of ``BLOCK_K`` and multiplies each tile with the rows of ``x`` in registers (an fp32
multiply-add and a reduction along K, no tensor cores: at one row a GEMV has no reuse for them to
exploit). Results are rounded once, after the bias, the residual or the SwiGLU product; PyTorch
rounds the GEMV's output first. Every weight and ``x`` are read through their strides (a transposed
weight is read in place, at a cost in coalescing).

On Hopper and later GPUs each kernel is launched as a programmatic dependent of the kernel before it: its programs
start while that kernel's last ones run, load their first weight tile when every weight is an ``nn.Parameter`` (a
model's, which no kernel of a forward writes), and wait for that kernel (``griddepcontrol.wait``) before they read
anything else. In a decode step, where one GEMV follows another, the next layer's weights stream in while the last
programs of the one before finish, instead of after a drain and a launch.

Rows: at most :data:`MAX_ROWS`. The register tile grows with the rows, and past a few rows the
GEMM of cuBLAS, which reuses each weight tile across rows on tensor cores, wins (the measured
crossover is in the graph pass that uses these, ``twinkle_fx.compiler.passes.decode_gemv``).

Backward: plain PyTorch GEMMs (``grad @ W`` and ``grad.T @ x`` per weight, the SwiGLU derivative on
the recomputed projections). A decode kernel is rarely differentiated, but a call that is gets the
exact gradients of its forward.
"""

from collections.abc import Sequence

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._checks import check_tensors
from ._dependent_launch import launch_options, wait_for_inputs
from ._float_args import fp32
from ._launch import cdiv, compute_dtype, loop_block, next_power_of_2
from ._library import define_op, wrap_triton

__all__ = ["DECODE_ROWS", "MAX_ROWS", "gemv", "gemv_reference", "gemv_swiglu", "gemv_swiglu_reference"]

MAX_ROWS = 16
# The most rows at which the kernels were measured faster than cuBLAS (tools/gemv_sweep.py, H200, bf16: at
# one row 1.1-2.5x at the 0.5B-1B shapes' projections, at eight rows 0.05-0.43x). The graph rewrite and
# SwiGLUMLP use them up to here.
DECODE_ROWS = 1
MAX_WEIGHTS = 3  # q, k and v
# The launch heuristic (tools/gemv_sweep.py --tiles/--block-n/--warps sweep it, weights read from DRAM): weight rows
# a program, the BLOCK_M * BLOCK_N * BLOCK_K fp32 products one program holds in registers (32 a thread at 4 warps),
# its warps. A weight at least as wide as the output is tall (o_proj, down_proj) takes half the weight rows a
# program, so twice the programs share its few output columns: at one row on an H200, bf16, down 6.7 -> 4.5 us at
# Qwen2-0.5B, 12.6 -> 9.9 at Llama-3.2-1B, 16.6 -> 15.2 at Llama-3.2-3B, o_proj within 0.1 us. Wider tiles (8192
# products) were faster only at Llama-3.2-1B's q/k/v (6.9 -> 5.7 us) and slower where K tiles no longer divide K
# (Llama-3.2-3B's gate/up 29.4 -> 40.3 us at K = 3072).
_BLOCK_N = 4
_BLOCK_N_WIDE_K = 2
_TILE = 4096
_WARPS = 4
# Launched as programmatic dependents (_dependent_launch; tools/gemv_sweep.py --pdl measures each choice), the
# kernels load their first weight tile before waiting on the kernel before when the weights are nn.Parameters (a
# model's, which no kernel of a forward writes). H200, bf16, one row, a decoder layer's four GEMVs in sequence,
# weights read from DRAM: Qwen2-0.5B 22.0 us plain, 20.0 waiting first, 18.1 loading the weights first;
# Llama-3.2-1B 48.2 / 46.0 / 43.6; Llama-3.2-3B 73.6 / 72.1 / 69.1.
_PREFETCH_WEIGHTS = True


@triton.jit
def _normed_x(x_ptr, g_ptr, m, k, M, K, sxm, sxk, sgk, ss, HAS_NORM: tl.constexpr, ACC: tl.constexpr):
    """A ``[BLOCK_M, BLOCK_K]`` tile of x in ``ACC``, times the norm weight's tile under ``HAS_NORM``, and the rows'
    sums of squares ``ss`` (``[BLOCK_M, 1]``) grown by it (the norm's 1 / rms scales the dot products after the
    loop)."""
    x = tl.load(x_ptr + m[:, None] * sxm + k[None, :] * sxk, mask=(m[:, None] < M) & (k[None, :] < K),
                other=0.0).to(ACC)
    if HAS_NORM:
        # reduced in the layout x is loaded in: as fast or faster than in the product's 3-D layout (H200, bf16,
        # one row: Qwen2-0.5B's norm + q/k/v 2.9 against 3.0 us, Llama-3.2-3B's 11.0 against 11.9 us)
        ss += tl.sum(x * x, axis=1)[:, None]
        x = x * tl.load(g_ptr + k * sgk, mask=k < K, other=0.0).to(ACC)[None, :]
    return x, ss


@triton.jit
def _dot_rows(x, w, ACC: tl.constexpr, BLOCK_M: tl.constexpr):
    """``[BLOCK_M, BLOCK_N]``: every row of the x tile ``[BLOCK_M, BLOCK_K]`` dotted with every weight row of
    ``w`` ``[BLOCK_N, BLOCK_K]``. One row reduces a 2-D product (the 3-D broadcast of several rows measured slower
    at one)."""
    if BLOCK_M == 1:
        return tl.sum(w.to(ACC) * x, axis=1)[None, :]
    return tl.sum(x[:, None, :] * w.to(ACC)[None, :, :], axis=2)


@triton.jit
def _weight_tile(rows_ptr, nmask, k, K, swk):
    """The ``[BLOCK_N, BLOCK_K]`` weight tile at columns ``k`` (masked past ``K``: a tile past the end reads
    nothing)."""
    return tl.load(rows_ptr + k[None, :] * swk, mask=nmask[:, None] & (k[None, :] < K), other=0.0)


@triton.jit
def _columns(x_ptr, w_ptr, b_ptr, r_ptr, g_ptr, y_ptr, block, M, N, K, col0,
             sxm, sxk, swn, swk, sym, srm, srn, sgk, eps,
             HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_NORM: tl.constexpr, PDL: tl.constexpr,
             PREFETCH: tl.constexpr, ACC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_K: tl.constexpr):
    """Columns ``col0 + block * BLOCK_N ...`` of ``y``: one weight's rows times every row of ``x``. The next weight
    tile is loaded before the current one is reduced (one tile in flight while the program computes); under
    ``PREFETCH`` the first is loaded before waiting for the kernel before (the weights must be no kernel's
    output)."""
    n = block * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < N
    m = tl.arange(0, BLOCK_M)
    rows = w_ptr + n[:, None].to(tl.int64) * swn
    k = tl.arange(0, BLOCK_K)
    if PREFETCH:
        w = _weight_tile(rows, nmask, k, K, swk)
        wait_for_inputs(PDL)
    else:
        wait_for_inputs(PDL)
        w = _weight_tile(rows, nmask, k, K, swk)
    acc = tl.zeros((BLOCK_M, BLOCK_N), ACC)
    ss = tl.zeros((BLOCK_M, 1), ACC)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        w_next = _weight_tile(rows, nmask, k + BLOCK_K, K, swk)
        x, ss = _normed_x(x_ptr, g_ptr, m, k, M, K, sxm, sxk, sgk, ss, HAS_NORM, ACC)
        acc += _dot_rows(x, w, ACC, BLOCK_M)
        w = w_next
    if HAS_NORM:
        acc = acc * tl.rsqrt(ss / K + eps)
    if HAS_BIAS:
        acc += tl.load(b_ptr + n, mask=nmask, other=0.0).to(ACC)[None, :]
    out = (m[:, None] < M) & nmask[None, :]
    if HAS_RESIDUAL:
        acc += tl.load(r_ptr + m[:, None] * srm + (col0 + n[None, :]) * srn, mask=out, other=0.0).to(ACC)
    tl.store(y_ptr + m[:, None] * sym + col0 + n[None, :], acc.to(y_ptr.dtype.element_ty), mask=out)


@triton.jit
def _gemv_kernel(x_ptr, w0_ptr, w1_ptr, w2_ptr, b0_ptr, b1_ptr, b2_ptr, r_ptr, g_ptr, y_ptr,
                 M, K, N0, N1, N2, P0, P1,
                 sxm, sxk, sw0n, sw0k, sw1n, sw1k, sw2n, sw2k, sym, srm, srn, sgk, eps,
                 HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_NORM: tl.constexpr, PDL: tl.constexpr,
                 PREFETCH: tl.constexpr, ACC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr):
    eps = fp32(eps)
    # programs [0, P0) compute weight 0's columns, [P0, P0 + P1) weight 1's, the rest weight 2's
    pid = tl.program_id(0)
    if pid < P0:
        _columns(x_ptr, w0_ptr, b0_ptr, r_ptr, g_ptr, y_ptr, pid, M, N0, K, 0, sxm, sxk, sw0n, sw0k, sym, srm, srn,
                 sgk, eps, HAS_BIAS, HAS_RESIDUAL, HAS_NORM, PDL, PREFETCH, ACC, BLOCK_M, BLOCK_N, BLOCK_K)
    elif pid < P0 + P1:
        _columns(x_ptr, w1_ptr, b1_ptr, r_ptr, g_ptr, y_ptr, pid - P0, M, N1, K, N0, sxm, sxk, sw1n, sw1k, sym, srm,
                 srn, sgk, eps, HAS_BIAS, HAS_RESIDUAL, HAS_NORM, PDL, PREFETCH, ACC, BLOCK_M, BLOCK_N, BLOCK_K)
    else:
        _columns(x_ptr, w2_ptr, b2_ptr, r_ptr, g_ptr, y_ptr, pid - P0 - P1, M, N2, K, N0 + N1, sxm, sxk, sw2n, sw2k,
                 sym, srm, srn, sgk, eps, HAS_BIAS, HAS_RESIDUAL, HAS_NORM, PDL, PREFETCH, ACC, BLOCK_M, BLOCK_N,
                 BLOCK_K)


@triton.jit
def _gemv_swiglu_kernel(x_ptr, g_ptr, u_ptr, n_ptr, y_ptr, M, N, K, sxm, sxk, sgn, sgk, sun, suk, sym, snk, eps,
                        HAS_NORM: tl.constexpr, PDL: tl.constexpr, PREFETCH: tl.constexpr, ACC: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    eps = fp32(eps)
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < N
    m = tl.arange(0, BLOCK_M)
    g_rows = g_ptr + n[:, None].to(tl.int64) * sgn
    u_rows = u_ptr + n[:, None].to(tl.int64) * sun
    k = tl.arange(0, BLOCK_K)
    if PREFETCH:
        g = _weight_tile(g_rows, nmask, k, K, sgk)
        u = _weight_tile(u_rows, nmask, k, K, suk)
        wait_for_inputs(PDL)
    else:
        wait_for_inputs(PDL)
        g = _weight_tile(g_rows, nmask, k, K, sgk)
        u = _weight_tile(u_rows, nmask, k, K, suk)
    gate = tl.zeros((BLOCK_M, BLOCK_N), ACC)
    up = tl.zeros((BLOCK_M, BLOCK_N), ACC)
    ss = tl.zeros((BLOCK_M, 1), ACC)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        g_next = _weight_tile(g_rows, nmask, k + BLOCK_K, K, sgk)
        u_next = _weight_tile(u_rows, nmask, k + BLOCK_K, K, suk)
        x, ss = _normed_x(x_ptr, n_ptr, m, k, M, K, sxm, sxk, snk, ss, HAS_NORM, ACC)
        gate += _dot_rows(x, g, ACC, BLOCK_M)
        up += _dot_rows(x, u, ACC, BLOCK_M)
        g, u = g_next, u_next
    if HAS_NORM:
        rstd = tl.rsqrt(ss / K + eps)
        gate, up = gate * rstd, up * rstd
    y = gate * tl.sigmoid(gate) * up
    tl.store(y_ptr + m[:, None] * sym + n[None, :], y.to(y_ptr.dtype.element_ty),
             mask=(m[:, None] < M) & nmask[None, :])


def _blocks(rows: int, n: int, k: int, width: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K) for weights of ``n`` rows at most and ``width`` output columns in all: every
    row in one tile, :data:`_BLOCK_N` weight rows a program (:data:`_BLOCK_N_WIDE_K` where ``k >= width``), K in
    tiles that keep the register tile at :data:`_TILE` products (``_launch.BLOCK_LIMIT`` caps both blocks, so tests
    loop over several K tiles and weight-row blocks)."""
    block_m = next_power_of_2(rows)  # loop_block: under the interpreter few, large programs instead
    block_n = _BLOCK_N_WIDE_K if k >= width else _BLOCK_N
    block_k = max(16, min(next_power_of_2(k), _TILE // (block_m * block_n)))
    return block_m, loop_block(n, block_n), loop_block(k, block_k)


def _launch_options(x: Tensor, weights: Sequence[Tensor]) -> dict:
    """The kernels' launch options on ``x``'s device (``_dependent_launch.launch_options``), the weights read before
    the wait when every one is an ``nn.Parameter`` and :data:`_PREFETCH_WEIGHTS`."""
    options = launch_options(x)
    prefetch = options["PDL"] and _PREFETCH_WEIGHTS and all(isinstance(w, torch.nn.Parameter) for w in weights)
    return {**options, "PREFETCH": prefetch}


def _flat(x: Tensor) -> Tensor:
    """``x`` as ``[rows, K]`` (a view where its strides allow one)."""
    return x.reshape(-1, x.shape[-1])


def _gemv_impl(x: Tensor, w0: Tensor, w1: Tensor | None, w2: Tensor | None, b0: Tensor | None,
               b1: Tensor | None, b2: Tensor | None, residual: Tensor | None, norm_weight: Tensor | None,
               eps: float) -> Tensor:
    weights = [w for w in (w0, w1, w2) if w is not None]
    biases = [b.contiguous() if b is not None else None for b in (b0, b1, b2)][:len(weights)]  # read at stride 1
    widths = [int(w.shape[0]) for w in weights]
    xf = _flat(x)
    rows, k = xf.shape
    y = x.new_empty((*x.shape[:-1], sum(widths)))
    if y.numel() == 0:
        return y
    rf = _flat(residual) if residual is not None else None
    block_m, block_n, block_k = _blocks(rows, max(widths), k, sum(widths))
    programs = [cdiv(n, block_n) for n in widths] + [0, 0]
    ws = weights + [w0] * (MAX_WEIGHTS - len(weights))
    bs = [b if b is not None else w0 for b in biases] + [w0] * (MAX_WEIGHTS - len(weights))
    strides = [s for w in ws for s in w.stride()]
    wrap_triton(_gemv_kernel)[(sum(programs),)](
        xf, *ws, *bs, rf if rf is not None else xf, norm_weight if norm_weight is not None else xf, y, rows, k,
        *(widths + [0, 0])[:MAX_WEIGHTS], programs[0], programs[1], xf.stride(0), xf.stride(1), *strides, y.shape[-1],
        rf.stride(0) if rf is not None else 0, rf.stride(1) if rf is not None else 0,
        norm_weight.stride(0) if norm_weight is not None else 0, eps,
        HAS_BIAS=b0 is not None, HAS_RESIDUAL=residual is not None, HAS_NORM=norm_weight is not None,
        ACC=compute_dtype(x.dtype), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=_WARPS, **_launch_options(x, weights),
    )
    return y


def _gemv_fake(x: Tensor, w0: Tensor, w1: Tensor | None, w2: Tensor | None, b0: Tensor | None,
               b1: Tensor | None, b2: Tensor | None, residual: Tensor | None, norm_weight: Tensor | None,
               eps: float) -> Tensor:
    width = sum(int(w.shape[0]) for w in (w0, w1, w2) if w is not None)
    return x.new_empty((*x.shape[:-1], width))


def _rms_normed(x: Tensor, norm_weight: Tensor, eps: float) -> Tensor:
    """The RMSNorm the kernels apply to ``x`` first, unrounded (``x``'s dtype or fp32, whichever is wider)."""
    acc = torch.promote_types(x.dtype, torch.float32)
    xa = x.to(acc)
    return xa * torch.rsqrt(xa.pow(2).mean(-1, keepdim=True) + eps) * norm_weight.to(acc)


class _NormedInput:
    """The backward's view of an input the kernel normalized: the normalized rows (what the GEMMs' gradients
    read), and the gradients of ``x`` and of the norm weight from the gradient of those rows. Without a norm,
    ``x`` itself."""

    def __init__(self, x: Tensor, norm_weight: Tensor | None, eps: float) -> None:
        self.x, self.norm_weight, self.eps = x, norm_weight, eps
        self.rows = x if norm_weight is None else _rms_normed(x, norm_weight, eps).to(x.dtype)

    def grads(self, grad_rows: Tensor) -> tuple[Tensor, Tensor | None]:
        """(grad of x, grad of the norm weight or None) from the gradient of :attr:`rows`:
        with ``r = rsqrt(mean(x^2) + eps)`` and ``u = grad * g``, ``dx = r u - x r^3 mean(u x)`` and
        ``dg = sum over rows of grad * x * r``."""
        if self.norm_weight is None:
            return grad_rows, None
        acc = torch.promote_types(self.x.dtype, torch.float32)
        x, grad = self.x.to(acc), grad_rows.to(acc)
        r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        u = grad * self.norm_weight.to(acc)
        grad_x = r * u - x * r.pow(3) * (u * x).mean(-1, keepdim=True)
        grad_g = _flat(grad * x * r).sum(0)
        return grad_x.to(self.x.dtype), grad_g.to(self.norm_weight.dtype)


def _gemv_setup_context(ctx, inputs, output):
    x, w0, w1, w2, b0, b1, b2, residual, norm_weight, eps = inputs
    ctx.save_for_backward(x, w0, w1, w2, norm_weight)
    ctx.eps = eps
    ctx.has_bias = [b is not None for b in (b0, b1, b2)]
    ctx.has_residual = residual is not None


def _gemv_backward(ctx, grad):
    x, *weights, norm_weight = ctx.saved_tensors
    normed = _NormedInput(x, norm_weight, ctx.eps)
    present = [w for w in weights if w is not None]
    parts = grad.split([int(w.shape[0]) for w in present], dim=-1)
    grad_x, grad_norm = normed.grads(sum(part @ w for part, w in zip(parts, present)))
    grad_w = [_flat(part).T @ _flat(normed.rows) for part in parts]
    grad_b = [_flat(part).sum(0) for part in parts]
    pad = [None] * (MAX_WEIGHTS - len(present))
    return (grad_x, *(grad_w + pad), *[g if has else None for g, has in zip(grad_b + pad, ctx.has_bias)],
            grad if ctx.has_residual else None, grad_norm, None)


# Autograd wired by hand (define_op): the backward is a few PyTorch GEMMs over the weights present (and autograd
# over the norm where the kernel normalized x). Opaque to Inductor (a custom_op, not a triton_op), as gemv_swiglu:
# Inductor's launcher of user kernels takes no programmatic dependent launch (`launch_pdl`), ours does, and a decode
# step runs as a CUDA graph, where the op's dispatch costs nothing.
_gemv_op = define_op(
    "gemv", _gemv_impl, fake=_gemv_fake, backward=_gemv_backward, setup_context=_gemv_setup_context,
    inline_kernels=False,
    reference=lambda *args: _gemv_op_reference(*args),  # defined below
)


def _gemv_swiglu_impl(x: Tensor, gate_weight: Tensor, up_weight: Tensor, norm_weight: Tensor | None,
                      eps: float) -> Tensor:
    xf = _flat(x)
    rows, k = xf.shape
    n = int(gate_weight.shape[0])
    y = x.new_empty((*x.shape[:-1], n))
    if y.numel() == 0:
        return y
    block_m, block_n, block_k = _blocks(rows, n, k, n)
    wrap_triton(_gemv_swiglu_kernel)[(cdiv(n, block_n),)](
        xf, gate_weight, up_weight, norm_weight if norm_weight is not None else xf, y, rows, n, k, xf.stride(0),
        xf.stride(1), *gate_weight.stride(), *up_weight.stride(), n,
        norm_weight.stride(0) if norm_weight is not None else 0, eps, HAS_NORM=norm_weight is not None,
        ACC=compute_dtype(x.dtype), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=_WARPS, **_launch_options(x, (gate_weight, up_weight)),
    )
    return y


def _gemv_swiglu_fake(x: Tensor, gate_weight: Tensor, up_weight: Tensor, norm_weight: Tensor | None,
                      eps: float) -> Tensor:
    return x.new_empty((*x.shape[:-1], int(gate_weight.shape[0])))


def _gemv_swiglu_setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:4])
    ctx.eps = inputs[4]


def _gemv_swiglu_backward(ctx, grad):
    x, gate_weight, up_weight, norm_weight = ctx.saved_tensors
    normed = _NormedInput(x, norm_weight, ctx.eps)
    rows = normed.rows
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    gate, up = (rows @ gate_weight.T).to(acc), (rows @ up_weight.T).to(acc)
    s = torch.sigmoid(gate)
    grad_gate = (grad.to(acc) * up * s * (1 + gate * (1 - s))).to(x.dtype)
    grad_up = (grad.to(acc) * gate * s).to(x.dtype)
    grad_x, grad_norm = normed.grads(grad_gate @ gate_weight + grad_up @ up_weight)
    return grad_x, _flat(grad_gate).T @ _flat(rows), _flat(grad_up).T @ _flat(rows), grad_norm, None


# Autograd wired by hand (define_op): the backward recomputes both projections with PyTorch GEMMs. Opaque to
# Inductor, as gemv.
_gemv_swiglu_op = define_op(
    "gemv_swiglu", _gemv_swiglu_impl, fake=_gemv_swiglu_fake, backward=_gemv_swiglu_backward,
    setup_context=_gemv_swiglu_setup_context, inline_kernels=False,
    reference=lambda *args: _gemv_swiglu_op_reference(*args),  # defined below
)


def _check_rows(op: str, x: Tensor) -> None:
    rows = x.numel() // max(x.shape[-1], 1)
    if rows > MAX_ROWS:
        raise ValueError(f"{op}: x has {rows} rows (shape {tuple(x.shape)}); the kernel takes at most {MAX_ROWS}. "
                         "Use torch.nn.functional.linear for more rows (a GEMM reuses the weight across rows).")


def _check_weight(op: str, x: Tensor, name: str, w: Tensor, b: Tensor | None = None) -> None:
    if w.dim() != 2 or w.shape[1] != x.shape[-1] or w.dtype != x.dtype:
        raise ValueError(f"{op}: {name} is {tuple(w.shape)} {w.dtype}; x is {tuple(x.shape)} {x.dtype}: pass a "
                         f"2-D weight [out_features, {x.shape[-1]}] of x's dtype.")
    if b is not None and (b.shape != (w.shape[0],) or b.dtype != x.dtype):
        raise ValueError(f"{op}: the bias of {name} is {tuple(b.shape)} {b.dtype}; pass [{w.shape[0]}] of x's dtype.")


def _check_norm_weight(op: str, x: Tensor, norm_weight: Tensor | None) -> None:
    if norm_weight is None:
        return
    check_tensors(op, min_dim=1, norm_weight=norm_weight)
    if norm_weight.shape != (x.shape[-1],) or norm_weight.device != x.device:
        raise ValueError(f"{op}: norm_weight is {tuple(norm_weight.shape)} on {norm_weight.device}; x is "
                         f"{tuple(x.shape)} on {x.device}: pass the [{x.shape[-1]}] weight of x's RMSNorm.")


def gemv(x: Tensor, weights: Sequence[Tensor], biases: Sequence[Tensor | None] | None = None,
         residual: Tensor | None = None, *, norm_weight: Tensor | None = None, eps: float = 1e-6) -> Tensor:
    """``x @ cat(weights).T + cat(biases) (+ residual)`` in one launch, for ``x`` of a few rows; with
    ``norm_weight``, of ``x`` RMS-normalized first.

    Args:
        x (`torch.Tensor`): ``[..., K]`` with at most :data:`MAX_ROWS` rows (the product of the
            leading dimensions); any strides.
        weights (sequence of `torch.Tensor`): one to three ``[N_i, K]`` weights (a linear's layout),
            x's dtype and device.
        biases (sequence of `torch.Tensor` or None, optional): a ``[N_i]`` bias for every weight, or
            None for none (all or none, like one linear on concatenated weights).
        residual (`torch.Tensor`, optional): ``[..., sum N_i]``, added before the one rounding.
        norm_weight (`torch.Tensor`, optional): a ``[K]`` RMSNorm weight: the rows of ``x`` are
            ``x * rsqrt(mean(x^2) + eps) * norm_weight`` (transformers' RMSNorm) before the product, computed
            in the kernel's fp32 and not rounded in between (the norm's own kernel rounds its output).
        eps (`float`, optional): the norm's epsilon.

    Returns:
        `torch.Tensor`: ``[..., sum N_i]`` in x's dtype; columns in the order of ``weights``.

    Raises:
        TypeError: a tensor argument is not a floating-point tensor (the error names it).
        ValueError: too many rows, no weight or more than three, or a weight, bias or residual
            whose shape or dtype does not fit x (the error names it).

    Example:
        ```python
        qkv = gemv(hidden, [q_proj.weight, k_proj.weight, v_proj.weight],
                   [q_proj.bias, k_proj.bias, v_proj.bias])          # hidden [1, 1, 896]
        q, k, v = qkv.split([896, 128, 128], dim=-1)
        ```
    """
    weights = list(weights)
    biases = [None] * len(weights) if biases is None else list(biases)
    if not 1 <= len(weights) <= MAX_WEIGHTS or len(biases) != len(weights):
        raise ValueError(f"gemv: {len(weights)} weight(s) and {len(biases)} bias(es); pass 1 to {MAX_WEIGHTS} "
                         "weights and one bias (or None) for each.")
    if any(b is None for b in biases) and any(b is not None for b in biases):
        raise ValueError("gemv: some weights have a bias and some do not; pass a bias for every weight or for none "
                         "(torch.zeros for a weight without one).")
    check_tensors("gemv", min_dim=1, x=x, **{f"weights[{i}]": w for i, w in enumerate(weights)},
                  **{f"biases[{i}]": b for i, b in enumerate(biases)}, residual=residual)
    _check_rows("gemv", x)
    for i, (w, b) in enumerate(zip(weights, biases)):
        _check_weight("gemv", x, f"weights[{i}]", w, b)
    width = sum(int(w.shape[0]) for w in weights)
    if residual is not None and (residual.shape != (*x.shape[:-1], width) or residual.dtype != x.dtype):
        raise ValueError(f"gemv: residual is {tuple(residual.shape)} {residual.dtype}; pass "
                         f"{(*x.shape[:-1], width)} in x's dtype.")
    _check_norm_weight("gemv", x, norm_weight)
    padded = weights + [None] * (MAX_WEIGHTS - len(weights))
    return _gemv_op(x, *padded, *(biases + [None] * (MAX_WEIGHTS - len(biases))), residual, norm_weight, float(eps))


def gemv_swiglu(x: Tensor, gate_weight: Tensor, up_weight: Tensor, *, norm_weight: Tensor | None = None,
                eps: float = 1e-6) -> Tensor:
    """``silu(x @ gate_weight.T) * (x @ up_weight.T)`` in one launch, for ``x`` of a few rows; with
    ``norm_weight``, of ``x`` RMS-normalized first.

    Args:
        x (`torch.Tensor`): ``[..., K]`` with at most :data:`MAX_ROWS` rows; any strides.
        gate_weight (`torch.Tensor`): ``[N, K]``, x's dtype and device (gate_proj's weight).
        up_weight (`torch.Tensor`): ``[N, K]``, likewise (up_proj's weight).
        norm_weight (`torch.Tensor`, optional): a ``[K]`` RMSNorm weight applied to ``x`` first, as in :func:`gemv`.
        eps (`float`, optional): the norm's epsilon.

    Returns:
        `torch.Tensor`: ``[..., N]`` in x's dtype.

    Raises:
        TypeError: a tensor argument is not a floating-point tensor (the error names it).
        ValueError: too many rows, or a weight whose shape or dtype does not fit x (the error names it).

    Example:
        ```python
        out = down_proj(gemv_swiglu(hidden, gate_proj.weight, up_proj.weight))   # hidden [1, 1, 896]
        ```
    """
    check_tensors("gemv_swiglu", min_dim=1, x=x, gate_weight=gate_weight, up_weight=up_weight)
    _check_rows("gemv_swiglu", x)
    _check_weight("gemv_swiglu", x, "gate_weight", gate_weight)
    _check_weight("gemv_swiglu", x, "up_weight", up_weight)
    if up_weight.shape != gate_weight.shape:
        raise ValueError(f"gemv_swiglu: gate_weight is {tuple(gate_weight.shape)}, up_weight {tuple(up_weight.shape)}; "
                         "pass two weights of one shape.")
    _check_norm_weight("gemv_swiglu", x, norm_weight)
    return _gemv_swiglu_op(x, gate_weight, up_weight, norm_weight, float(eps))


def gemv_reference(x: Tensor, weights: Sequence[Tensor], biases: Sequence[Tensor | None] | None = None,
                   residual: Tensor | None = None, *, norm_weight: Tensor | None = None, eps: float = 1e-6) -> Tensor:
    """Plain PyTorch ``gemv``."""
    if norm_weight is not None:
        x = _rms_normed(x, norm_weight, eps).to(x.dtype)
    biases = [None] * len(weights) if biases is None else biases
    y = torch.cat([torch.nn.functional.linear(x, w, b) for w, b in zip(weights, biases)], dim=-1)
    return y if residual is None else y + residual


def _gemv_op_reference(x, w0, w1, w2, b0, b1, b2, residual, norm_weight, eps):
    present = [(w, b) for w, b in zip((w0, w1, w2), (b0, b1, b2)) if w is not None]
    return gemv_reference(x, [w for w, _ in present], [b for _, b in present], residual, norm_weight=norm_weight,
                          eps=eps)


def gemv_swiglu_reference(x: Tensor, gate_weight: Tensor, up_weight: Tensor, *, norm_weight: Tensor | None = None,
                          eps: float = 1e-6) -> Tensor:
    """Plain PyTorch ``gemv_swiglu``."""
    if norm_weight is not None:
        x = _rms_normed(x, norm_weight, eps).to(x.dtype)
    return torch.nn.functional.silu(x @ gate_weight.T) * (x @ up_weight.T)


def _gemv_swiglu_op_reference(x, gate_weight, up_weight, norm_weight, eps):
    return gemv_swiglu_reference(x, gate_weight, up_weight, norm_weight=norm_weight, eps=eps)
