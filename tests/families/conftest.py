"""Each family test starts with an empty Dynamo cache: every ``*ForCausalLM.forward`` goes through one
shared transformers decorator frame, so after Dynamo's recompile limit (8 by default) later families
would silently run uncompiled."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
