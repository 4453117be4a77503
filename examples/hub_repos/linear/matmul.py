"""A tiled Triton matmul (fp32 accumulation), and ``linear`` (forward and backward) built on it."""

import torch
import triton
import triton.language as tl

# 32 x 32 x 32 tiles: the smallest tl.dot handles well on every GPU and cheap under the interpreter;
# a repo shipping for speed would autotune them.
_BLOCK = 32


@triton.jit
def _matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        a = tl.load(a_ptr + rm[:, None] * stride_am + (k + rk)[None, :] * stride_ak,
                    mask=(rm[:, None] < M) & ((k + rk)[None, :] < K), other=0.0)
        b = tl.load(b_ptr + (k + rk)[:, None] * stride_bk + rn[None, :] * stride_bn,
                    mask=((k + rk)[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` for 2-D tensors of one dtype (any strides), accumulated in fp32."""
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul: expected (M, K) @ (K, N), got {tuple(a.shape)} @ {tuple(b.shape)}")
    (m, k), n = a.shape, b.shape[1]
    c = torch.empty(m, n, device=a.device, dtype=a.dtype)
    if m and n:
        grid = (triton.cdiv(m, _BLOCK), triton.cdiv(n, _BLOCK))
        _matmul_kernel[grid](a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                             c.stride(0), c.stride(1), BLOCK_M=_BLOCK, BLOCK_N=_BLOCK, BLOCK_K=_BLOCK)
    return c


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        x2 = x.reshape(-1, x.shape[-1])
        ctx.save_for_backward(x2, weight)
        ctx.has_bias, ctx.shape = bias is not None, x.shape
        out = matmul(x2, weight.t())
        if bias is not None:
            out = out + bias
        return out.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad):
        x2, weight = ctx.saved_tensors
        grad2 = grad.reshape(-1, grad.shape[-1])
        grad_x = matmul(grad2, weight).reshape(ctx.shape) if ctx.needs_input_grad[0] else None
        grad_w = matmul(grad2.t(), x2) if ctx.needs_input_grad[1] else None
        grad_b = grad2.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return grad_x, grad_w, grad_b


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` with the Triton matmul, forward and backward."""
    return _Linear.apply(x, weight, bias)
