"""custom-kernel-quickstart.md, "In an existing model (Qwen3)": the block as written (the gated MLP
from examples/custom_mlp.py for nanovllm.layers.custom_mlp), then the same swap in transformers'
own Qwen3 model, checked against the original.

    python examples/docs/quickstart_3_qwen3_layer.py
"""

import functools

# first: on the CPU it switches the Triton interpreter on, which must happen before transformers imports triton
from _setup import DEVICE

import torch
from torch import nn
from transformers import Qwen3Config, Qwen3ForCausalLM
from transformers.models.qwen3 import modeling_qwen3

# The block's context: its Qwen3Attention takes the config only (transformers' also takes layer_idx).
Qwen3Attention = functools.partial(modeling_qwen3.Qwen3Attention, layer_idx=0)

# --- the document's block ---
from custom_mlp import CustomGatedMLP

class Qwen3DecoderLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.self_attn = Qwen3Attention(config)

        # replace the standard MLP with the optimized version
        self.mlp = CustomGatedMLP(
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            use_custom_kernels=True,
        )
        # ...
# --- end of the block ---

config = Qwen3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16, vocab_size=256)
config._attn_implementation = "eager"
layer = Qwen3DecoderLayer(config)
print("the block's layer:", type(layer.self_attn).__name__, "+", layer.mlp)

# The same swap in transformers' Qwen3: every decoder layer's MLP becomes a CustomGatedMLP holding
# the same weights (the parameter names agree, so the state_dict loads as is).
torch.manual_seed(0)
model = Qwen3ForCausalLM(config).to(DEVICE)
input_ids = torch.randint(0, config.vocab_size, (2, 17), device=DEVICE)
reference = model(input_ids, labels=input_ids)
for decoder_layer in model.model.layers:
    custom = CustomGatedMLP(hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
                            use_custom_kernels=True).to(DEVICE)
    custom.load_state_dict(decoder_layer.mlp.state_dict())
    decoder_layer.mlp = custom
out = model(input_ids, labels=input_ids)
out.loss.backward()
print(f"Qwen3 with CustomGatedMLP: loss {out.loss.item():.6f} vs {reference.loss.item():.6f}, logits match:",
      torch.allclose(out.logits, reference.logits, atol=1e-5))
