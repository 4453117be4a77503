"""``twinkle_fx.compile(model)``: the fused-loss head on the compiled module plus backend="twinkle",
in one call (a plain torch.compile(model, backend="twinkle") reports the head as kept)."""

import logging

import pytest
import torch

import twinkle_fx
from twinkle_fx.builtin import use_builtin_kernels
from twinkle_fx.core.swaps import swapped_forward

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
    with twinkle_fx.compiler.collect_reports() as report:
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
    mode= (torch.compile takes no options= beside it) and the cudagraphs option, its equivalent, to the backend's
    default."""
    seen = []
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: seen.append(kwargs["options"]) or model)
    model = tiny("qwen2", layers=1).train()
    twinkle_fx.compile(model, fused_loss=False)
    twinkle_fx.compile(model, fused_loss=False, options={"compiler": "aot_eager"})
    twinkle_fx.compile(model, fused_loss=False, options={"swap_policy": "always"})
    twinkle_fx.compile(model, fused_loss=False, mode="reduce-overhead")
    twinkle_fx.compile(model.eval(), fused_loss=False)
    twinkle_fx.compile(model, fused_loss=False, options={"mode": "train"})
    twinkle_fx.compile(model, fused_loss=False, options={"cudagraphs": True})
    assert seen == [{"swap_policy": "measured"}, {"compiler": "aot_eager", "swap_policy": "measured"},
                    {"swap_policy": "always"}, None, None, {"mode": "train", "swap_policy": "measured"},
                    {"cudagraphs": True}]


def _bound_head(device, layer=None):
    """A root module whose own class is bound to a kernel: what the fused-loss head is to a *ForCausalLM."""
    from twinkle_fx import register_external_layer, register_layer_kernel

    from kernels_for_tests import Gelu, TanhGeluKernel

    register_layer_kernel(kernel_name="Head", layer=layer or TanhGeluKernel, device=device)
    register_external_layer(Gelu, "Head")
    return Gelu()


@pytest.mark.parametrize("kwargs, error, message", [
    ({"options": "aot_eager"}, TypeError, r"options must be a dict .* pass options=\{'compiler': 'aot_eager'\}"),
    ({"options": {"compiler": "aot_eager", "verfy": True}}, ValueError, "Unknown twinkle backend option 'verfy'"),
    ({"fused_loss": "no"}, TypeError, "twinkle_fx.compile: fused_loss must be True or False, got 'no'"),
    ({"fullgraph": "yes"}, TypeError, "fullgraph must be True or False"),
    ({"dynamic": "auto"}, TypeError, "dynamic must be True, False or None"),
    ({"mode": "fastest"}, ValueError, "mode='fastest' is not a torch.compile mode"),
])
def test_bad_arguments_fail_before_the_head_is_installed(device, kwargs, error, message):
    model = _bound_head(device)
    with pytest.raises(error, match=message):
        twinkle_fx.compile(model, device=device, **kwargs)
    assert swapped_forward(model) is None


def test_a_gpu_device_without_a_gpu_is_refused_as_by_kernelize_model(monkeypatch):
    model = _bound_head("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="device='cuda' but torch sees no GPU"):
        twinkle_fx.compile(model, device="cuda")
    assert swapped_forward(model) is None


def test_a_bound_head_that_cannot_be_installed_is_a_warning_with_the_reason(device, caplog):
    from kernels_for_tests import WrongSignatureKernel

    model = _bound_head(device, layer=WrongSignatureKernel)
    with caplog.at_level(logging.INFO, logger="twinkle_fx"):
        twinkle_fx.compile(model, device=device)
    assert swapped_forward(model) is None
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "fused-loss head) is not installed" in warnings[0] and "Gelu on" in warnings[0]
