"""One test per name of ``twinkle_triton._torch_internals``, the kernels' door to private torch names:
a torch upgrade that moves one fails here, by name."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from twinkle_triton import _torch_internals as ti


def test_current_cuda_device_and_stream_are_torchs():
    if not torch.backends.cuda.is_built():
        with pytest.raises(RuntimeError, match="without CUDA"):
            ti.current_cuda_device()
        return
    assert ti.current_cuda_device is torch._C._cuda_getDevice
    assert ti.current_cuda_raw_stream is torch._C._cuda_getCurrentRawStream
    if torch.cuda.is_available():
        device = ti.current_cuda_device()
        assert device == torch.cuda.current_device()
        assert ti.current_cuda_raw_stream(device) == torch.cuda.current_stream(device).cuda_stream


def test_dispatch_modes_active_counts_the_modes_in_effect():
    class Passing(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    assert ti.dispatch_modes_active() == 0
    with Passing():
        assert ti.dispatch_modes_active() == 1


def test_functorch_transforms_active_inside_vmap_only():
    assert not ti.functorch_transforms_active()
    seen = []

    def probe(x):
        seen.append(ti.functorch_transforms_active())
        return x

    torch.vmap(probe)(torch.ones(2, 3))
    assert seen == [True]


def test_is_wrap_triton_enabled_answers_outside_a_trace():
    assert isinstance(ti.is_wrap_triton_enabled(), bool)


def test_grouped_mm_cuts_the_reduction_into_groups():
    if ti.grouped_mm is None:
        pytest.skip("this torch has no _grouped_mm")
    # the MoE weight gradients' layout: the reduction runs down both operands' rows (a transposed view, b row-major),
    # where groups of any size are allowed; cut along a contiguous dimension, CUDA asks for 16-byte group sizes
    a, b = torch.randn(24, 16, dtype=torch.bfloat16).t(), torch.randn(24, 8, dtype=torch.bfloat16)
    ends = torch.tensor([10, 10, 24], dtype=torch.int32)  # the second group is empty
    out = ti.grouped_mm(a, b, offs=ends)
    want = torch.stack([a[:, :10] @ b[:10], torch.zeros(16, 8, dtype=torch.bfloat16), a[:, 10:] @ b[10:]])
    torch.testing.assert_close(out.float(), want.float(), rtol=2e-2, atol=2e-2)
