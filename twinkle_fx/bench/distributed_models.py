"""The models :mod:`twinkle_fx.bench.distributed` trains (``--model`` at ``--size``) and the batches it feeds them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["DEFAULT_SHAPE", "MODELS", "SIZES", "ModelShape", "build_model", "global_batch", "model_config"]


@dataclass(frozen=True)
class ModelShape:
    """One ``--model``: a transformers causal LM and its config at each ``--size`` (``reference`` is the
    model's own shape; ``tiny`` and ``small`` shrink it for CPU runs and the Triton interpreter)."""

    family: str  # the transformers model type, also use_builtin_kernels(models=...)'s name for it
    config_class: str
    sizes: dict[str, dict[str, Any]]


# small enough for the Triton interpreter on a 2-core CPU, big enough (4 MB in fp32) that DDP
# buckets of 1 MB (the least DDPOptimizer accepts: its first bucket is 1 MB) split it in several
_TINY = dict(hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=256)
_SMALL = dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=8192)
MODELS: dict[str, ModelShape] = {
    # reference: the benchmark harness's reference workload (twinkle_fx/bench/workloads.py: "qwen2"), Qwen2-0.5B
    "qwen2": ModelShape("qwen2", "Qwen2Config", {
        "tiny": _TINY, "small": _SMALL,
        "reference": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                          num_key_value_heads=2, vocab_size=151936),
    }),
    # reference: Llama-3.2-3B (3.21 B parameters), the size FSDP2 is for: its bf16 weights, gradients and
    # AdamW states (25.7 GB) crowd one GPU
    "llama3b": ModelShape("llama", "LlamaConfig", {
        "tiny": _TINY, "small": _SMALL,
        "reference": dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=28, num_attention_heads=24,
                          num_key_value_heads=8, head_dim=128, vocab_size=128256, rope_theta=500000.0),
    }),
}
SIZES = ("tiny", "small", "reference")
# per-rank batch x sequence length when not given
DEFAULT_SHAPE = {"tiny": (1, 8), "small": (4, 256), "reference": (4, 1024)}


def model_config(model: str, size: str) -> dict[str, Any]:
    """The transformers config arguments of ``--model model --size size`` (tied embeddings, SDPA, no cache)."""
    return dict(MODELS[model].sizes[size], tie_word_embeddings=True, max_position_embeddings=4096,
                attn_implementation="sdpa", use_cache=False)


def build_model(model: str, size: str, dtype: torch.dtype, device: torch.device, seed: int) -> torch.nn.Module:
    """``--model`` at ``--size``, the same weights on every rank: initialised from ``seed`` on ``device``
    itself (every rank's GPU is of one kind, so they draw the same numbers; a 3B model initialised on the
    CPU and moved would cost seconds per run), in ``dtype`` the way ``from_config(dtype=...)`` makes it,
    which keeps the rotary ``inv_freq`` fp32 as in real bf16 training."""
    import transformers
    from transformers import AutoModelForCausalLM

    shape = MODELS[model]
    config = getattr(transformers, shape.config_class)(**model_config(model, size))
    torch.manual_seed(seed)
    with torch.device(device):
        built = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return built.train()


def global_batch(step: int, rows: int, seq: int, vocab: int, seed: int) -> torch.Tensor:
    """Micro-step ``step``'s global batch (on CPU), learnable: each row counts up from a random start by a
    random stride in 1..7 (mod vocab), so the loss falls as the model picks the rule up."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    start = torch.randint(0, vocab, (rows, 1), generator=generator)
    stride = torch.randint(1, 8, (rows, 1), generator=generator)
    return (start + stride * torch.arange(seq)) % vocab
