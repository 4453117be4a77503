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
        config.update(attn_implementation="sdpa", use_cache=False)
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
        Workload(  # compilespeed: the wider shape the GEMM-fusion decision was measured at
            "llama1b", "llama", "LlamaConfig",
            dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                 num_key_value_heads=8, head_dim=64, vocab_size=128256, tie_word_embeddings=True),
            "Llama-3.2-1B",
        ),
    )
}


def get_workload(name: str) -> Workload:
    """The workload called ``name``.

    Raises:
        ValueError: unknown name (the message lists the known ones).

    Example:
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
