"""Inputs for one check call: built-in transformers targets get a small config of their family,
other layers and functions a ``(rows, width)`` tensor each; anything else takes ``inputs=``."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable

import torch

from .report import CheckInputs

def sizes(tiny: bool) -> list[tuple[int, int]]:
    """(rows, width) per size: odd row counts and widths that are no power of two."""
    # GPU: up to 4093 tokens (the fused-loss check holds 4093 x 151936 logits in fp32 and fp64)
    return [(1, 8), (7, 34), (33, 130)] if tiny else [(1, 1024), (1023, 4098), (4093, 8192)]


def _transformers_config(cls: type, tiny: bool):
    """A small config of the transformers model family ``cls`` belongs to, or None."""
    module = sys.modules.get(cls.__module__)
    if module is None or not cls.__module__.startswith("transformers.models."):
        return None
    from transformers import PretrainedConfig

    configs = [v for v in vars(module).values() if isinstance(v, type) and issubclass(v, PretrainedConfig)
               and v is not PretrainedConfig]
    if not configs:
        return None
    widths = (dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
              if tiny else  # Qwen2-0.5B's widths and vocabulary, one layer
              dict(hidden_size=896, intermediate_size=4864, num_attention_heads=14, num_key_value_heads=2,
                   vocab_size=151936))
    config = configs[0](num_hidden_layers=1, max_position_embeddings=max(r for r, _ in sizes(tiny)) + 1,
                        tie_word_embeddings=True, **widths)
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"  # what a bare config leaves unset (from_config would pick one)
    return config


def _randomize(module: torch.nn.Module) -> torch.nn.Module:
    # weights at their init (RMSNorm weights are all ones) would hide a kernel that ignores them
    with torch.no_grad():
        for p in module.parameters():
            if p.is_floating_point():
                p.add_(torch.randn_like(p) * 0.1 * (p.detach().float().std().nan_to_num(0).item() + 0.1))
    return module


def layer_inputs(cls: type, rows: int, width: int, dtype: torch.dtype, device: torch.device, tiny: bool) -> CheckInputs:
    config = _transformers_config(cls, tiny)
    params = list(inspect.signature(cls.__init__).parameters)[1:]
    if config is not None and params[:1] == ["config"]:
        module = cls(config)
        forward = list(inspect.signature(cls.forward).parameters)[1:]
        if "input_ids" in forward:
            ids = torch.randint(0, config.vocab_size, (1, rows), device=device)
            kwargs = {"input_ids": ids, "labels": ids} if "labels" in forward else {"input_ids": ids}
            return CheckInputs((), kwargs, _randomize(module).to(device=device, dtype=dtype))
        if "top_k_index" in forward:  # MoE *Experts(hidden_states, top_k_index, top_k_weights): routed tokens
            k = min(2, module.num_experts)
            index = torch.rand(rows, module.num_experts).argsort(-1)[:, :k].to(device)
            weights = torch.rand(rows, k, device=device).softmax(-1).to(dtype)
            x = torch.randn(rows, config.hidden_size, device=device, dtype=dtype)
            with torch.no_grad():  # 3-D expert weights come from torch.empty: only the model's init fills them
                for p in module.parameters():
                    p.normal_(0.0, 0.1)
            return CheckInputs((x, index, weights), {}, module.to(device=device, dtype=dtype))
        x = torch.randn(1, rows, config.hidden_size, device=device, dtype=dtype)
        return CheckInputs((x,), {}, _randomize(module).to(device=device, dtype=dtype))
    if config is not None and params[:1] == ["hidden_size"]:  # RMSNorm(hidden_size, eps)
        module = cls(config.hidden_size)
        x = torch.randn(1, rows, config.hidden_size, device=device, dtype=dtype)
        return CheckInputs((x,), {}, _randomize(module).to(device=device, dtype=dtype))
    if cls in (torch.nn.Linear, torch.nn.LayerNorm) or (params[:1] in (["in_features"], ["normalized_shape"])):
        module = cls(width, width) if "in_features" in params else cls(width)
    else:
        try:
            module = cls()
        except TypeError as e:
            raise NoInputs(f"cannot build {cls.__qualname__} without arguments ({e}); pass inputs={{{cls.__qualname__}: make}}") from e
    return CheckInputs((torch.randn(rows, width, device=device, dtype=dtype),), {},
                       _randomize(module).to(device=device, dtype=dtype))


def function_inputs(name: str, function: Callable, rows: int, width: int, dtype: torch.dtype, device: torch.device,
                     tiny: bool) -> CheckInputs:
    # transformers' (q, k, cos, sin), DeepSeek-V3's interleaved variant too; wrapped by kernels' hub decorator
    if name in ("apply_rotary_pos_emb", "apply_rotary_pos_emb_interleave"):
        heads, kv_heads, head_dim = (4, 2, 16) if tiny else (14, 2, 64)
        q = torch.randn(1, heads, rows, head_dim, device=device, dtype=dtype)
        k = torch.randn(1, kv_heads, rows, head_dim, device=device, dtype=dtype)
        inv_freq = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
        freqs = torch.arange(rows, device=device, dtype=torch.float32)[:, None] * inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)[None]
        return CheckInputs((q, k, emb.cos().to(dtype), emb.sin().to(dtype)), no_grad_args=(2, 3))
    try:
        params = inspect.signature(function).parameters.values()
    except (TypeError, ValueError) as e:
        raise NoInputs(f"cannot read the signature of {name or function!r}; pass inputs=") from e
    required = [p for p in params if p.default is inspect.Parameter.empty
                and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return CheckInputs(tuple(torch.randn(rows, width, device=device, dtype=dtype) for _ in required))


class NoInputs(Exception):
    """The check cannot make inputs for a target (the message says what to pass)."""
