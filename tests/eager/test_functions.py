"""Function kernels: register, apply, strictness, fallback, undo.

``fast_add`` is a Triton kernel: it is registered for, and applied on, the device of the run (``device``),
since a Triton kernel on the CPU needs the interpreter; ``other_device`` names a device the run does not use.
"""

import logging
import warnings

import pytest
import torch

import my_pkg.math_ops as math_ops
from my_pkg.fast_ops import MulRepo, fast_add
from twinkle_fx import KernelSelectionError, kernelize_model, undo_kernelize
from twinkle_fx.function import (
    apply_function_kernel,
    patched_functions,
    register_function_kernel,
    restore_functions,
)

ORIGINAL_ADD = math_ops.add
ORIGINAL_MUL = math_ops.mul


def other_device(device: str) -> str:
    """A device this run does not use: kernels registered for it are never selected here."""
    return "cuda" if device == "cpu" else "cpu"


def test_apply_patches_and_returns_names_and_module_callers_see_the_kernel(device):
    register_function_kernel(func_name="add", target_module="my_pkg.math_ops", func_impl=fast_add, device=device,
                             mode="inference")
    patched = apply_function_kernel(target_module="my_pkg.math_ops", device=device, mode="inference")
    assert patched == ["my_pkg.math_ops.add"]
    assert math_ops.add is fast_add
    a, b = torch.randn(37, device=device), torch.randn(37, device=device)
    torch.testing.assert_close(math_ops.scaled_sum(a, b), (a + b) * 0.5)
    assert patched.restore() == 1
    assert math_ops.add is ORIGINAL_ADD


def test_handle_is_a_context_manager(device):
    register_function_kernel(func_name="add", target_module="my_pkg.math_ops", func_impl=fast_add, device=device)
    with apply_function_kernel(target_module="my_pkg.math_ops", device=device) as patched:
        assert math_ops.add is fast_add and patched == ["my_pkg.math_ops.add"]
    assert math_ops.add is ORIGINAL_ADD


def test_apply_twice_keeps_the_true_original(device):
    register_function_kernel(func_name="add", target_module="my_pkg.math_ops", func_impl=fast_add, device=device)
    apply_function_kernel(target_module="my_pkg.math_ops", device=device)
    apply_function_kernel(target_module="my_pkg.math_ops", device=device)
    restore_functions()
    assert math_ops.add is ORIGINAL_ADD and patched_functions() == []


def test_repo_object_compile_registration_serves_inference(device):
    register_function_kernel(func_name="mul", target_module="my_pkg.math_ops", repo=MulRepo(), device=device,
                             mode="compile")
    assert apply_function_kernel(target_module="my_pkg.math_ops", device=device, mode="inference") == ["my_pkg.math_ops.mul"]
    assert math_ops.mul is not ORIGINAL_MUL


def test_training_never_uses_a_function_without_backward(caplog, device):
    register_function_kernel(func_name="add", target_module="my_pkg.math_ops", func_impl=fast_add, device=device)
    with caplog.at_level(logging.INFO, logger="twinkle_fx"):
        assert apply_function_kernel(target_module="my_pkg.math_ops", device=device, mode="train") == []
    assert math_ops.add is ORIGINAL_ADD
    assert any("has_backward=False" in r.getMessage() for r in caplog.records)
    with pytest.raises(KernelSelectionError, match="has_backward=False"):
        apply_function_kernel(target_module="my_pkg.math_ops", device=device, mode="train", use_fallback=False)


def test_use_fallback_false_patches_nothing_when_one_target_fails(device):
    register_function_kernel(func_name="add", target_module="my_pkg.math_ops", func_impl=fast_add, device=device)
    register_function_kernel(func_name="mul", target_module="my_pkg.math_ops", func_impl=fast_add,
                             device=other_device(device))
    with pytest.raises(KernelSelectionError, match=f"no kernel for device '{device}'"):
        apply_function_kernel(target_module="my_pkg.math_ops", device=device, use_fallback=False)
    assert math_ops.add is ORIGINAL_ADD


def test_target_module_not_importable(device):
    register_function_kernel(func_name="f", target_module="my_pkg.no_such_module", func_impl=fast_add, device=device)
    with pytest.raises(ValueError, match="'my_pkg.no_such_module'.*cannot be imported"):
        apply_function_kernel(target_module="my_pkg.no_such_module", device=device, strict=True)
    with pytest.warns(UserWarning, match="cannot be imported"):
        assert apply_function_kernel(target_module="my_pkg.no_such_module", device=device) == []


def test_missing_function_is_an_error_when_strict_and_never_created(device):
    register_function_kernel(func_name="sub", target_module="my_pkg.math_ops", func_impl=fast_add, device=device)
    with pytest.raises(ValueError, match="has no attribute 'sub'"):
        apply_function_kernel(target_module="my_pkg.math_ops", device=device, strict=True)
    with pytest.warns(UserWarning, match="has no attribute 'sub'"):
        apply_function_kernel(target_module="my_pkg.math_ops", device=device)
    assert not hasattr(math_ops, "sub")


def test_strict_raises_when_nothing_was_patched(device):
    with pytest.raises(ValueError, match="no function kernels are registered for my_pkg.math_ops"):
        apply_function_kernel(target_module="my_pkg.math_ops", device=device, strict=True)
    register_function_kernel(func_name="add", target_module="my_pkg.math_ops", func_impl=fast_add,
                             device=other_device(device))
    with pytest.raises(ValueError, match="no function was patched"):
        apply_function_kernel(target_module="my_pkg.math_ops", device=device, strict=True)


def test_kernelize_model_none_patches_functions_and_undo_restores(device):
    register_function_kernel(func_name="add", target_module="my_pkg.math_ops", func_impl=fast_add, device=device)
    kernelize_model(model=None, mode="inference", device=device)
    assert math_ops.add is fast_add
    undo_kernelize()
    assert math_ops.add is ORIGINAL_ADD


def test_function_kernel_from_local_repo_and_hub(offline_hub, local_repo, device):
    register_function_kernel(func_name="silu_and_mul", target_module="my_pkg.activations",
                             repo_id="kernels-community/activation", revision="main")
    import my_pkg.activations as activations

    original = activations.silu_and_mul
    x = torch.randn(3, 2 * 7, device=device)
    expected = original(x)
    assert apply_function_kernel(target_module="my_pkg.activations", device=device) == ["my_pkg.activations.silu_and_mul"]
    assert activations.silu_and_mul is not original
    torch.testing.assert_close(activations.silu_and_mul(x), expected)


def test_function_registration_errors():
    with pytest.raises(ValueError, match="exactly one of func_impl=, repo=, repo_id=, repo_path="):
        register_function_kernel(func_name="add", target_module="my_pkg.math_ops")
    with pytest.raises(ValueError, match="got func_impl, repo"):
        register_function_kernel(func_name="add", target_module="my_pkg.math_ops", func_impl=fast_add, repo=MulRepo())
    with pytest.raises(ValueError, match="either revision= or version="):
        register_function_kernel(func_name="add", target_module="m", repo_id="a/b", revision="x", version=2)
    with pytest.raises(ValueError, match="target_module"):
        register_function_kernel(func_name="add", target_module="", func_impl=fast_add)


def test_no_warnings_on_the_happy_path(device):
    register_function_kernel(func_name="add", target_module="my_pkg.math_ops", func_impl=fast_add, device=device)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        apply_function_kernel(target_module="my_pkg.math_ops", device=device, strict=True)
