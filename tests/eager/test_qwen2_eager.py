"""A transformers Qwen2ForCausalLM kernelized with a local-repo MLP kernel and an RMSNorm kernel."""

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from transformers.models.qwen2.modeling_qwen2 import Qwen2MLP, Qwen2RMSNorm

from twinkle_fx import kernelize_model, register_external_layer, register_layer_kernel, undo_kernelize
from twinkle_fx.core.swaps import swapped_forward

TOLERANCES = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.bfloat16: dict(atol=3e-2, rtol=3e-2)}


def _tiny_qwen2(dtype):
    torch.manual_seed(0)
    config = Qwen2Config(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
    config._attn_implementation = "eager"
    return Qwen2ForCausalLM(config).to(dtype)


def _step(model, input_ids):
    model.zero_grad(set_to_none=True)
    out = model(input_ids, labels=input_ids)
    out.loss.backward()
    return out.logits.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernelized_qwen2_matches_logits_and_grads_then_undo_is_bit_identical(local_repo, dtype, device):
    register_layer_kernel(kernel_name="MyAwesomeMLP", repo_path=local_repo, package_name="my_kernels",
                          layer_name="Qwen2MLPTrainingKernel", device=device, mode="train")
    register_layer_kernel(kernel_name="RMSNorm", repo_path=local_repo, package_name="my_kernels",
                          layer_name="RMSNormKernel", device=device, mode="train")
    register_external_layer(Qwen2MLP, "MyAwesomeMLP")
    # transformers tags Qwen2RMSNorm with kernel_layer_name="RMSNorm" only with some versions of the
    # `kernels` integration (not 5.17's): bind it explicitly so every machine swaps the same layers
    register_external_layer(Qwen2RMSNorm, "RMSNorm")

    model = _tiny_qwen2(dtype).to(device)
    input_ids = torch.randint(0, 128, (2, 11), device=device)
    ref_logits, ref_grads = _step(model, input_ids)

    kernelize_model(model, mode="train", use_fallback=False)
    swapped = [type(m) for m in model.modules() if swapped_forward(m) is not None]
    assert swapped.count(Qwen2MLP) == 2 and swapped.count(Qwen2RMSNorm) == 5  # 2 per layer + final norm
    logits, grads = _step(model, input_ids)
    torch.testing.assert_close(logits, ref_logits, **TOLERANCES[dtype])
    assert grads.keys() == ref_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], **TOLERANCES[dtype], msg=lambda m: f"{name}: {m}")

    undo_kernelize(model)
    assert not any(swapped_forward(m) for m in model.modules())
    logits_after, grads_after = _step(model, input_ids)
    assert torch.equal(logits_after, ref_logits)
    assert all(torch.equal(grads_after[n], ref_grads[n]) for n in ref_grads)
