"""Programmatic dependent launch (compute capability 9.0 and later) for the kernels of a decode step.

A kernel launched with ``launch_pdl=True`` may start its programs before the kernel before it in the
stream has finished: as soon as every program of that kernel has passed ``griddepcontrol.launch_dependents``
(or exited). Its programs then wait in :func:`wait_for_inputs` (``griddepcontrol.wait``: until the kernel before
has finished and its writes are visible) before they read anything another kernel may have written, and signal
the kernel after them at once. A decode step is a chain of small kernels, each a few microseconds long, where
the launch and the drain of the kernel before otherwise leave the GPU idle between them; a kernel that reads
inputs no kernel writes (a model's weights) can load them before the wait.

Every kernel that takes these options waits before its first read of another kernel's output and before its
first write, so a chain of them keeps stream order: a kernel finishes only after it has waited, and so after
every kernel before it. A kernel launched without them, or by a launcher that ignores them, runs in plain stream
order and its wait returns at once. Inductor's launcher of user-defined Triton kernels takes no ``launch_pdl``,
so the ops whose kernels take these options are opaque to Inductor (``torch.library.custom_op``) and launch
through ours.
"""

import functools

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._launch import interpreting

__all__ = ["ENABLED", "launch_options", "wait_for_inputs"]

# Whether the kernels that can are launched as programmatic dependents (tools/gemv_sweep.py --pdl measures both).
ENABLED = True


@triton.jit
def wait_for_inputs(PDL: tl.constexpr):
    """Under ``PDL``: wait until the kernel before has finished and its writes are visible, then let the kernel
    after start its programs. Call it before the first read of another kernel's output and the first write."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@functools.cache
def _device_takes_dependents(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9 and hasattr(tl.extra.cuda, "gdc_wait")


def launch_options(x: Tensor) -> dict:
    """The launch options of a kernel on ``x``'s device: ``PDL=True`` (the kernel's constexpr) and
    ``launch_pdl=True`` where the device takes programmatic dependent launches and :data:`ENABLED`, else
    ``PDL=False`` (under the Triton interpreter too)."""
    if not ENABLED or x.device.type != "cuda" or interpreting() or not _device_takes_dependents(x.device.index or 0):
        return {"PDL": False}
    return {"PDL": True, "launch_pdl": True}

