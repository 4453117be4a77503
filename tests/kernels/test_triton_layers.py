"""twinkle_triton.layers on real transformers modules, and loading through Hugging Face kernels."""

import json
import shutil
import types
from pathlib import Path

import kernels
import pytest
import torch
from kernel_test_utils import assert_close
from transformers import Qwen2Config
from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer, Qwen2MLP, Qwen2RMSNorm, Qwen2RotaryEmbedding

import twinkle_triton as tt
from twinkle_triton import _launch, layers

PACKAGE_DIR = Path(tt.__file__).parent


def _forward_and_grads(module, x):
    x = x.detach().requires_grad_()
    out = module(x)
    grads = torch.autograd.grad(out.square().sum(), [x, *module.parameters()])
    return out, grads


def _compare_swapped(module, layer_cls, x, what):
    want, want_grads = _forward_and_grads(module, x)
    module.forward = types.MethodType(layer_cls.forward, module)
    got, got_grads = _forward_and_grads(module, x)
    assert_close(got, want, torch.float32, f"{what} output")
    for g, w in zip(got_grads, want_grads):
        assert_close(g, w, torch.float32, f"{what} grad")


def test_rms_norm_forward_swapped_onto_qwen2_rms_norm():
    norm = Qwen2RMSNorm(48, eps=1e-5)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    _compare_swapped(norm, layers.RMSNorm, torch.randn(2, 3, 48), "RMSNorm")


def test_swiglu_mlp_forward_swapped_onto_qwen2_mlp():
    mlp = Qwen2MLP(Qwen2Config(hidden_size=16, intermediate_size=40, hidden_act="silu"))
    _compare_swapped(mlp, layers.SwiGLUMLP, torch.randn(2, 3, 16), "SwiGLUMLP")


@pytest.mark.parametrize("bias", [False, True])
def test_swiglu_mlp_on_one_row_runs_the_gemv_kernels(bias, monkeypatch):
    """A decode step's row goes through gemv_swiglu and gemv (forward and backward match the MLP)."""
    config = Qwen2Config(hidden_size=16, intermediate_size=40, hidden_act="silu")
    mlp = Qwen2MLP(config)
    if bias:  # a bias on down_proj is taken in the GEMV; one on gate or up keeps the linears
        mlp.down_proj = torch.nn.Linear(40, 16)
    calls = []
    monkeypatch.setattr(layers, "gemv_swiglu", lambda *args: calls.append("gemv_swiglu") or tt.gemv_swiglu(*args))
    _compare_swapped(mlp, layers.SwiGLUMLP, torch.randn(1, 1, 16), "SwiGLUMLP one row")
    assert calls == ["gemv_swiglu"]


def test_swiglu_mlp_calls_projections_that_are_not_plain_linears():
    """A hook (or a LoRA layer in a projection's place) keeps the projections called as modules."""
    mlp = Qwen2MLP(Qwen2Config(hidden_size=16, intermediate_size=40, hidden_act="silu"))
    seen = []
    mlp.up_proj.register_forward_hook(lambda module, args, out: seen.append(out.shape))
    _compare_swapped(mlp, layers.SwiGLUMLP, torch.randn(1, 16), "SwiGLUMLP hooked")
    assert seen == [(1, 40)] * 2
    assert not layers.uses_decode_gemvs(mlp, torch.randn(1, 16)) and not layers.uses_decode_gemvs(mlp, torch.randn(2, 16))


def _mlp(family):
    """(a transformers MLP, the twinkle layer bound to it, the name of the op it runs with the down projection)."""
    if family == "phi3":  # one packed gate/up projection
        from transformers import Phi3Config
        from transformers.models.phi3.modeling_phi3 import Phi3MLP

        return (Phi3MLP(Phi3Config(hidden_size=16, intermediate_size=40, hidden_act="silu")), layers.FusedSwiGLUMLP,
                "silu_and_mul_linear")
    return Qwen2MLP(Qwen2Config(hidden_size=16, intermediate_size=40, hidden_act="silu")), layers.SwiGLUMLP, \
        "silu_mul_linear"


@pytest.mark.parametrize("family", ["qwen2", "phi3"])
def test_mlp_in_training_runs_the_down_projection_with_the_activation(family, monkeypatch):
    """With gradients on and a plain down projection, one op keeps only the projections for the backward; a hook on
    down_proj, a bias, or no gradients keep the module call (the hook still runs)."""
    mlp, layer, op = _mlp(family)
    calls = []
    monkeypatch.setattr(layers, op, lambda *args: calls.append(1) or getattr(tt, op)(*args))
    _compare_swapped(mlp, layer, torch.randn(2, 3, 16), f"{layer.__name__} fused down projection")
    assert len(calls) == 1
    with torch.no_grad():
        mlp(torch.randn(2, 3, 16))
    seen = []
    mlp.down_proj.register_forward_hook(lambda module, args, out: seen.append(out.shape))
    mlp(torch.randn(2, 3, 16))
    assert len(calls) == 1 and seen == [(2, 3, 16)]


def test_silu_and_mul_layer():
    x = torch.randn(3, 10)
    assert_close(layers.SiluAndMul()(x), tt.silu_and_mul_reference(x), torch.float32, "SiluAndMul")


def _decoder_layer(dtype):
    config = Qwen2Config(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
                         rms_norm_eps=1e-6, attn_implementation="sdpa")
    layer = Qwen2DecoderLayer(config, layer_idx=0).to(dtype)
    with torch.no_grad():
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 5, 32, dtype=dtype)
    position_ids = torch.arange(5)[None].expand(2, 5)
    cos, sin = Qwen2RotaryEmbedding(config)(x, position_ids)
    return layer, x, (cos, sin)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decoder_layer_fuses_the_residual_add_into_the_post_attention_norm(dtype):
    """Forward equals the transformers layer with the norm kernel swapped in, bit for bit (the sum is
    rounded like ``residual + hidden_states``); fp32 gradients agree to fp32's tolerance (in bf16
    the residual gradient is added in fp32 inside the kernel instead of in bf16 by autograd, so
    weight gradients summed over rows differ by bf16 roundings: compared in fp32 only).
    The interpreter rounds fp32 -> bf16 its own way (not to nearest even), so there bf16 is
    compared with the tolerance only."""
    layer, x, position_embeddings = _decoder_layer(dtype)
    for norm in (layer.input_layernorm, layer.post_attention_layernorm):
        norm.forward = types.MethodType(layers.RMSNorm.forward, norm)

    def run():
        h = x.detach().requires_grad_()
        out = layer(h, position_embeddings=position_embeddings)
        grads = torch.autograd.grad(out.float().square().sum(), [h, *layer.parameters()])
        return out, grads

    want, want_grads = run()
    layer.forward = types.MethodType(layers.DecoderLayer.forward, layer)
    got, got_grads = run()
    if dtype == torch.float32 or not _launch.interpreting():
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    else:
        assert_close(got, want, dtype, "DecoderLayer output")
    if dtype == torch.float32:
        for g, w in zip(got_grads, want_grads):
            assert_close(g, w, dtype, "DecoderLayer grad")


def test_decoder_layer_falls_back_when_the_residual_differs_in_dtype():
    layer, x, position_embeddings = _decoder_layer(torch.float32)
    device = x.device.type
    with torch.autocast(device, dtype=torch.bfloat16):  # attention output bf16, residual fp32
        want = layer(x, position_embeddings=position_embeddings)
        layer.forward = types.MethodType(layers.DecoderLayer.forward, layer)
        got = layer(x, position_embeddings=position_embeddings)
    assert got.dtype == want.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("cls", [layers.SiluAndMul, layers.RMSNorm, layers.SwiGLUMLP, layers.DecoderLayer])
def test_layers_follow_the_kernels_layer_contract(cls):
    assert cls.__init__ is torch.nn.Module.__init__
    extra = set(dir(cls)) - set(dir(torch.nn.Module))
    assert extra == {"has_backward", "can_torch_compile"}
    assert cls.has_backward and cls.can_torch_compile


def test_get_local_kernel_loads_the_package_folder():
    """metadata.json next to __init__.py: kernels loads the folder itself as the build variant."""
    module = kernels.get_local_kernel(PACKAGE_DIR)
    norm = Qwen2RMSNorm(32, eps=1e-6)
    _compare_swapped(norm, module.layers.RMSNorm, torch.randn(4, 32), "RMSNorm via get_local_kernel")
    # The second copy reuses the operators the first import defined.
    assert module.rms_norm(torch.ones(1, 32), torch.ones(32)).shape == (1, 32)


class _TaggedQwen2RMSNorm(Qwen2RMSNorm):
    # transformers tags Qwen2RMSNorm itself only with some versions of its kernels integration
    kernel_layer_name = "RMSNorm"


def test_kernelize_swaps_qwen2_rms_norm_through_a_local_layer_repository(device):
    repo = kernels.LocalLayerRepository(repo_path=PACKAGE_DIR, layer_name="RMSNorm")
    model = torch.nn.Sequential(_TaggedQwen2RMSNorm(32, eps=1e-6)).to(device)
    x = torch.randn(3, 32, device=device)
    want = model(x)
    with kernels.use_kernel_mapping({"RMSNorm": {device: repo}}, inherit_mapping=False):
        kernels.kernelize(model, mode=kernels.Mode.TRAINING, device=device)
    assert model[0].forward.__func__.__qualname__ == "RMSNorm.forward"
    assert_close(model(x), want, torch.float32, "kernelized RMSNorm")


def test_hub_snapshot_layout_loads(tmp_path):
    """A Hub snapshot holds build/torch-universal/{metadata.json, twinkle_triton/}."""
    variant = tmp_path / "build" / "torch-universal"
    shutil.copytree(PACKAGE_DIR, variant / "twinkle_triton", ignore=shutil.ignore_patterns("__pycache__"))
    metadata = json.loads((PACKAGE_DIR / "metadata.json").read_text())
    metadata["id"] = "_twinkle_triton_snapshot_test"
    (variant / "metadata.json").write_text(json.dumps(metadata))
    module = kernels.get_local_kernel(tmp_path)
    assert module.__name__ == "_twinkle_triton_snapshot_test"
    x, w = torch.randn(2, 16), torch.randn(16)
    assert_close(module.rms_norm(x, w), tt.rms_norm_reference(x, w), torch.float32, "rms_norm via snapshot")
