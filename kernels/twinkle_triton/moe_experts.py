"""The gated activation of transformers' mixture-of-experts ``*Experts`` modules, as ``kernels``-style
layers: :class:`SwiGLUExperts` (SiLU·mul) and :class:`ClampedSwiGLUExperts` (GPT-OSS); and
:class:`FusedSwiGLUExperts`, the whole experts computation as fused grouped GEMMs.

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

GPT-OSS's ``GptOssExperts`` has the same structure with another gate: gate and up interleaved in
``gate_up_proj`` (``[E, H, 2I]``, transposed, with biases) and ``_apply_gate`` computing a clamped
``(up + 1) * gate * sigmoid(alpha * gate)``; :class:`ClampedSwiGLUExperts` computes that with
:func:`clamped_swiglu`, keeping the implementation's routing and matmuls the same way.

:class:`FusedSwiGLUExperts` replaces the implementation instead: routing, both projections, the SwiGLU
and the weighted sum over the k experts of a token run as the grouped GEMM kernels of
:mod:`.moe_gemm` (no permuted copy of the tokens, no host sync), forward and backward. twinkle_fx's
built-in mapping binds :class:`SwiGLUExperts` by default and this layer when asked
(``use_builtin_kernels(fused_experts=True)``); bound by name, it is::

    register_layer_kernel(kernel_name="FusedSwiGLUExperts", layer=twinkle_triton.layers.FusedSwiGLUExperts,
                          device="cuda", binds_by_tag=False)
    register_external_layer(Qwen3MoeExperts, "FusedSwiGLUExperts")

This file imports nothing from transformers at import time; the grouped / batched functions are
looked up in ``transformers.integrations.moe`` when such a module runs.
"""

from collections.abc import Callable

import torch
from torch import nn

from .clamped_swiglu import clamped_swiglu, clamped_swiglu_reference
from .moe_gemm import moe_swiglu_experts
from .silu_and_mul import silu_and_mul

# implementations that compute the gate through the module's _apply_gate (or, for "eager", that
# this layer reimplements); others ("deepgemm", "sonicmoe", ...) fuse the gate into their own kernel
_GATED_IMPLEMENTATIONS = ("grouped_mm", "batched_mm", "eager")


def _is_silu(act: object) -> bool:
    return isinstance(act, nn.SiLU) or type(act).__name__ == "SiLUActivation"


def _absent(module: nn.Module, *names: str) -> str | None:
    absent = [n for n in names if not hasattr(module, n)]
    return f"it has no {', '.join(absent)}" if absent else None


def _odd_layout(module: nn.Module, **want: bool) -> list[str]:
    """The experts-layout flags (set by transformers' ``use_experts_implementation``) that differ from ``want``."""
    return [f"{name}={getattr(module, name)!r}" for name, value in want.items() if getattr(module, name, value) != value]


def _unserved_implementation(module: nn.Module, layer: str) -> str | None:
    implementation = getattr(module.config, "_experts_implementation", None)
    if implementation not in _GATED_IMPLEMENTATIONS:
        return (f"its config's experts implementation is {implementation!r}; {layer} serves "
                f"{', '.join(map(repr, _GATED_IMPLEMENTATIONS))}")
    return None


def _swiglu_layout_refusal(module: nn.Module, layer: str) -> str | None:
    """Why ``module`` is not transformers' SiLU-gated experts layout (concatenated ``[gate; up]``, no bias)."""
    absent = _absent(module, "gate_up_proj", "down_proj", "act_fn", "num_experts", "config")
    if absent:
        return absent
    if not _is_silu(module.act_fn):
        hidden_act = getattr(module.config, "hidden_act", None)
        return (f"its act_fn is {type(module.act_fn).__name__} (config hidden_act={hidden_act!r}); "
                f"{layer} computes silu(gate) * up")
    gate = getattr(type(module), "_apply_gate", None)
    if gate is not None and getattr(gate, "__name__", "") != "_default_apply_gate":
        return f"{type(module).__name__} defines its own _apply_gate (not act_fn(gate) * up of the chunked projection)"
    odd = _odd_layout(module, has_gate=True, is_concatenated=True, is_transposed=False, has_bias=False,
                      has_post_expert_norm=False, _is_expert_parallel=False)
    if odd:
        return f"its experts layout is {', '.join(odd)}; {layer} serves concatenated [gate; up] weights " \
               "without bias, post-expert norm or expert parallelism"
    return None


def _swiglu_experts_applies_to(module: nn.Module) -> str | None:
    return _swiglu_layout_refusal(module, "SwiGLUExperts") or _unserved_implementation(module, "SwiGLUExperts")


class _KernelGate:
    """The experts module as transformers' experts functions read it, with ``_apply_gate`` computed
    by a kernel (every other attribute is the module's)."""

    __slots__ = ("_module", "_apply_gate")

    def __init__(self, module: nn.Module, gate: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self._module = module
        self._apply_gate = gate

    def __getattr__(self, name: str):
        return getattr(self._module, name)


def _project(module: nn.Module, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """One expert's projection in transformers' layout: weight ``[out, in]``, or ``[in, out]`` when transposed."""
    out = x @ weight if getattr(module, "is_transposed", False) else nn.functional.linear(x, weight)
    return out if bias is None else out + bias


def _sorted_experts(module: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor, gate: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """transformers' eager experts loop with the gate of every expert in one launch (biases where the
    module has them)."""
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
    has_bias = getattr(module, "has_bias", False)
    spans = list(zip(hit, starts, starts[1:]))
    gate_up = torch.cat([_project(module, rows[a:b], module.gate_up_proj[e],
                                  module.gate_up_proj_bias[e] if has_bias else None) for (e, _), a, b in spans])
    h = gate(gate_up)
    down = torch.cat([_project(module, h[a:b], module.down_proj[e], module.down_proj_bias[e] if has_bias else None)
                      for (e, _), a, b in spans])
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
        return _run_experts(self, hidden_states, top_k_index, top_k_weights, silu_and_mul)

    forward.applies_to = _swiglu_experts_applies_to


def _run_experts(module: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                 top_k_weights: torch.Tensor, gate: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """The config's experts implementation with ``gate`` as the module's ``_apply_gate``."""
    implementation = module.config._experts_implementation
    if implementation == "eager":
        return _sorted_experts(module, hidden_states, top_k_index, top_k_weights, gate)
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    return ALL_EXPERTS_FUNCTIONS[implementation](_KernelGate(module, gate), hidden_states, top_k_index, top_k_weights)


# -------------------------------------------------------------------------------- GPT-OSS

# Probe of a module's own _apply_gate: interleaved gate / up values on both sides of GPT-OSS's clamp
# (limit 7) and of small limits; 16 values, so the check costs microseconds on the CPU.
_PROBE = (-9.0, 8.0, -3.0, -8.0, -0.5, 0.25, 0.0, 1.0, 0.75, -1.5, 2.0, 6.5, 7.5, -7.5, 12.0, 3.0)


def _clamped_swiglu_experts_applies_to(module: nn.Module) -> str | None:
    absent = _absent(module, "gate_up_proj", "down_proj", "alpha", "limit", "num_experts", "config", "_apply_gate")
    if absent:
        return absent
    if not isinstance(module.alpha, (int, float)) or not isinstance(module.limit, (int, float)) or module.limit <= 0:
        return f"its alpha={module.alpha!r} and limit={module.limit!r} are not numbers (limit > 0)"
    odd = _odd_layout(module, has_gate=True, is_concatenated=False, has_post_expert_norm=False,
                      _is_expert_parallel=False)
    if odd:
        return f"its experts layout is {', '.join(odd)}; ClampedSwiGLUExperts serves interleaved gate / up " \
               "columns without post-expert norm or expert parallelism"
    # The gate is the module's own method (GptOssExperts._apply_gate): check it computes the clamped
    # SwiGLU with these alpha and limit, on a probe, instead of trusting the class name.
    probe = torch.tensor([_PROBE], dtype=torch.float32)
    with torch.no_grad():
        try:
            theirs = type(module)._apply_gate(module, probe)
        except Exception as e:  # a gate that cannot run on the probe is not the one this kernel computes
            return f"its _apply_gate fails on a probe ({e!r})"
        ours = clamped_swiglu_reference(probe, float(module.alpha), float(module.limit))
    if not isinstance(theirs, torch.Tensor) or theirs.shape != ours.shape or not torch.allclose(theirs, ours):
        return (f"its _apply_gate does not compute (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g), "
                f"g = min(gate, limit), over interleaved columns (alpha={module.alpha}, limit={module.limit})")
    return _unserved_implementation(module, "ClampedSwiGLUExperts")


class ClampedSwiGLUExperts(nn.Module):
    """GPT-OSS's ``GptOssExperts`` with the experts' clamped SwiGLU computed by :func:`clamped_swiglu`
    (one kernel over the interleaved gate / up columns, forward and backward); routing, matmuls and
    biases stay those of the config's experts implementation (see the module docstring); uses the
    module's ``alpha`` and ``limit``.

    Applies where the module's ``_apply_gate`` computes that gate (checked on a probe), the weights
    are interleaved (``is_concatenated=False``) without post-expert norm or expert parallelism, and
    the implementation is one of ``grouped_mm``, ``batched_mm``, ``eager``.
    """

    has_backward = True
    can_torch_compile = True

    def forward(self, hidden_states: torch.Tensor, router_indices=None, routing_weights=None) -> torch.Tensor:
        alpha, limit = float(self.alpha), float(self.limit)
        return _run_experts(self, hidden_states, router_indices, routing_weights,
                            lambda gate_up: clamped_swiglu(gate_up, alpha, limit))

    forward.applies_to = _clamped_swiglu_experts_applies_to


# -------------------------------------------------------------------------------- fused grouped GEMMs

_FUSED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _fused_swiglu_experts_applies_to(module: nn.Module) -> str | None:
    refusal = _swiglu_layout_refusal(module, "FusedSwiGLUExperts")
    if refusal:
        return refusal
    gate_up, down = module.gate_up_proj, module.down_proj
    if not isinstance(gate_up, torch.Tensor) or not isinstance(down, torch.Tensor) or gate_up.dim() != 3 or \
            down.dim() != 3 or gate_up.shape[1] != 2 * down.shape[2] or down.shape[1] != gate_up.shape[2]:
        shapes = [tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__ for t in (gate_up, down)]
        return f"its gate_up_proj / down_proj are {shapes[0]} / {shapes[1]}, not [E, 2I, H] / [E, H, I]"
    if gate_up.dtype not in _FUSED_DTYPES or down.dtype != gate_up.dtype:
        return f"its weights are {gate_up.dtype} / {down.dtype}; FusedSwiGLUExperts computes float16, bfloat16, float32"
    return None


class FusedSwiGLUExperts(nn.Module):
    """transformers' MoE ``*Experts`` (Mixtral, Qwen3-MoE, DeepSeek-V3, ERNIE 4.5-MoE) computed whole by
    :func:`~twinkle_triton.moe_gemm.moe_swiglu_experts`: grouped GEMMs with the token gather in the
    operand load, the SwiGLU in the gate/up GEMM's epilogue and the routing weights in the down GEMM's,
    forward and backward, whatever the config's experts implementation (they compute the same).

    Applies where :class:`SwiGLUExperts` does (SiLU ``act_fn``, transformers' default ``_apply_gate``,
    concatenated ``[gate; up]`` weights without bias, post-expert norm or expert parallelism), with
    3-D float16 / bfloat16 / float32 weights. Hidden states of another dtype (autocast) are cast to the
    weights' and the result back, as transformers' grouped_mm path does.
    """

    has_backward = True
    can_torch_compile = True

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
                ) -> torch.Tensor:
        weights = self.gate_up_proj
        out = moe_swiglu_experts(hidden_states.to(weights.dtype), weights, self.down_proj, top_k_index, top_k_weights)
        return out.to(hidden_states.dtype)

    forward.applies_to = _fused_swiglu_experts_applies_to
