"""Every compile test starts and ends with an empty Dynamo cache (the registry is already
isolated per test by tests/conftest.py)."""

import pytest
import torch


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
