"""Reading ``torch.profiler`` events: the device time of a row, counted once."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["device_us"]


def device_us(event: Any) -> float:
    """Device time of a kernel (or memcpy/memset) row; 0 for host-side rows (operators, runtime calls)
    and for user annotations (``record_function`` ranges such as ``step 0``, ``DistributedDataParallel.forward``,
    ``nccl:all_reduce``, which the profiler also projects onto the GPU timeline), so that summing never
    counts a kernel twice (once itself, once in the range or operator around it)."""
    if getattr(event, "device_type", None) not in (None, torch.autograd.DeviceType.CUDA):
        return 0.0
    if getattr(event, "is_user_annotation", False):
        return 0.0
    value = getattr(event, "self_device_time_total", None)
    return float(value if value is not None else getattr(event, "self_cuda_time_total", 0.0))
