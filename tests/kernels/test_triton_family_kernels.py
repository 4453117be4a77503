"""Kernels of the other model families: gelu_mul / gelu_and_mul (Gemma's GeGLU), rms_norm_fp32
(Gemma, OLMo2, GPT-OSS), layer_norm (Cohere), clamped_swiglu (GPT-OSS's experts) and the rotary
variants (Phi3, GLM4, Cohere, GPT-OSS),
each against its ``<op>_reference`` forward and backward on odd shapes in fp32, bf16 and fp16."""

import pytest
import torch
from kernel_test_utils import DTYPES, assert_close, check_forward_backward

import twinkle_triton as tt

ROW_SHAPES = [(5, 123), (3, 7, 33), (1, 1), (0, 17)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", ROW_SHAPES)
@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_gelu_mul_matches_reference(shape, approximate, dtype):
    gate, up = torch.randn(shape, dtype=dtype), torch.randn(shape, dtype=dtype)
    check_forward_backward(lambda g, u: tt.gelu_mul(g, u, approximate),
                           lambda g, u: tt.gelu_mul_reference(g, u, approximate), (gate, up), dtype, "gelu_mul")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5, 2 * 123), (3, 7, 2 * 5), (0, 4)])
def test_gelu_and_mul_matches_reference(shape, dtype):
    x = torch.randn(shape, dtype=dtype)
    check_forward_backward(tt.gelu_and_mul, tt.gelu_and_mul_reference, (x,), dtype, "gelu_and_mul")


def test_gelu_mul_strided_rows():
    wide = torch.randn(4, 300)
    check_forward_backward(tt.gelu_and_mul, tt.gelu_and_mul_reference, (wide[:, :246],), torch.float32, "sliced")
    check_forward_backward(tt.gelu_mul, tt.gelu_mul_reference, (wide[:, :123], torch.randn(123, 4).t()),
                           torch.float32, "gelu_mul strided")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", ROW_SHAPES)
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_rms_norm_fp32_matches_reference(shape, offset, dtype):
    x, weight = torch.randn(shape, dtype=dtype), torch.randn(shape[-1], dtype=dtype)
    check_forward_backward(lambda x, w: tt.rms_norm_fp32(x, w, 1e-6, offset),
                           lambda x, w: tt.rms_norm_fp32_reference(x, w, 1e-6, offset), (x, weight), dtype,
                           f"rms_norm_fp32 offset={offset}")


def test_rms_norm_fp32_keeps_the_input_dtype_with_fp32_weights():
    """OLMo2 with fp32 weights and bf16 activations returns bf16 (the Llama kernel returns fp32)."""
    x, weight = torch.randn(3, 64, dtype=torch.bfloat16), torch.randn(64)
    out = tt.rms_norm_fp32(x, weight, 1e-6)
    assert out.dtype == torch.bfloat16
    assert_close(out, tt.rms_norm_fp32_reference(x, weight, 1e-6), torch.bfloat16, "mixed dtypes")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", ROW_SHAPES)
@pytest.mark.parametrize("bias", [False, True])
def test_layer_norm_matches_reference(shape, bias, dtype):
    x, weight = torch.randn(shape, dtype=dtype), torch.randn(shape[-1], dtype=dtype)
    args = (x, weight, torch.randn(shape[-1], dtype=dtype)) if bias else (x, weight)
    check_forward_backward(lambda *a: tt.layer_norm(*a, eps=1e-5) if bias else tt.layer_norm(*a, None, 1e-5),
                           lambda *a: tt.layer_norm_reference(*a, eps=1e-5) if bias
                           else tt.layer_norm_reference(*a, None, 1e-5), args, dtype, f"layer_norm bias={bias}")


@pytest.mark.slow
def test_norms_gradcheck_fp64():
    x, w, b = (torch.randn(*s, dtype=torch.float64, requires_grad=True) for s in ((3, 9), (9,), (9,)))
    assert torch.autograd.gradcheck(lambda x, w: tt.rms_norm_fp32(x, w, 1e-6, 1.0), (x, w))
    assert torch.autograd.gradcheck(lambda x, w, b: tt.layer_norm(x, w, b, 1e-5), (x, w, b))
    assert torch.autograd.gradcheck(lambda g, u: tt.gelu_mul(g, u, "tanh"), (x, x.detach().clone().requires_grad_()))


# ----------------------------------------------------------------------------- clamped_swiglu (GPT-OSS)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5, 2 * 123), (3, 7, 2 * 5), (1, 2), (0, 4)])
@pytest.mark.parametrize(("alpha", "limit"), [(1.702, 7.0), (0.5, 1.25)])
def test_clamped_swiglu_matches_reference(shape, alpha, limit, dtype):
    # x 4 puts about a tenth of the values beyond limit 7 (and most beyond 1.25): both clamps and
    # their zero gradients are exercised, on gate and up columns alike
    x = 4 * torch.randn(shape, dtype=dtype)
    check_forward_backward(lambda x: tt.clamped_swiglu(x, alpha, limit),
                           lambda x: tt.clamped_swiglu_reference(x, alpha, limit), (x,), dtype,
                           f"clamped_swiglu alpha={alpha} limit={limit}")


def test_clamped_swiglu_strided_rows_and_clamped_gradients():
    wide = 4 * torch.randn(6, 300)
    check_forward_backward(lambda x: tt.clamped_swiglu(x, 1.702, 7.0),
                           lambda x: tt.clamped_swiglu_reference(x, 1.702, 7.0), (wide[:, :246],), torch.float32,
                           "clamped_swiglu sliced rows")
    # gate above the limit and up outside it get no gradient; the bounds themselves pass it, as torch.clamp
    x = torch.tensor([[9.0, 0.5, 7.0, -9.0, 1.0, 7.0, 1.0, -7.0]], requires_grad=True)
    (grad,) = torch.autograd.grad(tt.clamped_swiglu(x, 1.702, 7.0).sum(), x)
    assert (grad[0, [0, 3]] == 0).all() and (grad[0, [2, 4, 5, 7]] != 0).all()


def test_clamped_swiglu_gradcheck_and_opcheck():
    x = (3 * torch.randn(3, 10, dtype=torch.float64)).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: tt.clamped_swiglu(x, 1.702, 2.0), (x,))
    torch.library.opcheck(torch.ops.twinkle.clamped_swiglu.default, (x.float().detach().requires_grad_(), 1.702, 7.0))
    with pytest.raises(ValueError, match="last dimension must be even"):
        tt.clamped_swiglu(torch.randn(2, 5), 1.702, 7.0)
    with pytest.raises(ValueError, match="limit=0.0"):
        tt.clamped_swiglu(torch.randn(2, 4), 1.702, 0.0)


# ----------------------------------------------------------------------------- rotary variants

# name -> (cos/sin width from the head dim, how a family builds them)
VARIANTS = {
    "partial": lambda d: 3 * d // 4 // 2 * 2,          # Phi3 with partial_rotary_factor 0.75
    "interleaved_partial": lambda d: d // 2,            # GLM4: half the head rotates
    "interleaved": lambda d: d,                         # Cohere
    "half_angle": lambda d: d // 2,                     # GPT-OSS
}


def _rotary_inputs(batch, seq, n_q, n_k, dim, width, dtype, unsqueeze_dim):
    q = torch.randn(batch, seq, n_q * dim, dtype=dtype).view(batch, seq, n_q, dim)
    k = torch.randn(batch, seq, n_k * dim, dtype=dtype).view(batch, seq, n_k, dim)
    if unsqueeze_dim == 1:
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    # general cos/sin (halves and pairs differ), so a wrong index into them shows
    return q, k, torch.randn(batch, seq, width).to(dtype), torch.randn(batch, seq, width).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("sizes", [(2, 5, 6, 2, 16), (1, 3, 3, 1, 12), (0, 4, 2, 2, 8)])
def test_rotary_variant_matches_reference(variant, sizes, unsqueeze_dim, dtype):
    fn, ref = getattr(tt, f"apply_rotary_pos_emb_{variant}"), getattr(tt, f"apply_rotary_pos_emb_{variant}_reference")
    q, k, cos, sin = _rotary_inputs(*sizes, VARIANTS[variant](sizes[-1]), dtype, unsqueeze_dim)
    check_forward_backward(lambda q, k: fn(q, k, cos, sin, unsqueeze_dim), lambda q, k: ref(q, k, cos, sin, unsqueeze_dim),
                           (q, k), dtype, f"rotary {variant}")


@pytest.mark.slow
def test_rotary_variant_gradcheck_and_opcheck():
    q, k, cos, sin = _rotary_inputs(1, 3, 2, 1, 8, 6, torch.float64, 1)
    q, k = q.detach().requires_grad_(), k.detach().requires_grad_()
    assert torch.autograd.gradcheck(lambda q, k: tt.apply_rotary_pos_emb_partial(q, k, cos, sin), (q, k))
    torch.library.opcheck(torch.ops.twinkle.apply_rotary_pos_emb_variant.default, (q, k, cos, sin, 1, 6, True, False))


def test_opcheck_family_ops():
    x, w = torch.randn(3, 16, requires_grad=True), torch.randn(16, requires_grad=True)
    torch.library.opcheck(torch.ops.twinkle.gelu_mul.default, (x, x.detach().clone().requires_grad_(), "tanh"))
    torch.library.opcheck(torch.ops.twinkle.gelu_and_mul.default, (x, "none"))
    torch.library.opcheck(torch.ops.twinkle.rms_norm_fp32.default, (x, w, 1e-6, 1.0))
    torch.library.opcheck(torch.ops.twinkle.layer_norm.default, (x, w, None, 1e-5))
    torch.library.opcheck(torch.ops.twinkle.layer_norm.default, (x, w, w.detach().clone().requires_grad_(), 1e-5))


def test_compile_with_aot_eager_forward_and_backward():
    x, w = torch.randn(4, 32, requires_grad=True), torch.randn(32, requires_grad=True)

    def fn(x, w, m):
        return (m.gelu_and_mul(x) * m.rms_norm_fp32(x[:, :16], w[:16], 1e-6, 1.0)
                + m.layer_norm(x[:, 16:], w[16:], None, 1e-5)).sum()

    class Ref:
        gelu_and_mul, rms_norm_fp32, layer_norm = (tt.gelu_and_mul_reference, tt.rms_norm_fp32_reference,
                                                   tt.layer_norm_reference)

    got = torch.compile(lambda x, w: fn(x, w, tt), backend="aot_eager", fullgraph=True)(x, w)
    want = fn(x, w, Ref)
    assert_close(got, want, torch.float32, "output")
    for a, b in zip(torch.autograd.grad(got, (x, w)), torch.autograd.grad(want, (x, w))):
        assert_close(a, b, torch.float32, "grad")


def test_rejects_bad_arguments_with_a_useful_message():
    with pytest.raises(ValueError, match="approximate"):
        tt.gelu_mul(torch.randn(2, 4), torch.randn(2, 4), "erf")
    with pytest.raises(ValueError, match="weight has shape"):
        tt.rms_norm_fp32(torch.randn(2, 8), torch.randn(7))
    q = torch.randn(1, 2, 3, 8)
    with pytest.raises(ValueError, match="at most the head dim"):
        tt.apply_rotary_pos_emb_partial(q, q, torch.randn(1, 3, 10), torch.randn(1, 3, 10))
