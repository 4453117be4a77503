"""twinkle-kernel-module.md, "Example 1: Local Kernel Repo", run as written.

    python examples/docs/kernel_module_1_local_repo.py
"""

from _setup import DEVICE, LOCAL_REPO

# --- the document's block ---
from twinkle_fx import (
    kernelize_model,
    register_layer_kernel,
    register_external_layer,
)
from transformers import Qwen2Config, Qwen2ForCausalLM
from transformers.models.qwen2.modeling_qwen2 import Qwen2MLP

# 1) Register the layer kernel from a local repo
register_layer_kernel(
    kernel_name="MyAwesomeMLP",
    repo_path=LOCAL_REPO,
    package_name="my_kernels",
    layer_name="Qwen2MLPTrainingKernel",
    device=DEVICE,
    mode="train",
)

# 2) Bind external layer to kernel name
register_external_layer(Qwen2MLP, "MyAwesomeMLP")

# 3) Build the model and apply kernelization
config = Qwen2Config(
    hidden_size=128,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=4,
    intermediate_size=256,
    use_cache=False,
)
model = Qwen2ForCausalLM(config)
model = kernelize_model(model, mode="train", device=DEVICE, use_fallback=True)
# --- end of the block ---

import torch  # noqa: E402

from twinkle_fx.core.swaps import swapped_forward  # noqa: E402

print("mlp forward:", swapped_forward(model.model.layers[0].mlp))
input_ids = torch.randint(0, 1000, (1, 8))
loss = model.to(DEVICE)(input_ids.to(DEVICE), labels=input_ids.to(DEVICE)).loss
loss.backward()
print(f"train step through the local repo kernel: loss {loss.item():.4f}, "
      f"gate_proj grad norm {model.model.layers[0].mlp.gate_proj.weight.grad.norm().item():.4f}")
