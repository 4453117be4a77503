"""Layer kernels, eagerly: the documentation's example with a real local repo and a Hub kernel.

    python examples/eager_layers.py

The Hub kernel (kernels-community/activation) needs a network, or an offline cache:
    python examples/make_offline_hub_cache.py /tmp/twinkle-hf
    HF_HOME=/tmp/twinkle-hf HF_HUB_OFFLINE=1 python examples/eager_layers.py
Without either, twinkle_fx logs why it kept the original layer (use_fallback=True).
"""

import torch
from _common import DEVICE, LOCAL_REPO, report_close, tiny_qwen2
from transformers.models.qwen2.modeling_qwen2 import Qwen2MLP

from twinkle_fx import kernelize_model, register_external_layer, register_layer_kernel, undo_kernelize

register_layer_kernel(kernel_name="MyAwesomeMLP", repo_path=LOCAL_REPO,
                      package_name="my_kernels", layer_name="Qwen2MLPTrainingKernel",
                      device=DEVICE, mode="train")
register_layer_kernel(kernel_name="SiluAndMulKernel", repo_id="kernels-community/activation",
                      layer_name="SiluAndMul", device=DEVICE, mode="train", version=1)
register_external_layer(Qwen2MLP, "MyAwesomeMLP")


class SiluAndMul(torch.nn.Module):
    """A user's activation module, bound to the Hub kernel below."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        return torch.nn.functional.silu(x[..., :d]) * x[..., d:]


register_external_layer(SiluAndMul, "SiluAndMulKernel")

# Qwen2: the MLPs run the local repo's fused kernel; logits and gradients stay the same.
model = tiny_qwen2()
input_ids = torch.randint(0, model.config.vocab_size, (2, 16), device=DEVICE)
reference = model(input_ids, labels=input_ids)
reference.loss.backward()
reference_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
model.zero_grad()

model = kernelize_model(model, mode="train", device=DEVICE, use_fallback=True)
out = model(input_ids, labels=input_ids)
out.loss.backward()
report_close("logits", out.logits, reference.logits)
report_close("gate_proj grad", model.model.layers[0].mlp.gate_proj.weight.grad, reference_grads["model.layers.0.mlp.gate_proj.weight"])

undo_kernelize(model)
with torch.no_grad():
    restored = model(input_ids).logits
print("after undo, bit-identical to the original:", torch.equal(restored, reference.logits.detach()))

# The Hub kernel on a user module.
act = SiluAndMul()
x = torch.randn(4, 32, device=DEVICE, requires_grad=True)
expected = act(x)
kernelize_model(act, mode="train", device=DEVICE, use_fallback=True)
report_close("SiluAndMul", act(x), expected)
