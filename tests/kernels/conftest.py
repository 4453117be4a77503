"""Fixtures for the twinkle_triton kernel tests (TRITON_INTERPRET is set by tests/conftest.py)."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _fresh_dynamo_and_seed():
    """Each test starts with an empty Dynamo cache (compiled graphs from one test never serve
    another) and a fixed seed."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    yield
    torch._dynamo.reset()
