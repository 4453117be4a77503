"""Fixtures for the twinkle_triton kernel tests (TRITON_INTERPRET is set by tests/conftest.py).

On a machine with a GPU the same tests run on it: tensors are created on CUDA by default, so the
kernels are compiled by Triton for real instead of interpreted.
"""

import pytest
import torch

from device_under_test import DEVICE


@pytest.fixture(autouse=True)
def _fresh_dynamo_and_seed():
    """Each test starts with an empty Dynamo cache (compiled graphs from one test never serve
    another), a fixed seed, and tensors on the test device."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    with torch.device(DEVICE):
        yield
    torch._dynamo.reset()
