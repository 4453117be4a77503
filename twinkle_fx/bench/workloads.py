"""The end-to-end workloads: transformers causal-LM configs by name, a seeded model, a seeded batch.

``qwen2`` is the reference workload (the Qwen2-0.5B shape, the README's performance tables). The others are real models
of comparable size in the other families twinkle_fx's built-in kernels cover, so one flag switches
the architecture without changing the order of magnitude of the step:

============  ======  =====  ======  =====  ===  ======  ====  ==================================
name          hidden  inter  layers  heads  kv   vocab   tied  shape of
============  ======  =====  ======  =====  ===  ======  ====  ==================================
qwen2         896     4864   24      14     2    151936  yes   Qwen2-0.5B
qwen3         1024    3072   28      16     8    151936  yes   Qwen3-0.6B (head_dim 128, q/k norm)
llama         960     2560   32      15     5    49152   yes   SmolLM2-360M (Llama architecture)
mistral       896     4864   24      14     2    32768   no    Qwen2-0.5B dims, Mistral v0.3 vocab
============  ======  =====  ======  =====  ===  ======  ====  ==================================

Every other family of the built-in mapping (:data:`twinkle_fx.builtin.BUILTIN_MODELS`) is a workload
too, under its family name: a published model's dimensions with fewer layers (``shape_of`` says
which model and how many of its layers), so a step fits one GPU; MoE families keep their expert
count and top-k. ``qwen3_moe_8l`` is Qwen3-MoE's with eight layers instead of four.

Weights are random (no download): every backend gets a fresh model built with the same seed on the
same device, so first-step losses are comparable across backends. ``--tiny`` swaps in a config of
the same family small enough for a CPU smoke test.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["Workload", "WORKLOADS", "TINY_CONFIG", "get_workload", "build_model", "make_batch"]


@dataclass(frozen=True)
class Workload:
    """A named model config: ``family`` is the transformers model type, ``config_class`` its config."""

    name: str
    family: str  # transformers model-type module name: qwen2, qwen3, llama, mistral
    config_class: str
    config: dict[str, Any] = field(default_factory=dict)
    shape_of: str = ""
    tiny_overrides: dict[str, Any] = field(default_factory=dict)  # --tiny: what the family needs beyond TINY_CONFIG

    def summary(self, *, tiny: bool = False) -> dict[str, Any]:
        """The config values that define the workload's size (what the report prints)."""
        config = self.config_kwargs(tiny=tiny)
        keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "vocab_size", "tie_word_embeddings")
        return {key: config[key] for key in keys if key in config}

    def describe(self, *, tiny: bool = False) -> dict[str, Any]:
        """The workload's part of a saved result: name, the model it has the shape of, its size."""
        return {"model": self.name, "shape_of": self.shape_of + (" (tiny config)" if tiny else ""),
                "config": self.summary(tiny=tiny)}

    def config_kwargs(self, *, tiny: bool = False) -> dict[str, Any]:
        config = dict(self.config)
        if tiny:
            config.update(TINY_CONFIG)
            config.update(self.tiny_overrides)
        config.setdefault("attn_implementation", "sdpa")
        config.update(use_cache=False)
        return config


# A config every family accepts, small enough that a training step through the Triton interpreter
# takes well under a second on a 2-core CPU.
TINY_CONFIG: dict[str, Any] = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, vocab_size=256,
)

WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload(
            "qwen2", "qwen2", "Qwen2Config",
            dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
            "Qwen2-0.5B",
        ),
        Workload(
            "qwen3", "qwen3", "Qwen3Config",
            dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True),
            "Qwen3-0.6B",
        ),
        Workload(
            "llama", "llama", "LlamaConfig",
            dict(hidden_size=960, intermediate_size=2560, num_hidden_layers=32, num_attention_heads=15,
                 num_key_value_heads=5, vocab_size=49152, tie_word_embeddings=True),
            "SmolLM2-360M (Llama architecture)",
        ),
        Workload(
            "mistral", "mistral", "MistralConfig",
            dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, vocab_size=32768, tie_word_embeddings=False, sliding_window=None),
            "Qwen2-0.5B dims with Mistral v0.3 vocab",
        ),
        Workload(  # the wider shape the GEMM-fusion decision was measured at
            "llama1b", "llama", "LlamaConfig",
            dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                 num_key_value_heads=8, head_dim=64, vocab_size=128256, tie_word_embeddings=True),
            "Llama-3.2-1B",
        ),
        Workload(
            "qwen3_1_7b", "qwen3", "Qwen3Config",
            dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True),
            "Qwen3-1.7B",
        ),
        Workload(
            "llama3b", "llama", "LlamaConfig",
            dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=28, num_attention_heads=24,
                 num_key_value_heads=8, head_dim=128, vocab_size=128256, tie_word_embeddings=True),
            "Llama-3.2-3B",
        ),
    )
}


# The other families of the built-in mapping: (config class, real-size config, shape of, --tiny overrides).
# Tiny configs put the special ids inside the 256-token vocabulary (several families default beyond it).
_IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
_TINY_MOE = dict(moe_intermediate_size=32, num_experts_per_tok=2)
_FAMILY_WORKLOADS: dict[str, tuple[str, dict[str, Any], str, dict[str, Any]]] = {
    "gemma": ("GemmaConfig", dict(hidden_size=2048, intermediate_size=16384, num_hidden_layers=6, num_attention_heads=8,
                                  num_key_value_heads=1, head_dim=256, vocab_size=256000), "Gemma-2B, 6 of 18 layers",
              _IDS),
    "gemma2": ("Gemma2Config", dict(hidden_size=2304, intermediate_size=9216, num_hidden_layers=8, num_attention_heads=8,
                                    num_key_value_heads=4, head_dim=256, vocab_size=256000,
                                    # transformers' Gemma2 attention (logit soft-capping) has no SDPA path
                                    attn_implementation="eager"),
               "Gemma-2-2B, 8 of 26 layers", _IDS),
    "gemma3": ("Gemma3TextConfig", dict(hidden_size=1152, intermediate_size=6912, num_hidden_layers=13,
                                        num_attention_heads=4, num_key_value_heads=1, head_dim=256, vocab_size=262144),
               "Gemma-3-1B, 13 of 26 layers", _IDS),
    "phi3": ("Phi3Config", dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=6, num_attention_heads=32,
                                num_key_value_heads=32, vocab_size=32064), "Phi-3-mini, 6 of 32 layers",
             dict(_IDS, partial_rotary_factor=0.5)),
    "olmo2": ("Olmo2Config", dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=8, num_attention_heads=16,
                                  num_key_value_heads=16, vocab_size=100352), "OLMo-2-1B, 8 of 16 layers", _IDS),
    "granite": ("GraniteConfig", dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=8,
                                      num_attention_heads=32, num_key_value_heads=8, vocab_size=49159),
                "Granite-3.3-2B, 8 of 40 layers", _IDS),
    "smollm3": ("SmolLM3Config", dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=8,
                                      num_attention_heads=16, num_key_value_heads=4, vocab_size=128256),
                "SmolLM3-3B, 8 of 36 layers", _IDS),
    "glm4": ("Glm4Config", dict(hidden_size=4096, intermediate_size=13696, num_hidden_layers=4, num_attention_heads=32,
                                num_key_value_heads=2, head_dim=128, vocab_size=151552), "GLM-4-9B-0414, 4 of 40 layers",
             _IDS),
    "deepseek_v3": ("DeepseekV3Config", dict(hidden_size=2048, intermediate_size=11264, moe_intermediate_size=1408,
                                             num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=16,
                                             q_lora_rank=None, kv_lora_rank=512, qk_rope_head_dim=64,
                                             qk_nope_head_dim=128, v_head_dim=128, n_routed_experts=64,
                                             num_experts_per_tok=6, n_shared_experts=2, first_k_dense_replace=1,
                                             n_group=1, topk_group=1, vocab_size=163840),
                    "Moonlight-16B-A3B (DeepSeek-V3 architecture), 4 of 27 layers",
                    dict(_IDS, **_TINY_MOE, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
                         v_head_dim=16, head_dim=8, num_key_value_heads=4, n_routed_experts=4, first_k_dense_replace=1,
                         n_group=1, topk_group=1)),
    "mixtral": ("MixtralConfig", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=2,
                                      num_attention_heads=32, num_key_value_heads=8, num_local_experts=8,
                                      num_experts_per_tok=2, vocab_size=32000), "Mixtral-8x7B, 2 of 32 layers",
                dict(_IDS, num_local_experts=4, num_experts_per_tok=2)),
    "qwen3_moe": ("Qwen3MoeConfig", dict(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                                         num_hidden_layers=4, num_attention_heads=32, num_key_value_heads=4,
                                         head_dim=128, num_experts=128, num_experts_per_tok=8, vocab_size=151936),
                  "Qwen3-30B-A3B, 4 of 48 layers", dict(_IDS, **_TINY_MOE, num_experts=4)),
    "gpt_oss": ("GptOssConfig", dict(hidden_size=2880, intermediate_size=2880, num_hidden_layers=4,
                                     num_attention_heads=64, num_key_value_heads=8, head_dim=64, num_local_experts=32,
                                     num_experts_per_tok=4, vocab_size=201088,
                                     # transformers' GptOss attention (with sinks) has no SDPA path
                                     attn_implementation="eager"), "gpt-oss-20b, 4 of 24 layers",
                dict(_IDS, num_local_experts=4, num_experts_per_tok=2)),
    "ernie4_5": ("Ernie4_5Config", dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=18,
                                        num_attention_heads=16, num_key_value_heads=2, head_dim=128, vocab_size=103424),
                 "ERNIE-4.5-0.3B", _IDS),
    "ernie4_5_moe": ("Ernie4_5_MoeConfig", dict(hidden_size=2560, intermediate_size=12288, moe_intermediate_size=1536,
                                                num_hidden_layers=4, num_attention_heads=20, num_key_value_heads=4,
                                                head_dim=128, moe_num_experts=64, moe_k=6, moe_num_shared_experts=2,
                                                moe_layer_start_index=1, vocab_size=103424),
                     "ERNIE-4.5-21B-A3B, 4 of 28 layers",
                     dict(_IDS, moe_intermediate_size=32, moe_num_experts=4, moe_k=2, moe_num_shared_experts=1)),
    "cohere": ("CohereConfig", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=4,
                                    num_attention_heads=32, num_key_value_heads=8, vocab_size=256000),
               "Aya-23-8B (Cohere architecture), 4 of 32 layers", _IDS),
    "starcoder2": ("Starcoder2Config", dict(hidden_size=3072, intermediate_size=12288, num_hidden_layers=6,
                                            num_attention_heads=24, num_key_value_heads=2, vocab_size=49152,
                                            use_bias=True, sliding_window=None),
                   "StarCoder2-3B, 6 of 30 layers", _IDS),
}
WORKLOADS.update((name, Workload(name, name, config_class, config, shape_of, tiny))
                 for name, (config_class, config, shape_of, tiny) in _FAMILY_WORKLOADS.items())
# A MoE step deeper than the family's slice: eight Qwen3-30B-A3B layers, the LM head a smaller part of the step
_QWEN3_MOE = WORKLOADS["qwen3_moe"]
WORKLOADS["qwen3_moe_8l"] = Workload("qwen3_moe_8l", "qwen3_moe", _QWEN3_MOE.config_class,
                                     dict(_QWEN3_MOE.config, num_hidden_layers=8), "Qwen3-30B-A3B, 8 of 48 layers",
                                     _QWEN3_MOE.tiny_overrides)


def get_workload(name: str) -> Workload:
    """The workload called ``name``.

    Raises:
        ValueError: unknown name (the message lists the known ones).

    Examples:
        >>> get_workload("qwen2").config["vocab_size"]
        151936
    """
    try:
        return WORKLOADS[name]
    except KeyError:
        raise ValueError(f"Unknown model {name!r}; choose one of: {', '.join(WORKLOADS)}.") from None


def _transformers_class(workload: Workload, attr: str):
    module = importlib.import_module(f"transformers.models.{workload.family}")
    return getattr(module, attr)


def build_model(workload: Workload, *, tiny: bool, dtype: torch.dtype, device: torch.device,
                seed: int) -> torch.nn.Module:
    """A freshly initialised causal LM of ``workload`` on ``device`` in ``dtype``, in training mode.

    The same ``seed``, device and dtype give the same weights bit for bit, so every backend of one
    run starts from the same model. Parameters are created on ``device`` directly (a 0.5B model
    initialised on the CPU costs seconds per backend) and in ``dtype`` the way ``from_pretrained(...,
    dtype=...)`` makes them: the rotary ``inv_freq`` buffer stays fp32, as it would in real training
    (``model.to(bf16)`` would round it).
    """
    from transformers import AutoModelForCausalLM

    config = _transformers_class(workload, workload.config_class)(**workload.config_kwargs(tiny=tiny))
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.train()


def make_batch(workload: Workload, *, tiny: bool, batch: int, seq: int, device: torch.device,
               seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded random ``(input_ids, labels)`` of shape ``batch x seq``; labels are the inputs (the model
    shifts them), so the loss covers ``batch * (seq - 1)`` tokens."""
    vocab = workload.config_kwargs(tiny=tiny)["vocab_size"]
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, vocab, (batch, seq), generator=generator).to(device)
    return input_ids, input_ids.clone()
