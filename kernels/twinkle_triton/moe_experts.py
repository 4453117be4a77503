"""The SiLU·mul of transformers' mixture-of-experts ``*Experts`` modules, as a ``kernels``-style layer.

transformers 5.x keeps each MoE layer's expert weights as 3-D parameters (``gate_up_proj``
``[E, 2I, H]``, ``down_proj`` ``[E, H, I]``) in one ``*Experts`` module (Mixtral, Qwen3-MoE,
DeepSeek-V3, ERNIE 4.5-MoE) and routes tokens through the implementation the config names
(``config._experts_implementation``): ``"grouped_mm"`` (the default where ``torch._grouped_mm``
can run), ``"batched_mm"``, or ``"eager"`` (a loop over the experts hit). :class:`SwiGLUExperts`
keeps that choice and changes only the activation product:

- ``grouped_mm`` / ``batched_mm``: transformers' own function runs, with the module's
  ``_apply_gate`` (``act_fn(gate) * up`` over the chunked projection) computed by
  :func:`silu_and_mul`: one kernel instead of chunk + SiLU + multiply;
- ``eager``: tokens are sorted by expert, each expert hit gets its two matmuls as in transformers'
  loop, and the SiLU·mul of all experts' rows runs as one :func:`silu_and_mul` launch instead of one
  SiLU and one multiply per expert.

This file imports nothing from transformers at import time; the grouped / batched functions are
looked up in ``transformers.integrations.moe`` when such a module runs.
"""

import torch
from torch import nn

from .silu_and_mul import silu_and_mul

# implementations that compute the gate through the module's _apply_gate (or, for "eager", that
# this layer reimplements); others ("deepgemm", "sonicmoe", ...) fuse the gate into their own kernel
_GATED_IMPLEMENTATIONS = ("grouped_mm", "batched_mm", "eager")


def _is_silu(act: object) -> bool:
    return isinstance(act, nn.SiLU) or type(act).__name__ == "SiLUActivation"


def _swiglu_experts_applies_to(module: nn.Module) -> str | None:
    absent = [n for n in ("gate_up_proj", "down_proj", "act_fn", "num_experts", "config") if not hasattr(module, n)]
    if absent:
        return f"it has no {', '.join(absent)}"
    if not _is_silu(module.act_fn):
        hidden_act = getattr(module.config, "hidden_act", None)
        return (f"its act_fn is {type(module.act_fn).__name__} (config hidden_act={hidden_act!r}); "
                "SwiGLUExperts computes silu(gate) * up")
    gate = getattr(type(module), "_apply_gate", None)
    if gate is not None and getattr(gate, "__name__", "") != "_default_apply_gate":
        return f"{type(module).__name__} defines its own _apply_gate (not act_fn(gate) * up of the chunked projection)"
    layout = {"has_gate": True, "is_concatenated": True, "is_transposed": False, "has_bias": False,
              "has_post_expert_norm": False, "_is_expert_parallel": False}
    odd = [f"{name}={getattr(module, name)!r}" for name, want in layout.items()
           if getattr(module, name, want) != want]
    if odd:
        return f"its experts layout is {', '.join(odd)}; SwiGLUExperts serves concatenated [gate; up] weights " \
               "without bias, post-expert norm or expert parallelism"
    implementation = getattr(module.config, "_experts_implementation", None)
    if implementation not in _GATED_IMPLEMENTATIONS:
        return (f"its config's experts implementation is {implementation!r}; SwiGLUExperts serves "
                f"{', '.join(map(repr, _GATED_IMPLEMENTATIONS))}")
    return None


class _KernelGate:
    """The experts module as transformers' experts functions read it, with ``_apply_gate`` computed
    by :func:`silu_and_mul` (every other attribute is the module's)."""

    __slots__ = ("_module",)

    def __init__(self, module: nn.Module) -> None:
        self._module = module

    def __getattr__(self, name: str):
        return getattr(self._module, name)

    @staticmethod
    def _apply_gate(gate_up: torch.Tensor) -> torch.Tensor:
        return silu_and_mul(gate_up)


def _sorted_experts(module: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor) -> torch.Tensor:
    """transformers' eager experts loop with the SiLU·mul of every expert in one launch."""
    final = torch.zeros_like(hidden_states)
    if hidden_states.shape[0] == 0:
        return final
    num_top_k = top_k_index.shape[-1]
    expert_ids = top_k_index.reshape(-1)
    order = torch.argsort(expert_ids, stable=True)
    token_idx = order // num_top_k
    # one host sync, as the eager loop's nonzero over the experts hit
    counts = torch.bincount(expert_ids, minlength=module.num_experts)[: module.num_experts].tolist()
    hit = [(e, n) for e, n in enumerate(counts) if n]
    rows = hidden_states[token_idx]
    starts = [0]
    for _, n in hit:
        starts.append(starts[-1] + n)
    gate_up = torch.cat([nn.functional.linear(rows[a:b], module.gate_up_proj[e])
                         for (e, _), a, b in zip(hit, starts, starts[1:])])
    h = silu_and_mul(gate_up)
    down = torch.cat([nn.functional.linear(h[a:b], module.down_proj[e]) for (e, _), a, b in zip(hit, starts, starts[1:])])
    weighted = down * top_k_weights.reshape(-1)[order, None]
    final.index_add_(0, token_idx, weighted.to(final.dtype))
    return final


class SwiGLUExperts(nn.Module):
    """transformers' MoE ``*Experts`` (Mixtral, Qwen3-MoE, DeepSeek-V3, ERNIE 4.5-MoE) with the
    experts' ``silu(gate) * up`` computed by :func:`silu_and_mul`; routing and matmuls stay those of
    the config's experts implementation (see the module docstring).

    Applies where ``act_fn`` is SiLU, the class keeps transformers' default ``_apply_gate``, the
    weights are concatenated ``[gate; up]`` without bias, and the implementation is one of
    ``grouped_mm``, ``batched_mm``, ``eager``. GPT-OSS (clamped ``(up + 1) * glu`` over interleaved
    columns) does not.
    """

    has_backward = True
    can_torch_compile = True

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
                ) -> torch.Tensor:
        implementation = self.config._experts_implementation
        if implementation == "eager":
            return _sorted_experts(self, hidden_states, top_k_index, top_k_weights)
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

        return ALL_EXPERTS_FUNCTIONS[implementation](_KernelGate(self), hidden_states, top_k_index, top_k_weights)

    forward.applies_to = _swiglu_experts_applies_to
