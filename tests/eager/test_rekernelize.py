"""Kernelizing again, scoped kernelizing and undo leave exactly what was asked for."""

import logging
import types

import pytest
import torch

import my_pkg.math_ops as math_ops
from my_pkg.fast_ops import fast_add
from twinkle_fx import (
    KernelSelectionError,
    kernelize_model,
    kernelized,
    register_external_layer,
    register_function_kernel,
    register_layer_kernel,
    scoped_registry,
    undo_kernelize,
)
from twinkle_fx.core.swaps import swapped_forward
from twinkle_fx.function import apply_function_kernel

from kernels_for_tests import Gelu, NoBackwardKernel, TanhGeluKernel, model_with_gelus, uses_tanh

ORIGINAL_ADD = math_ops.add


class ZeroKernel(torch.nn.Module):
    has_backward = True

    def forward(self, x):
        return x * 0


def _bind(kernel, mode=None, name="FastGelu", device="cpu"):
    register_layer_kernel(kernel_name=name, layer=kernel, device=device, mode=mode)
    register_external_layer(Gelu, name)


def test_training_after_inference_removes_the_inference_only_kernel():
    _bind(NoBackwardKernel, mode="inference")
    model = model_with_gelus()
    kernelize_model(model, mode="inference")
    assert uses_tanh(model[1])
    kernelize_model(model, mode="train")  # the inference-only kernel cannot serve training
    assert swapped_forward(model[1]) is None and not uses_tanh(model[1])
    x = torch.randn(2, 8)
    model(x).sum().backward()
    assert model[0].weight.grad is not None  # gradients reach the layers before it


def test_use_fallback_false_removes_the_stale_kernel_and_says_so():
    _bind(NoBackwardKernel, mode="inference")
    model = model_with_gelus()
    kernelize_model(model, mode="inference")
    with pytest.raises(KernelSelectionError, match="nothing was swapped; removed the kernel an earlier call installed on 2"):
        kernelize_model(model, mode="train", use_fallback=False)
    assert swapped_forward(model[1]) is None and swapped_forward(model[3]) is None


def test_an_empty_scope_reverts_to_the_original_forward():
    model = model_with_gelus()
    with scoped_registry():
        _bind(TanhGeluKernel)
        kernelize_model(model, mode="inference")
        assert uses_tanh(model[1])
    kernelize_model(model, mode="inference")  # nothing registered here: as kernels.kernelize, the original again
    assert "forward" not in model[1].__dict__ and not uses_tanh(model[1])


def test_a_function_kernel_that_does_not_serve_the_new_mode_is_restored(device):
    # fast_add is a Triton kernel: registered for the device of the run (on the CPU it needs the interpreter)
    register_function_kernel(func_name="add", target_module="my_pkg.math_ops", func_impl=fast_add, device=device)
    apply_function_kernel(target_module="my_pkg.math_ops", device=device, mode="inference")
    assert math_ops.add is fast_add
    apply_function_kernel(target_module="my_pkg.math_ops", device=device, mode="train")  # fast_add has no backward
    assert math_ops.add is ORIGINAL_ADD


def test_kernelized_inside_kernelize_model_keeps_the_outer_function_patch(device):
    register_function_kernel(func_name="add", target_module="my_pkg.math_ops", func_impl=fast_add, device=device)
    _bind(TanhGeluKernel, device=device)
    model = model_with_gelus().to(device)  # kernelize_model takes the device from the model
    kernelize_model(model, mode="inference")
    with kernelized(model, mode="inference"):
        assert math_ops.add is fast_add
    # the block changed nothing, so it restores nothing
    assert math_ops.add is fast_add and uses_tanh(model[1], torch.linspace(-3, 3, 16, device=device))


def test_nested_kernelized_ends_on_the_outer_kernel():
    _bind(TanhGeluKernel, name="Tanh")
    model = model_with_gelus()
    with kernelized(model, mode="inference"):
        outer = model[1].__dict__["forward"]
        with scoped_registry():
            _bind(ZeroKernel, name="Zero")
            with kernelized(model, mode="inference"):
                assert torch.equal(model[1](torch.ones(3)), torch.zeros(3))
        assert model[1].__dict__["forward"] is outer and uses_tanh(model[1])
    assert "forward" not in model[1].__dict__


def test_a_class_function_kernel_is_patched_once():
    class AddKernel(torch.nn.Module):
        has_backward = True

        def forward(self, a, b):
            return a + b

    register_function_kernel(func_name="add", target_module="my_pkg.math_ops", func_impl=AddKernel, device="cpu")
    apply_function_kernel(target_module="my_pkg.math_ops", device="cpu")
    first = math_ops.add
    again = apply_function_kernel(target_module="my_pkg.math_ops", device="cpu")
    assert math_ops.add is first and again == ["my_pkg.math_ops.add"]
    assert again.restore() == 0  # "already patched with this kernel": the second call changed nothing


def test_undo_notices_a_forward_installed_by_another_tool(caplog):
    _bind(TanhGeluKernel)
    model = model_with_gelus()
    kernelize_model(model, mode="inference")
    # what kernels.kernelize does to a module (kernels.layer.layer._replace_forward)
    model[3].forward = types.MethodType(ZeroKernel.forward, model[3])
    with caplog.at_level(logging.WARNING, logger="twinkle_fx"):
        undo_kernelize(model)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "1 module(s) run a forward twinkle_fx did not install (3 (Gelu)" in warnings[0]
    assert "forward" not in model[1].__dict__  # ours: restored
    assert torch.equal(model[3](torch.ones(2)), torch.zeros(2))  # theirs: left to the tool that installed it


def test_the_swapped_forward_adds_no_python_frame_of_ours():
    """Nothing on the eager call path that could be decided at swap time."""
    callers = []

    class Spy(torch.nn.Module):
        def forward(self, x):
            import sys

            callers.append(sys._getframe(1).f_code.co_filename)
            return x

    _bind(Spy)
    model = model_with_gelus()
    kernelize_model(model, mode="inference")
    model(torch.randn(2, 8))
    assert callers and all(c.endswith("torch/nn/modules/module.py") for c in callers), callers


def test_the_swapped_forward_shows_the_layers_signature():
    class Named(torch.nn.Module):
        def forward(self, input_ids=None, labels=None):
            return input_ids

    import inspect

    register_layer_kernel(kernel_name="K", layer=lambda self, input_ids=None, labels=None: input_ids, device="cpu")
    register_external_layer(Named, "K")
    module = Named()
    kernelize_model(module, mode="inference", device="cpu")
    assert list(inspect.signature(module.forward).parameters) == ["input_ids", "labels"]
