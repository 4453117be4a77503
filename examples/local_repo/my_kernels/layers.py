"""Layer kernels: no ``__init__``, they run on the module they replace (its weights, its config)."""

import torch
import twinkle_triton


class Qwen2MLPTrainingKernel(torch.nn.Module):
    """Qwen2MLP with the SwiGLU activation fused into one Triton kernel (forward and backward)."""

    has_backward = True
    can_torch_compile = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(twinkle_triton.silu_mul(self.gate_proj(x), self.up_proj(x)))


class RMSNormKernel(torch.nn.Module):
    """transformers' RMSNorm (fp32 statistics, ``weight * x.to(input dtype)``) in one Triton kernel."""

    has_backward = True
    can_torch_compile = True

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return twinkle_triton.rms_norm(hidden_states, self.weight, self.variance_epsilon)


class RMSNormInferenceOnly(torch.nn.Module):
    """The same kernel declared without backward: twinkle_fx never uses it for training."""

    has_backward = False
    can_torch_compile = False

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return twinkle_triton.rms_norm(hidden_states, self.weight, self.variance_epsilon)
