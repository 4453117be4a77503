"""Compiling generation with the backend: compile the ``forward`` that ``generate`` calls."""

import pytest
import torch
from family_models import tiny_model

from twinkle_fx.builtin import use_builtin_kernels
from twinkle_fx.testing import record_graphs


@pytest.mark.slow
def test_compiled_forward_runs_generation_through_the_backend(device):
    use_builtin_kernels(devices=(device,), models=("qwen2",), fused_loss=False)
    model = tiny_model("qwen2").eval()
    ids = torch.randint(3, 128, (1, 5), device=device)
    want = model.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0)
    with record_graphs() as graphs:
        model.forward = torch.compile(model.forward, backend="twinkle", options={"compiler": "aot_eager"})
        got = model.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0)
    del model.forward
    assert torch.equal(got, want)
    assert graphs.after, "generate compiled no graph"
    after = "\n".join(graphs.after)
    assert "twinkle_layer_RMSNorm" in after and "twinkle_layer_SwiGLUMLP" in after
