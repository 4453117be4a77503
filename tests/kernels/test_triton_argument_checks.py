"""What the ops do with arguments torch refuses or computes its own way: refused with a TypeError or
ValueError that names the argument, computed as torch does (integer mul_add), or, for meta tensors,
shaped like torch's result without running a kernel."""

import pytest
import torch

import twinkle_triton as tt

ACTIVATIONS = {
    "silu_and_mul": (tt.silu_and_mul, ("x",), lambda t: (t(4, 8),)),
    "silu_mul": (tt.silu_mul, ("gate",), lambda t: (t(4, 8), t(4, 8))),
    "gelu_mul": (tt.gelu_mul, ("gate",), lambda t: (t(4, 8), t(4, 8))),
    "gelu_and_mul": (tt.gelu_and_mul, ("x",), lambda t: (t(4, 8),)),
    "clamped_swiglu": (tt.clamped_swiglu, ("x",), lambda t: (t(4, 8), 1.702, 7.0)),
    "add_gelu": (tt.add_gelu, ("x",), lambda t: (t(4, 8), t(8))),
    "rms_norm": (tt.rms_norm, ("x",), lambda t: (t(4, 8), t(8))),
    "add_rms_norm": (tt.add_rms_norm, ("x",), lambda t: (t(4, 8), t(4, 8), t(8))),
    "rms_norm_fp32": (tt.rms_norm_fp32, ("x",), lambda t: (t(4, 8), t(8))),
    "layer_norm": (tt.layer_norm, ("x",), lambda t: (t(4, 8), t(8))),
    "apply_rotary_pos_emb": (tt.apply_rotary_pos_emb, ("q",),
                             lambda t: (t(1, 2, 3, 8), t(1, 2, 3, 8), t(1, 3, 8), t(1, 3, 8))),
}


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool, torch.complex64])
@pytest.mark.parametrize("op", ACTIVATIONS)
def test_floating_point_ops_refuse_other_dtypes_naming_the_argument(op, dtype):
    fn, (first,), make = ACTIVATIONS[op]
    args = make(lambda *shape: torch.ones(shape, dtype=dtype))
    with pytest.raises(TypeError, match=rf"{op}: {first} has dtype {dtype}; pass a floating-point tensor"):
        fn(*args)


@pytest.mark.parametrize("op", ["rms_norm", "rms_norm_fp32", "layer_norm"])
def test_norms_refuse_a_0d_input(op):
    with pytest.raises(ValueError, match=rf"{op}: x is a 0-D tensor"):
        getattr(tt, op)(torch.tensor(2.0), torch.ones(1))


def test_integer_mul_add_is_exact_like_torch():
    for dtype in (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool):
        if dtype == torch.bool:
            a, b, c = (torch.rand(5, 7) > 0.5 for _ in range(3))
        else:
            info = torch.iinfo(dtype)
            a, b, c = (torch.randint(info.min, info.max, (5, 7), dtype=dtype) for _ in range(3))
        assert torch.equal(tt.mul_add(a, b, c), a * b + c), dtype  # wrapping where torch wraps
        assert torch.equal(tt.mul_add(a, b[0], c[:, :1]), a * b[0] + c[:, :1]), dtype


def test_integer_mul_add_beyond_float32_precision():
    a = torch.tensor([2**24 + 1, 2**40 + 3])
    one, zero = torch.ones_like(a), torch.zeros_like(a)
    assert tt.mul_add(a, one, zero).tolist() == [2**24 + 1, 2**40 + 3]


def test_mul_add_refuses_complex_and_python_scalars_naming_the_argument():
    z = torch.ones(3, dtype=torch.complex64)
    with pytest.raises(TypeError, match=r"mul_add: a has dtype torch.complex64"):
        tt.mul_add(z, z, z)
    with pytest.raises(TypeError, match=r"mul_add: b is a float, not a torch.Tensor"):
        tt.mul_add(torch.ones(3), 2.0, torch.ones(3))


def _meta(*shape, dtype=torch.float32):
    return torch.empty(shape, dtype=dtype, device="meta")


META_CASES = {
    "rms_norm": (tt.rms_norm, lambda: (_meta(2, 3, 8, dtype=torch.bfloat16), _meta(8))),
    "add_rms_norm": (tt.add_rms_norm, lambda: (_meta(2, 3, 8), _meta(2, 3, 8), _meta(8))),
    "rms_norm_fp32": (tt.rms_norm_fp32, lambda: (_meta(2, 3, 8, dtype=torch.float16), _meta(8))),
    "layer_norm": (tt.layer_norm, lambda: (_meta(2, 8), _meta(8), _meta(8))),
    "silu_and_mul": (tt.silu_and_mul, lambda: (_meta(2, 3, 8),)),
    "silu_mul": (tt.silu_mul, lambda: (_meta(2, 8), _meta(2, 8))),
    "gelu_mul": (tt.gelu_mul, lambda: (_meta(2, 8), _meta(2, 8))),
    "gelu_and_mul": (tt.gelu_and_mul, lambda: (_meta(2, 8),)),
    "clamped_swiglu": (tt.clamped_swiglu, lambda: (_meta(2, 8), 1.702, 7.0)),
    "add_gelu": (tt.add_gelu, lambda: (_meta(2, 3, 8), _meta(8))),
    "mul_add": (tt.mul_add, lambda: (_meta(2, 3, 8), _meta(8), _meta(3, 1))),
    "apply_rotary_pos_emb": (tt.apply_rotary_pos_emb, lambda: (_meta(2, 4, 5, 8), _meta(2, 2, 5, 8), _meta(2, 5, 8),
                                                               _meta(2, 5, 8))),
    "apply_rotary_pos_emb_partial": (tt.apply_rotary_pos_emb_partial,
                                     lambda: (_meta(2, 4, 5, 8), _meta(2, 2, 5, 8), _meta(2, 5, 6), _meta(2, 5, 6))),
    "apply_rotary_pos_emb_half_angle": (tt.apply_rotary_pos_emb_half_angle,
                                        lambda: (_meta(2, 4, 5, 8), _meta(2, 2, 5, 8), _meta(1, 5, 4), _meta(1, 5, 4))),
    "apply_rotary_pos_emb_deinterleave": (
        tt.apply_rotary_pos_emb_deinterleave,
        lambda: (_meta(2, 4, 5, 8), _meta(2, 1, 5, 8), _meta(2, 5, 8), _meta(2, 5, 8))),
    "gqa_attention": (tt.gqa_attention, lambda: (_meta(2, 4, 3, 16), _meta(2, 2, 7, 16), _meta(2, 2, 7, 16))),
}
for _strategy in ("chunked", "vocab_chunked", "tiled"):
    META_CASES[f"fused_linear_cross_entropy[{_strategy}]"] = (
        lambda x, w, t, _s=_strategy: tt.fused_linear_cross_entropy(x, w, t, strategy=_s),
        lambda: (_meta(2, 3, 16), _meta(40, 16), _meta(2, 3, dtype=torch.int64)),
    )
META_CASES["fused_linear_cross_entropy[none]"] = (
    lambda x, w, t: tt.fused_linear_cross_entropy(x, w, t, reduction="none"),
    lambda: (_meta(2, 3, 16), _meta(40, 16), _meta(2, 3, dtype=torch.int64)),
)


def _reference_of(op: str):
    name = op.split("[")[0]
    reference = getattr(tt, f"{name}_reference")
    if "[none]" in op:
        return lambda x, w, t: reference(x, w, t, reduction="none")
    return reference


def _as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


@pytest.mark.parametrize("op", META_CASES)
def test_meta_inputs_give_meta_outputs_shaped_like_the_reference(op):
    fn, make = META_CASES[op]
    got, want = _as_tuple(fn(*make())), _as_tuple(_reference_of(op)(*make()))
    assert [(t.device.type, t.shape, t.dtype) for t in got] == [(t.device.type, t.shape, t.dtype) for t in want]


# op: how many leading arguments get gradients
DIFFERENTIABLE = {"rms_norm": 2, "add_rms_norm": 3, "layer_norm": 3, "silu_mul": 2, "mul_add": 3,
                  "apply_rotary_pos_emb": 2, "gqa_attention": 3, "fused_linear_cross_entropy[chunked]": 2}


@pytest.mark.parametrize("op", DIFFERENTIABLE)
def test_meta_inputs_give_meta_gradients(op):
    fn, make = META_CASES[op]
    args = list(make())
    inputs = [a.requires_grad_() for a in args[: DIFFERENTIABLE[op]]]
    out = _as_tuple(fn(*args))
    grads = torch.autograd.grad([o.sum() for o in out], inputs)
    assert [(g.device.type, g.shape) for g in grads] == [("meta", a.shape) for a in inputs]


MIXES = {
    "rms_norm": (tt.rms_norm, "weight", lambda d, m: (torch.randn(4, 8, device=d), torch.randn(8, device=m))),
    "add_rms_norm": (tt.add_rms_norm, "residual",
                     lambda d, m: (torch.randn(4, 8, device=d), torch.randn(4, 8, device=m), torch.randn(8, device=d))),
    "layer_norm": (tt.layer_norm, "bias",
                   lambda d, m: (torch.randn(4, 8, device=d), torch.randn(8, device=d), torch.randn(8, device=m))),
    "silu_mul": (tt.silu_mul, "up", lambda d, m: (torch.randn(4, 8, device=d), torch.randn(4, 8, device=m))),
    "add_gelu": (tt.add_gelu, "bias", lambda d, m: (torch.randn(4, 8, device=d), torch.randn(8, device=m))),
    "mul_add": (tt.mul_add, "c", lambda d, m: (torch.randn(4, 8, device=d), torch.randn(8, device=d),
                                               torch.randn(8, device=m))),
    "apply_rotary_pos_emb": (tt.apply_rotary_pos_emb, "cos", lambda d, m: (
        torch.randn(1, 2, 3, 8, device=d), torch.randn(1, 2, 3, 8, device=d), torch.randn(1, 3, 8, device=m),
        torch.randn(1, 3, 8, device=d))),
    "gqa_attention": (tt.gqa_attention, "value", lambda d, m: (
        torch.randn(1, 2, 3, 16, device=d), torch.randn(1, 1, 3, 16, device=d), torch.randn(1, 1, 3, 16, device=m))),
    "fused_linear_cross_entropy": (tt.fused_linear_cross_entropy, "target", lambda d, m: (
        torch.randn(3, 16, device=d), torch.randn(40, 16, device=d), torch.zeros(3, dtype=torch.int64, device=m))),
}


@pytest.mark.parametrize("op", MIXES)
def test_tensors_on_two_devices_are_refused_naming_the_argument(op, device):
    fn, culprit, make = MIXES[op]
    with pytest.raises(ValueError, match=rf"{op}: {culprit} is on meta but \w+ is on {device}"):
        fn(*make(device, "meta"))
