"""On a GPU every op but fused_linear_cross_entropy, moe_swiglu_experts (its kernels build TMA descriptors on the
device, which needs a Triton allocator in the launching thread) and the decode step's (gemv, gemv_swiglu,
gqa_attention, apply_rotary_pos_emb_to_cache, rotary_cache_attention: launched as programmatic dependents, through our
launcher) is a ``torch.library.triton_op``: Inductor
launches its Triton kernels from the generated code (no ``torch.ops.twinkle`` call per step) and
gets the eager kernels' results, forward and backward. Under the interpreter they stay custom ops.
"""

import pytest
import torch
from kernel_test_utils import assert_close

import twinkle_triton as tt
from twinkle_triton import _library

ON_GPU = _library.USE_TRITON_OP

# op -> (function, inputs(dtype), Triton kernels its forward and backward launch[, how many of the
# inputs get gradients: all but rotary's cos and sin])
INLINE_OPS = {
    "rms_norm": (
        lambda x, w: tt.rms_norm(x, w, 1e-6),
        lambda dt: (torch.randn(4, 64, 256, dtype=dt), torch.randn(256, dtype=dt)),
        ("_rms_norm_fwd_kernel", "_rms_norm_bwd_kernel", "_sum_partials_kernel"),
    ),
    "add_rms_norm": (
        lambda x, r, w: tt.add_rms_norm(x, r, w, 1e-6),
        lambda dt: (torch.randn(4, 64, 256, dtype=dt), torch.randn(4, 64, 256, dtype=dt), torch.randn(256, dtype=dt)),
        ("_rms_norm_fwd_kernel", "_rms_norm_bwd_kernel", "_sum_partials_kernel"),
    ),
    # float arguments besides eps (Gemma's offset): Inductor passes them fp64, which the kernels convert
    "rms_norm_fp32": (
        lambda x, w: tt.rms_norm_fp32(x, w, 1e-6, 1.0),
        lambda dt: (torch.randn(4, 64, 256, dtype=dt), torch.randn(256, dtype=dt)),
        ("_fp32_norm_fwd_kernel", "_fp32_norm_bwd_kernel", "_sum_partials_kernel"),
    ),
    "layer_norm": (
        lambda x, w, b: tt.layer_norm(x, w, b, 1e-5),
        lambda dt: (torch.randn(4, 64, 256, dtype=dt), torch.randn(256, dtype=dt), torch.randn(256, dtype=dt)),
        ("_fp32_norm_fwd_kernel", "_fp32_norm_bwd_kernel", "_sum_partials_kernel"),
    ),
    "silu_mul": (
        tt.silu_mul,
        lambda dt: (torch.randn(4, 64, 384, dtype=dt), torch.randn(4, 64, 384, dtype=dt)),
        ("_gated_act_fwd_kernel", "_gated_act_bwd_kernel"),
    ),
    "silu_mul_linear": (
        tt.silu_mul_linear,
        lambda dt: (torch.randn(4, 64, 384, dtype=dt), torch.randn(4, 64, 384, dtype=dt),
                    torch.randn(96, 384, dtype=dt) / 16),
        ("_gated_act_fwd_kernel", "_gated_act_bwd_kernel"),
    ),
    "silu_and_mul_linear": (
        tt.silu_and_mul_linear,
        lambda dt: (torch.randn(4, 64, 768, dtype=dt), torch.randn(96, 384, dtype=dt) / 16),
        ("_gated_act_fwd_kernel", "_gated_act_bwd_kernel"),
    ),
    "silu_and_mul": (
        tt.silu_and_mul,
        lambda dt: (torch.randn(4, 64, 768, dtype=dt),),
        ("_gated_act_fwd_kernel", "_gated_act_bwd_kernel"),
    ),
    "clamped_swiglu": (
        lambda x: tt.clamped_swiglu(x, 1.702, 7.0),
        lambda dt: (4 * torch.randn(4, 64, 768, dtype=dt),),  # x 4: some values beyond the clamp
        ("_gated_act_fwd_kernel", "_gated_act_bwd_kernel"),
    ),
    "apply_rotary_pos_emb": (
        # q and k as transformers builds them: transposed views of projections (GQA: 4 vs 2 heads).
        lambda q, k, cos, sin: tt.apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin),
        lambda dt: (torch.randn(2, 32, 4, 64, dtype=dt), torch.randn(2, 32, 2, 64, dtype=dt),
                    torch.randn(1, 32, 64, dtype=dt), torch.randn(1, 32, 64, dtype=dt)),
        ("_apply_rotary_pos_emb_kernel",),
        2,
    ),
    "add_gelu": (
        lambda x, b: tt.add_gelu(x, b, "tanh"),
        lambda dt: (torch.randn(4, 64, 256, dtype=dt), torch.randn(256, dtype=dt)),
        ("_add_gelu_fwd_kernel", "_add_gelu_bwd_kernel"),
    ),
    "mul_add": (
        tt.mul_add,
        lambda dt: (torch.randn(4, 64, 256, dtype=dt), torch.randn(256, dtype=dt), torch.randn(4, 64, 256, dtype=dt)),
        ("_mul_add_fwd_kernel", "_mul_add_bwd_kernel"),
    ),
}


def test_op_kind_follows_device_and_override(monkeypatch):
    monkeypatch.delenv("TWINKLE_TRITON_OP", raising=False)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not _library._use_triton_op()
    monkeypatch.setenv("TWINKLE_TRITON_OP", "0")
    monkeypatch.delenv("TRITON_INTERPRET")
    assert not _library._use_triton_op()
    monkeypatch.setenv("TWINKLE_TRITON_OP", "1")
    assert _library._use_triton_op()
    monkeypatch.setenv("TWINKLE_TRITON_OP", "yes")
    with pytest.raises(ValueError, match="TWINKLE_TRITON_OP='yes'"):
        _library._use_triton_op()


@pytest.mark.parametrize("name", sorted(INLINE_OPS))
def test_kernels_are_known_to_torch_for_cache_keys(name):
    # torch hashes these kernels' source into AOTAutograd's cache key (triton_op only).
    kernels = {k.fn.__name__ for op in (name, f"{name}_backward")
               for k in torch._library.triton.get_triton_kernels_for_op(f"twinkle::{op}")}
    expected = set(INLINE_OPS[name][2]) if ON_GPU else set()
    assert kernels == expected


@pytest.mark.skipif(not ON_GPU, reason="triton_op is used on a GPU only (not under the Triton interpreter)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(INLINE_OPS))
def test_inductor_launches_the_kernels_itself(name, dtype):
    from torch._inductor.utils import run_and_get_code

    fn, make_inputs, kernels, *n_grad = INLINE_OPS[name]
    inputs = make_inputs(dtype)
    n_grad = n_grad[0] if n_grad else len(inputs)
    eager_inputs = [t.clone().requires_grad_(i < n_grad) for i, t in enumerate(inputs)]
    compiled_inputs = [t.clone().requires_grad_(i < n_grad) for i, t in enumerate(inputs)]

    def loss(outputs):
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        return sum((o.float() * torch.linspace(-1, 1, o.numel(), device=o.device).view(o.shape)).sum()
                   for o in outputs)

    want = fn(*eager_inputs)
    loss(want).backward()
    compiled = torch.compile(fn, backend="inductor", fullgraph=True)

    def step():
        out = compiled(*compiled_inputs)
        loss(out).backward()
        return out

    got, codes = run_and_get_code(step)
    code = "\n".join(codes)
    assert "torch.ops.twinkle" not in code, f"{name}: Inductor still calls the custom op"
    for kernel in kernels:
        assert kernel in code, f"{name}: {kernel} is not launched by Inductor's code"
    for i, (g, w) in enumerate(zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,))):
        assert g.stride() == w.stride(), f"{name} output {i}: strides {g.stride()} vs eager {w.stride()}"
        assert_close(g, w, dtype, f"{name} compiled output {i}")
    for i, (c, e) in enumerate(zip(compiled_inputs[:n_grad], eager_inputs[:n_grad])):
        assert_close(c.grad, e.grad, dtype, f"{name} compiled grad {i}")
