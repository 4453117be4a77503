"""``twinkle_fx.compile(model)``: the fused-loss head on the compiled module plus backend="twinkle",
in one call (a plain torch.compile(model, backend="twinkle") reports the head as kept)."""

import pytest
import torch

import twinkle_fx
from twinkle_fx.builtin import use_builtin_kernels
from twinkle_fx.eager.layers import swapped_forward

from tiny_models import DEVICE, tiny


def test_one_call_installs_the_head_and_compiles_with_twinkle():
    use_builtin_kernels(devices=(DEVICE,), models=("qwen2",))
    model = tiny("qwen2", layers=1)
    input_ids = torch.randint(0, 128, (2, 12), device=DEVICE)
    reference = model(input_ids, labels=input_ids)
    reference.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()

    torch._dynamo.reset()
    with twinkle_fx.compile.collect_reports() as report:
        compiled = twinkle_fx.compile(model, options={"compiler": "aot_eager"})
        out = compiled(input_ids, labels=input_ids)
    out.loss.backward()
    assert out.logits is None  # the fused linear cross-entropy ran: no logits were built
    # only the root was swapped eagerly; the layers inside are the graph rewrite's
    assert [name for name, m in model.named_modules() if swapped_forward(m) is not None] == [""]
    assert any(r.kernel and "RMSNorm" in r.kernel for r in report.swapped)
    torch.testing.assert_close(out.loss, reference.loss, atol=1e-5, rtol=1e-5)
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, grads[name], atol=1e-4, rtol=1e-4, msg=lambda m: f"{name}: {m}")

    twinkle_fx.undo_kernelize(model)
    assert swapped_forward(model) is None


def test_one_call_without_fused_loss_and_bad_arguments():
    use_builtin_kernels(devices=(DEVICE,), models=("qwen2",))
    model = tiny("qwen2", layers=1)
    twinkle_fx.compile(model, fused_loss=False)
    assert swapped_forward(model) is None
    with pytest.raises(ValueError, match="not both"):
        twinkle_fx.compile(model, mode="reduce-overhead", options={"compiler": "aot_eager"})
    with pytest.raises(TypeError, match="backend"):
        twinkle_fx.compile(model, backend="inductor")
    with pytest.raises(TypeError, match="nn.Module"):
        twinkle_fx.compile("model")


def test_one_call_keeps_inductor_code_for_measured_regions_in_training_unless_told(monkeypatch):
    """In training twinkle_fx.compile asks the backend for swap_policy="measured" (fewer launches than
    swapping every region; see its docstring), keeps what the caller names, and leaves inference and
    mode= (torch.compile takes no options= beside it) to the backend's default."""
    seen = []
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: seen.append(kwargs["options"]) or model)
    model = tiny("qwen2", layers=1).train()
    twinkle_fx.compile(model, fused_loss=False)
    twinkle_fx.compile(model, fused_loss=False, options={"compiler": "aot_eager"})
    twinkle_fx.compile(model, fused_loss=False, options={"swap_policy": "always"})
    twinkle_fx.compile(model, fused_loss=False, mode="reduce-overhead")
    twinkle_fx.compile(model.eval(), fused_loss=False)
    twinkle_fx.compile(model, fused_loss=False, options={"mode": "train"})
    assert seen == [{"swap_policy": "measured"}, {"compiler": "aot_eager", "swap_policy": "measured"},
                    {"swap_policy": "always"}, None, None, {"mode": "train", "swap_policy": "measured"}]
