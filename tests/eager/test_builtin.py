"""The built-in mapping swaps transformers' RMSNorm, MLP and rotary for twinkle_triton kernels."""

import importlib

import pytest
import torch
import transformers

from twinkle_fx import kernelize_model, undo_kernelize
from twinkle_fx.builtin import BUILTIN_MODELS, use_builtin_kernels
from twinkle_fx.core.swaps import swapped_forward

CONFIGS = {
    "qwen2": transformers.Qwen2Config, "llama": transformers.LlamaConfig,
    "mistral": transformers.MistralConfig, "qwen3": transformers.Qwen3Config,
}


@pytest.mark.parametrize("family", list(CONFIGS))  # the other families: tests/families
def test_builtin_kernels_match_the_model_in_training(family, device):
    use_builtin_kernels(devices=(device,), models=(family,))
    torch.manual_seed(0)
    config = CONFIGS[family](hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4,
                             num_key_value_heads=2, vocab_size=128, max_position_embeddings=64, head_dim=16)
    config._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(config).to(device)
    input_ids = torch.randint(0, 128, (2, 9), device=device)
    ref = model(input_ids, labels=input_ids)
    ref.loss.backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()

    modeling = importlib.import_module(BUILTIN_MODELS[family][0])
    original_rotary = modeling.apply_rotary_pos_emb
    kernelize_model(model, mode="train", use_fallback=False)
    assert modeling.apply_rotary_pos_emb is not original_rotary
    # 2 norms + MLP + final norm + the causal-LM head; Qwen3 also normalises q and k per head
    assert sum(swapped_forward(m) is not None for m in model.modules()) == (7 if family == "qwen3" else 5)
    out = model(input_ids, labels=input_ids)
    out.loss.backward()
    assert out.logits is None  # fused loss: training with labels never materialises the logits
    torch.testing.assert_close(out.loss, ref.loss, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(input_ids).logits, ref.logits, atol=1e-4, rtol=1e-4)
    model.train()
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, ref_grads[name], atol=1e-4, rtol=1e-4, msg=lambda m: f"{name}: {m}")
    undo_kernelize(model)
    assert modeling.apply_rotary_pos_emb is original_rotary


def test_unknown_family():
    with pytest.raises(ValueError, match="built-in families: qwen2, llama, mistral, qwen3"):
        use_builtin_kernels(models=("gpt2",))


@pytest.mark.parametrize("family", list(CONFIGS))
def test_builtin_decoder_layers_match_the_model(family, device):
    """decoder_layers=True adds the residual-add + norm fusion; the loss and gradients still match."""
    bound = use_builtin_kernels(devices=(device,), models=(family,), fused_loss=False, decoder_layers=True)
    prefix = BUILTIN_MODELS[family].head.removesuffix("ForCausalLM")
    assert f"{prefix}DecoderLayer -> DecoderLayer" in bound
    torch.manual_seed(0)
    config = CONFIGS[family](hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, vocab_size=128, max_position_embeddings=64, head_dim=16)
    model = transformers.AutoModelForCausalLM.from_config(config).to(device)
    input_ids = torch.randint(0, 128, (2, 9), device=device)
    ref = model(input_ids, labels=input_ids)
    ref.loss.backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    kernelize_model(model, mode="train", use_fallback=False)
    layers = [m for m in model.modules() if type(m).__name__ == f"{prefix}DecoderLayer"]
    assert len(layers) == 2 and all(swapped_forward(m).kernel_name == "DecoderLayer" for m in layers)
    out = model(input_ids, labels=input_ids)
    out.loss.backward()
    torch.testing.assert_close(out.loss, ref.loss, atol=1e-5, rtol=1e-5)
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, ref_grads[name], atol=1e-4, rtol=1e-4, msg=lambda m: f"{name}: {m}")
    undo_kernelize(model)
