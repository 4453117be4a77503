"""Verify mode: a kernel that disagrees with the reference is never silently kept."""

import copy
import logging
import pickle

import pytest
import torch

import my_pkg.math_ops as math_ops
from twinkle_fx import (
    KernelVerificationError,
    kernelize_model,
    register_external_layer,
    register_layer_kernel,
    verification_report,
)
from twinkle_fx.builtin import use_builtin_kernels
from twinkle_fx.function import apply_function_kernel, register_function_kernel

from kernels_for_tests import Gelu, TanhGeluKernel, model_with_gelus


class ExactGeluKernel(torch.nn.Module):
    has_backward = True

    def forward(self, x):
        return 0.5 * x * (1.0 + torch.erf(x * 0.7071067811865476))


def test_agreeing_kernel_is_kept_and_checked_once_per_signature_with_gradients():
    register_layer_kernel(kernel_name="FastGelu", layer=ExactGeluKernel, device="cpu")
    register_external_layer(Gelu, "FastGelu")
    model = model_with_gelus()
    kernelize_model(model, mode="train", verify=True)
    for _ in range(3):
        model(torch.randn(5, 8)).sum().backward()
    model(torch.randn(2, 3, 8)).sum().backward()  # a new signature is checked again
    report = verification_report(model)
    assert [(v.target, v.what, v.passed) for v in report[:2]] == [("1 (Gelu)", "output", True), ("1 (Gelu)", "gradients", True)]
    assert len(report) == 2 * 2 * 2  # 2 layers x 2 signatures x (output, gradients)
    assert all(v.passed for v in report)
    assert "float32[5, 8]@cpu; grad" in str(report[0])


def test_disagreeing_kernel_falls_back_to_the_reference_and_says_by_how_much(caplog):
    register_layer_kernel(kernel_name="FastGelu", layer=TanhGeluKernel, device="cpu")  # approximate: ~1e-3 off
    register_external_layer(Gelu, "FastGelu")
    model = model_with_gelus()
    x = torch.linspace(-3, 3, 64).reshape(8, 8)
    with caplog.at_level(logging.WARNING, logger="twinkle_fx"):
        kernelize_model(model, mode="inference", verify=True)
        with torch.no_grad():
            out = model(x)
    expected = model[3](model[2](torch.nn.functional.gelu(model[0](x))))  # layer 3 already fell back: reference
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    warning = next(r.getMessage() for r in caplog.records if "differs from the reference" in r.getMessage())
    assert "1 (Gelu) -> FastGelu" in warning and "max error" in warning
    report = verification_report(model)
    assert [v.passed for v in report] == [False, False] and report[0].max_error > 1e-4
    with torch.no_grad():  # later calls use the reference without checking again
        torch.testing.assert_close(model(x), expected, rtol=0, atol=0)
    assert len(verification_report(model)) == 2


def test_disagreeing_kernel_raises_without_fallback():
    register_layer_kernel(kernel_name="FastGelu", layer=TanhGeluKernel, device="cpu")
    register_external_layer(Gelu, "FastGelu")
    model = model_with_gelus()
    kernelize_model(model, mode="inference", verify=True, use_fallback=False)
    with pytest.raises(KernelVerificationError, match="max error"):
        model(torch.randn(4, 8))


def test_function_verification():
    def wrong_add(a, b):
        return a + b + 1e-2

    wrong_add.has_backward = True
    register_function_kernel(func_name="add", target_module="my_pkg.math_ops", func_impl=wrong_add, device="cpu")
    register_function_kernel(func_name="mul", target_module="my_pkg.math_ops", func_impl=torch.mul, device="cpu")
    apply_function_kernel(target_module="my_pkg.math_ops", device="cpu", verify=True)
    a, b = torch.randn(10), torch.randn(10)
    torch.testing.assert_close(math_ops.add(a, b), a + b, rtol=0, atol=0)  # fell back to the original
    torch.testing.assert_close(math_ops.mul(a, b), a * b)
    report = {v.target: v for v in verification_report()}
    assert not report["my_pkg.math_ops.add"].passed and report["my_pkg.math_ops.mul"].passed


def test_builtin_kernels_pass_verification_in_training(device):
    import transformers

    use_builtin_kernels(devices=(device,), models=("qwen2",), fused_loss=False)
    torch.manual_seed(0)
    config = transformers.Qwen2Config(hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128)
    model = transformers.Qwen2ForCausalLM(config).to(device)
    kernelize_model(model, mode="train", verify=True, use_fallback=False)
    ids = torch.randint(0, 128, (2, 7), device=device)
    model(ids, labels=ids).loss.backward()
    report = verification_report(model)
    kinds = {(v.target.split(" -> ")[0].split(" (")[-1].rstrip(")"), v.what) for v in report}
    assert {("Qwen2RMSNorm", "output"), ("Qwen2RMSNorm", "gradients"), ("Qwen2MLP", "gradients")} <= kinds
    assert any(v.target.endswith("apply_rotary_pos_emb") for v in report)
    assert all(v.passed for v in report), [str(v) for v in report if not v.passed]


# -- what a check must catch -------------------------------------------------------------------

class Double(torch.nn.Module):
    def forward(self, x):
        return x * 2


def _checked(kernel, layer=Double, mode="inference", **kwargs):
    register_layer_kernel(kernel_name="K", layer=kernel, device="cpu")
    register_external_layer(layer, "K")
    module = layer()
    kernelize_model(module, mode=mode, device="cpu", verify=True, **kwargs)
    return module


def _only_result(module):
    report = verification_report(module)
    assert len(report) >= 1
    return report[-1]


@pytest.mark.parametrize("kernel_forward, detail", [
    (lambda self, x: (x * 2).double(), "dtype torch.float64 vs the reference's torch.float32"),
    (lambda self, x: (x * 2,), "structure differs"),
    (lambda self, x: (x * 2).to("meta"), "device meta vs the reference's cpu"),
    (lambda self, x: (x * 2)[:1], "shape"),
])
def test_a_result_that_differs_in_kind_not_value_is_rejected(kernel_forward, detail):
    module = _checked(kernel_forward)
    x = torch.randn(3, 4)
    with torch.no_grad():
        torch.testing.assert_close(module(x), x * 2, rtol=0, atol=0)  # the reference's answer
    result = _only_result(module)
    assert not result.passed and detail in result.detail


def test_a_detached_output_is_rejected_in_training():
    module = _checked(lambda self, x: (x * 2).detach(), mode="train")
    x = torch.randn(3, 4, requires_grad=True)
    module(x).sum().backward()
    assert x.grad is not None and torch.equal(x.grad, torch.full_like(x, 2.0))
    assert "does not require grad" in _only_result(module).detail


def test_an_in_place_kernel_cannot_corrupt_the_reference():
    def in_place(self, x):
        return x.mul_(2)  # right values, but it writes into its input

    module = _checked(in_place)
    x = torch.randn(3, 4)
    before = x.clone()
    with torch.no_grad():
        out = module(x)
    torch.testing.assert_close(out, before * 2, rtol=0, atol=0)  # not 4x: the reference saw the caller's x
    assert torch.equal(x, before)  # the layer (x * 2) never writes its input
    result = _only_result(module)
    assert result.what == "inputs" and not result.passed


def test_an_in_place_layer_changes_its_input_once():
    class AddOneInPlace(torch.nn.Module):
        def forward(self, x):
            return x.add_(1)

    module = _checked(lambda self, x: x.add_(1), layer=AddOneInPlace)
    x = torch.zeros(4)
    with torch.no_grad():
        module(x)
    assert torch.equal(x, torch.ones(4))  # not 2: kernel and reference did not both write it
    assert all(v.passed for v in verification_report(module))


class TripleKernel(torch.nn.Module):
    def forward(self, x):
        return x * 3


def test_a_rejected_kernel_stays_rejected_in_copies_and_pickles():
    module = _checked(TripleKernel)
    x = torch.randn(3, 4)
    with torch.no_grad():
        module(x)
    for clone in (copy.deepcopy(module), pickle.loads(pickle.dumps(module))):
        with torch.no_grad():
            torch.testing.assert_close(clone(x), x * 2, rtol=0, atol=0)
        assert [v.passed for v in verification_report(clone)] == [False]


def test_checks_run_when_the_kernelized_model_is_compiled():
    module = _checked(lambda self, x: x * 3)
    compiled = torch.compile(module, backend="eager")
    x = torch.randn(3, 4)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), x * 2, rtol=0, atol=0)
    assert [v.passed for v in verification_report(module)] == [False]


def test_the_check_leaves_the_global_rng_alone():
    module = _checked(lambda self, x: x * 2, mode="train")
    torch.manual_seed(123)
    state = torch.get_rng_state()
    module(torch.ones(3, 4, requires_grad=True)).sum().backward()
    assert [v.what for v in verification_report(module)] == ["output", "gradients"]
    assert torch.equal(torch.get_rng_state(), state)
