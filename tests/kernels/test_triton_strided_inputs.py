"""Every op reads every tensor argument through its strides: transposed, sliced, stepped and
expanded (stride-0) views of inputs and weights give the reference's outputs and gradients.

Each case builds its tensors contiguous and then lays all of them out one way (the values stay
the same, except that an expanded tensor repeats its first entry along dim 0). Memory around a
sliced or stepped view is NaN (int: out of range), so a kernel that reads past a view's elements
fails loudly instead of by a small error.
"""

import pytest
import torch
from kernel_test_utils import check_forward_backward

import twinkle_triton as tt

LAYOUTS = ("transposed", "sliced", "stepped", "expanded")


def _filler(t: torch.Tensor, shape) -> torch.Tensor:
    if t.is_floating_point():
        return torch.full(shape, float("nan"), dtype=t.dtype)
    return torch.full(shape, 10**6, dtype=t.dtype)


def laid_out(t: torch.Tensor, layout: str) -> torch.Tensor:
    """``t``'s values in the given layout (``expanded``: dim 0 broadcast from its first entry)."""
    if layout == "transposed":  # every dim's stride reversed
        dims = tuple(reversed(range(t.dim())))
        return t.permute(dims).contiguous().permute(dims)
    if layout == "sliced":  # a window of a wider tensor: wider rows, offset start, unit last stride
        big = _filler(t, (*t.shape[:-1], t.shape[-1] + 3))
        view = big[..., 1 : t.shape[-1] + 1]
    elif layout == "stepped":  # every other element of a tensor twice as large in each dim
        big = _filler(t, tuple(2 * s for s in t.shape))
        view = big[tuple(slice(None, None, 2) for _ in t.shape)]
    elif layout == "expanded":
        return t[:1].expand(t.shape)
    else:
        raise ValueError(layout)
    view.copy_(t)
    return view


def _rms_norm(lay):
    x, w = lay(torch.randn(6, 24)), lay(torch.randn(24))
    return (lambda x, w: tt.rms_norm(x, w, 1e-6)), (lambda x, w: tt.rms_norm_reference(x, w, 1e-6)), (x, w)


def _add_rms_norm(lay):
    x, r, w = lay(torch.randn(2, 3, 24)), lay(torch.randn(2, 3, 24)), lay(torch.randn(24))
    return ((lambda x, r, w: tt.add_rms_norm(x, r, w, 1e-6)),
            (lambda x, r, w: tt.add_rms_norm_reference(x, r, w, 1e-6)), (x, r, w))


def _rms_norm_fp32(lay):
    x, w = lay(torch.randn(6, 24)), lay(torch.randn(24))
    return ((lambda x, w: tt.rms_norm_fp32(x, w, 1e-6, 1.0)),
            (lambda x, w: tt.rms_norm_fp32_reference(x, w, 1e-6, 1.0)), (x, w))


def _layer_norm(lay):
    x, w, b = lay(torch.randn(6, 24)), lay(torch.randn(24)), lay(torch.randn(24))
    return ((lambda x, w, b: tt.layer_norm(x, w, b, 1e-5)), (lambda x, w, b: tt.layer_norm_reference(x, w, b, 1e-5)),
            (x, w, b))


def _silu_and_mul(lay):
    return tt.silu_and_mul, tt.silu_and_mul_reference, (lay(torch.randn(6, 48)),)


def _silu_mul(lay):
    return tt.silu_mul, tt.silu_mul_reference, (lay(torch.randn(6, 24)), lay(torch.randn(6, 24)))


def _gelu_mul(lay):
    return ((lambda g, u: tt.gelu_mul(g, u, "none")), (lambda g, u: tt.gelu_mul_reference(g, u, "none")),
            (lay(torch.randn(6, 24)), lay(torch.randn(6, 24))))


def _gelu_and_mul(lay):
    return tt.gelu_and_mul, tt.gelu_and_mul_reference, (lay(torch.randn(6, 48)),)


def _clamped_swiglu(lay):
    x = lay(4 * torch.randn(6, 48))  # both sides of the clamp at limit 7
    return ((lambda x: tt.clamped_swiglu(x, 1.702, 7.0)), (lambda x: tt.clamped_swiglu_reference(x, 1.702, 7.0)), (x,))


def _add_gelu(lay):
    return tt.add_gelu, tt.add_gelu_reference, (lay(torch.randn(6, 24)), lay(torch.randn(24)))


def _mul_add(lay):
    a, b, c = lay(torch.randn(6, 24)), lay(torch.randn(24)), lay(torch.randn(6, 24))
    return tt.mul_add, tt.mul_add_reference, (a, b, c)


def _rotary(name, cos_width):
    def case(lay):
        fn, reference = getattr(tt, name), getattr(tt, f"{name}_reference")
        q, k = lay(torch.randn(2, 4, 5, 8)), lay(torch.randn(2, 2, 5, 8))
        cos, sin = lay(torch.randn(2, 5, cos_width)), lay(torch.randn(2, 5, cos_width))
        return (lambda q, k: fn(q, k, cos, sin)), (lambda q, k: reference(q, k, cos, sin)), (q, k)

    return case


def _gqa_attention(lay):
    q, k, v = lay(torch.randn(2, 4, 5, 16)), lay(torch.randn(2, 2, 7, 16)), lay(torch.randn(2, 2, 7, 16))
    keep = torch.rand(2, 1, 5, 7) > 0.3
    keep[..., 0] = True
    mask = lay(keep)
    return ((lambda q, k, v: tt.gqa_attention(q, k, v, mask)),
            # the reference is SDPA, whose fused CUDA kernels refuse some views: it reads dense copies
            (lambda q, k, v: tt.gqa_attention_reference(q.contiguous(), k.contiguous(), v.contiguous(),
                                                            mask.contiguous())), (q, k, v))


def _fused_linear_cross_entropy(strategy):
    def case(lay):
        x, w, b = lay(torch.randn(6, 16)), lay(torch.randn(10, 16) / 4), lay(torch.randn(10))
        target = torch.randint(0, 10, (6,))
        target[2] = -100
        target = lay(target)

        def ours(x, w, b):
            return tt.fused_linear_cross_entropy(x, w, target, b, strategy=strategy)

        def reference(x, w, b):
            return tt.fused_linear_cross_entropy_reference(x, w, target, b)

        return ours, reference, (x, w, b)

    return case


def _moe_swiglu_experts(lay):
    index = lay(torch.stack([torch.randperm(4)[:3] for _ in range(4)]))  # 4 tokens, 3 of 4 experts each
    x, w = lay(torch.randn(4 * 3, 16)[::3]), lay(torch.rand(12, 3)[::3])
    gate_up, down = lay(torch.randn(4, 32, 16) / 4), lay(torch.randn(4, 16, 16) / 4)
    return ((lambda x, g, d, w: tt.moe_swiglu_experts(x, g, d, index, w)),
            (lambda x, g, d, w: tt.moe_swiglu_experts_reference(x, g, d, index, w)), (x, gate_up, down, w))


CASES = {
    "rms_norm": _rms_norm,
    "add_rms_norm": _add_rms_norm,
    "rms_norm_fp32": _rms_norm_fp32,
    "layer_norm": _layer_norm,
    "silu_and_mul": _silu_and_mul,
    "silu_mul": _silu_mul,
    "gelu_mul": _gelu_mul,
    "gelu_and_mul": _gelu_and_mul,
    "clamped_swiglu": _clamped_swiglu,
    "add_gelu": _add_gelu,
    "mul_add": _mul_add,
    "apply_rotary_pos_emb": _rotary("apply_rotary_pos_emb", 8),
    "apply_rotary_pos_emb_partial": _rotary("apply_rotary_pos_emb_partial", 6),
    "apply_rotary_pos_emb_interleaved": _rotary("apply_rotary_pos_emb_interleaved", 8),
    "apply_rotary_pos_emb_interleaved_partial": _rotary("apply_rotary_pos_emb_interleaved_partial", 4),
    "apply_rotary_pos_emb_half_angle": _rotary("apply_rotary_pos_emb_half_angle", 4),
    "apply_rotary_pos_emb_deinterleave": _rotary("apply_rotary_pos_emb_deinterleave", 8),
    "gqa_attention": _gqa_attention,
    "moe_swiglu_experts": _moe_swiglu_experts,
    "fused_linear_cross_entropy[chunked]": _fused_linear_cross_entropy("chunked"),
    "fused_linear_cross_entropy[vocab_chunked]": _fused_linear_cross_entropy("vocab_chunked"),
    "fused_linear_cross_entropy[tiled]": _fused_linear_cross_entropy("tiled"),
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("op", CASES)
def test_strided_inputs_match_reference(op, layout):
    fn, reference, inputs = CASES[op](lambda t: laid_out(t, layout))
    check_forward_backward(fn, reference, inputs, torch.float32, f"{op} with {layout} inputs")

