"""twinkle-kernel-module.md, "Local Kernel Repo (Minimal)": the two files of the document, written
as they are into a fresh folder, loaded as a local repo and swapped into a Qwen2 model.

    python examples/docs/kernel_module_3_minimal_repo.py
"""

import tempfile
from pathlib import Path

from _setup import DEVICE

# --- the document's block (two files) ---
BLOCK = '''\
# my_kernels/__init__.py
from . import layers
__all__ = ["layers"]

# my_kernels/layers.py
import torch
import torch.nn as nn

class Qwen2MLPTrainingKernel(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.gate_proj(x)
        up = self.up_proj(x)
        return self.down_proj(self.act_fn(gate) * up)
'''
# --- end of the block ---

import torch  # noqa: E402
from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402
from transformers.models.qwen2.modeling_qwen2 import Qwen2MLP  # noqa: E402

from twinkle_fx import kernelize_model, register_external_layer, register_layer_kernel  # noqa: E402
from twinkle_fx.core.swaps import swapped_forward  # noqa: E402

init_part, layers_part = BLOCK.split("# my_kernels/layers.py\n")
workdir = tempfile.TemporaryDirectory(prefix="my-kernels-repo-")  # removed when the script ends
repo = Path(workdir.name)
(repo / "my_kernels").mkdir()
(repo / "my_kernels" / "__init__.py").write_text(init_part)
(repo / "my_kernels" / "layers.py").write_text(layers_part)
print("repo layout:", sorted(str(p.relative_to(repo)) for p in repo.rglob("*.py")))

register_layer_kernel(kernel_name="MyAwesomeMLP", repo_path=str(repo), package_name="my_kernels",
                      layer_name="Qwen2MLPTrainingKernel", device=DEVICE, mode="train")
register_external_layer(Qwen2MLP, "MyAwesomeMLP")
torch.manual_seed(0)
model = Qwen2ForCausalLM(Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                     num_attention_heads=4, num_key_value_heads=2, vocab_size=256)).to(DEVICE)
input_ids = torch.randint(0, 256, (1, 8), device=DEVICE)
reference = model(input_ids).logits
kernelize_model(model, mode="train", device=DEVICE, use_fallback=False)
print("mlp forward:", swapped_forward(model.model.layers[0].mlp))
print("logits equal the original:", torch.allclose(model(input_ids).logits, reference, atol=1e-6))
