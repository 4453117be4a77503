"""Every private torch name the kernels use, one name each.

twinkle_triton is a kernel repo of its own (it loads without twinkle_fx, as a local or a Hub repo),
so it has its own door where twinkle_fx has ``twinkle_fx.core.torch_internals``: a torch upgrade that
moves one of these is checked here. The launch path calls them a few hundred times a training step,
so each is torch's own function, bound once at import: no frame of ours around it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._library.triton import is_wrap_triton_enabled

__all__ = ["current_cuda_device", "current_cuda_raw_stream", "dispatch_modes_active", "functorch_transforms_active",
           "grouped_mm", "is_wrap_triton_enabled", "plain_linear"]


def _without_cuda(*args: Any) -> Any:
    raise RuntimeError("twinkle_triton: this torch was built without CUDA, so no CUDA launch can run; install a "
                       "CUDA build of torch, or run the kernels on the CPU with TRITON_INTERPRET=1")


# the index of the current CUDA device (what torch.cuda.current_device() returns, without its Python)
current_cuda_device = getattr(torch._C, "_cuda_getDevice", _without_cuda)
# the raw handle of a CUDA device's current stream: what a compiled Triton kernel's launcher takes
current_cuda_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", _without_cuda)
# how many TorchDispatchModes are active (make_fx, FakeTensorMode, FlopCounter): non-zero means a
# call must go through the op, which they intercept
dispatch_modes_active = torch._C._len_torch_dispatch_stack
# whether a functorch transform (vmap, grad) is active: then too
functorch_transforms_active = torch._C._are_functorch_transforms_active
# the grouped GEMM transformers' grouped_mm experts use (cuBLAS's on a GPU): ``grouped_mm(a, b, offs=ends)``, with
# ``a`` [M, K] and ``b`` [K, N] 2-D, the K rows cut into groups at ``ends``, gives ``[groups, M, N]``; None where
# this torch has none
grouped_mm = getattr(torch, "_grouped_mm", None)


def plain_linear(module: torch.nn.Module) -> bool:
    """Whether calling ``module`` is exactly ``F.linear(x, module.weight, module.bias)``: a ``torch.nn.Linear``
    itself (no subclass such as a LoRA layer) with no hook of its own or of every module."""
    from torch.nn.modules import module as nn_module

    return (type(module) is torch.nn.Linear and not (module._forward_hooks or module._forward_pre_hooks)
            and not (nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks))
