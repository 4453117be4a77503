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
        made = torch.empty(0).device.type
        if made != torch.device(DEVICE).type:  # the ops would run their references on them and pass unseen
            from torch.overrides import _get_current_function_mode_stack

            pytest.fail(f"inside torch.device({DEVICE!r}) tensors are made on {made}: torch function modes "
                        f"{_get_current_function_mode_stack()}, state {torch._C._get_torch_function_state()}",
                        pytrace=False)
        yield
    torch._dynamo.reset()


@pytest.fixture
def small_blocks(monkeypatch):
    """Every kernel that covers a row or a flat range in blocks takes blocks of 16 elements
    (``twinkle_triton._launch.BLOCK_LIMIT``): at the tests' small shapes they then loop over several
    blocks, merge partial results and split rows across programs, on the CPU and the GPU alike."""
    from twinkle_triton import _launch

    monkeypatch.setattr(_launch, "BLOCK_LIMIT", 16)
