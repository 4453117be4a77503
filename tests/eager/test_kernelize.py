import copy
import logging
import pickle

import pytest
import torch

from twinkle_fx import (
    KernelSelectionError,
    kernelize_model,
    kernelized,
    register_external_layer,
    register_layer_kernel,
    undo_kernelize,
)
from twinkle_fx.core.swaps import KernelForward

from kernels_for_tests import (
    Gelu,
    NoBackwardKernel,
    NotCompilableKernel,
    TanhGeluKernel,
    WrongSignatureKernel,
    model_with_gelus,
    uses_tanh,
)


def _register(layer=TanhGeluKernel, mode=None, device="cpu"):
    register_layer_kernel(kernel_name="FastGelu", layer=layer, device=device, mode=mode)
    register_external_layer(Gelu, "FastGelu")


def test_swaps_every_instance_and_keeps_parameters_and_state_dict():
    _register()
    model = model_with_gelus()
    unswapped = copy.deepcopy(model)
    keys = list(model.state_dict())
    x = torch.randn(3, 8)
    kernelize_model(model, mode="inference")
    assert uses_tanh(model[1]) and uses_tanh(model[3])
    assert list(model.state_dict()) == keys
    assert type(model[1]) is Gelu
    # the unswapped copy's own layers with the kernel's math (tanh GELU) in place of its Gelus
    tanh_gelu = lambda t: torch.nn.functional.gelu(t, approximate="tanh")  # noqa: E731
    torch.testing.assert_close(model(x), tanh_gelu(unswapped[2](tanh_gelu(unswapped[0](x)))), rtol=0, atol=0)
    assert not torch.allclose(model(x), unswapped(x))  # and the swap shows in the output


def test_undo_restores_original_forward_exactly():
    _register()
    model = model_with_gelus()
    x = torch.randn(3, 8)
    before = model(x)
    kernelize_model(model, mode="inference")
    assert not torch.equal(model(x), before)
    undo_kernelize(model)
    assert torch.equal(model(x), before)
    assert "forward" not in model[1].__dict__


def test_kernelize_twice_is_idempotent_and_undo_once_suffices():
    _register()
    model = model_with_gelus()
    kernelize_model(model, mode="inference")
    first = model[1].__dict__["forward"]
    kernelize_model(model, mode="inference")
    assert model[1].__dict__["forward"] is first
    undo_kernelize(model)
    assert "forward" not in model[1].__dict__


def test_kernelize_undo_kernelize():
    _register()
    model = model_with_gelus()
    kernelize_model(model, mode="inference")
    undo_kernelize(model)
    assert not uses_tanh(model[1]) and "forward" not in model[1].__dict__  # undo really undid
    kernelize_model(model, mode="inference")
    assert uses_tanh(model[1])


def test_an_instance_forward_set_before_is_restored():
    _register()
    model = model_with_gelus()
    custom = lambda x: x * 0  # noqa: E731
    model[1].forward = custom
    kernelize_model(model, mode="inference")
    assert isinstance(model[1].__dict__["forward"], KernelForward)
    undo_kernelize(model)
    assert model[1].forward is custom


def test_kernelized_context_manager_undoes_on_error():
    _register()
    model = model_with_gelus()
    with pytest.raises(RuntimeError, match="boom"):
        with kernelized(model, mode="inference"):
            assert uses_tanh(model[1])
            raise RuntimeError("boom")
    assert "forward" not in model[1].__dict__


def test_mode_inferred_from_model_training_flag():
    _register(layer=NoBackwardKernel, mode="inference")
    model = model_with_gelus()
    kernelize_model(model)  # model.train() and grad enabled: training, the inference kernel does not fit
    assert not uses_tanh(model[1])
    model.eval()
    kernelize_model(model)
    assert uses_tanh(model[1])


def test_training_never_uses_a_kernel_without_backward(caplog):
    _register(layer=NoBackwardKernel)
    model = model_with_gelus()
    with caplog.at_level(logging.INFO, logger="twinkle_fx"):
        kernelize_model(model, mode="train")
    assert not uses_tanh(model[1])
    fallback = [r.getMessage() for r in caplog.records if "fallback" in r.getMessage()]
    assert len(fallback) == 1 and "has_backward=False" in fallback[0] and "2 Gelu" in fallback[0]
    with pytest.raises(KernelSelectionError, match="has_backward=False"):
        kernelize_model(model, mode="train", use_fallback=False)


def test_compile_mode_never_uses_a_kernel_that_cannot_compile():
    _register(layer=NotCompilableKernel)
    model = model_with_gelus()
    with pytest.raises(KernelSelectionError, match="can_torch_compile=False"):
        kernelize_model(model, mode="compile", use_fallback=False)
    kernelize_model(model, mode="inference")
    assert uses_tanh(model[1])


def test_mode_priority_prefers_exact_registration():
    register_layer_kernel(kernel_name="FastGelu", layer=NoBackwardKernel, device="cpu", mode="inference")
    register_layer_kernel(kernel_name="FastGelu", layer=lambda self, x: x * 0 + 1, device="cpu", mode="train")
    register_external_layer(Gelu, "FastGelu")
    model = model_with_gelus()
    kernelize_model(model, mode="inference")
    assert uses_tanh(model[1])
    undo_kernelize(model)
    kernelize_model(model, mode="train")
    assert torch.equal(model[1](torch.zeros(3)), torch.ones(3))


def test_device_is_inferred_and_other_devices_fall_back(caplog):
    _register(device="cuda")
    model = model_with_gelus()
    with caplog.at_level(logging.INFO, logger="twinkle_fx"):
        kernelize_model(model, mode="inference")
    assert not uses_tanh(model[1])
    assert any("no kernel for device 'cpu'" in r.getMessage() for r in caplog.records)


def test_signature_mismatch_is_refused_with_both_signatures():
    _register(layer=WrongSignatureKernel)
    model = model_with_gelus()
    with pytest.raises(KernelSelectionError, match=r"\(hidden, scale\) differs from the layer's \(x\)"):
        kernelize_model(model, mode="inference", use_fallback=False)
    assert "forward" not in model[1].__dict__
    kernelize_model(model, mode="inference")  # fallback: logged, model unchanged
    assert "forward" not in model[1].__dict__


def test_error_leaves_nothing_half_applied():
    """A failing second target must not leave the first one swapped."""

    class Other(torch.nn.Module):
        def forward(self, x):
            return x

    _register()
    register_external_layer(Other, "Missing")
    register_layer_kernel(kernel_name="Missing", repo_path="/nonexistent/repo", package_name="p", layer_name="L", device="cpu")
    model = torch.nn.Sequential(Gelu(), Other())
    with pytest.raises(KernelSelectionError, match="does not exist"):
        kernelize_model(model, mode="inference", device="cpu", use_fallback=False)
    assert "forward" not in model[0].__dict__


def test_kernel_layer_name_attribute_binds_implicitly():
    class DecoratedNorm(torch.nn.Module):
        kernel_layer_name = "FastGelu"

        def forward(self, x):
            return torch.nn.functional.gelu(x)

    register_layer_kernel(kernel_name="FastGelu", layer=TanhGeluKernel, device="cpu")
    module = DecoratedNorm()
    kernelize_model(module, mode="inference", device="cpu")
    assert uses_tanh(module)


def test_explicit_binding_overrides_kernel_layer_name():
    class DecoratedNorm(torch.nn.Module):
        kernel_layer_name = "Unregistered"

        def forward(self, x):
            return torch.nn.functional.gelu(x)

    register_layer_kernel(kernel_name="FastGelu", layer=TanhGeluKernel, device="cpu")
    register_external_layer(DecoratedNorm, "FastGelu")
    module = DecoratedNorm()
    kernelize_model(module, mode="inference", device="cpu")
    assert uses_tanh(module)


def test_subclasses_of_a_bound_class_are_swapped():
    class MyGelu(Gelu):
        pass

    _register()
    module = MyGelu()
    kernelize_model(module, mode="inference", device="cpu")
    assert uses_tanh(module)


def test_same_name_registered_twice_later_wins_and_is_logged(caplog):
    register_layer_kernel(kernel_name="FastGelu", layer=NoBackwardKernel, device="cpu", mode="inference")
    with caplog.at_level(logging.INFO, logger="twinkle_fx"):
        register_layer_kernel(kernel_name="FastGelu", layer=lambda self, x: x * 0, device="cpu", mode="inference")
    assert any("later registration wins" in r.getMessage() for r in caplog.records)
    register_external_layer(Gelu, "FastGelu")
    module = Gelu()
    kernelize_model(module, mode="inference", device="cpu")
    assert torch.equal(module(torch.ones(2)), torch.zeros(2))


def test_info_sums_up_per_class_and_debug_names_each_module(caplog):
    _register()
    with caplog.at_level(logging.DEBUG, logger="twinkle_fx"):
        kernelize_model(model_with_gelus(), mode="inference")
    info = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO and "swapped" in r.getMessage()]
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG and "swapped" in r.getMessage()]
    assert len(info) == 1 and info[0].startswith("swapped 2 Gelu module(s) -> FastGelu")
    assert [m.split(" (")[0] for m in debug] == ["swapped 1", "swapped 3"]
    # the logger's name says where a line comes from: no "twinkle_fx:" prefix repeating it
    assert not any(r.getMessage().startswith("twinkle_fx:") for r in caplog.records)


def test_env_switch_disables_all_kernels(monkeypatch, caplog):
    _register()
    monkeypatch.setenv("TWINKLE_FX_DISABLE_KERNELS", "1")
    model = model_with_gelus()
    with caplog.at_level(logging.INFO, logger="twinkle_fx"):
        kernelize_model(model, mode="inference")
    assert "forward" not in model[1].__dict__
    assert any("TWINKLE_FX_DISABLE_KERNELS" in r.getMessage() for r in caplog.records)


def test_undo_returns_and_logs_what_it_restored(caplog):
    import my_pkg.math_ops

    from twinkle_fx import register_function_kernel

    _register()
    register_function_kernel(func_name="add", target_module="my_pkg.math_ops", func_impl=torch.add, device="cpu")
    model = kernelize_model(model_with_gelus(), mode="inference", device="cpu")
    assert my_pkg.math_ops.add is torch.add
    with caplog.at_level(logging.INFO, logger="twinkle_fx"):
        restored = undo_kernelize(model)
    assert restored.layers == ("1 (Gelu): FastGelu", "3 (Gelu): FastGelu")
    assert restored.functions == ("my_pkg.math_ops.add",) and len(restored) == 3
    assert repr(restored) == "Restored(layers=['1 (Gelu): FastGelu', '3 (Gelu): FastGelu'], functions=['my_pkg.math_ops.add'])"
    assert ("undo_kernelize(Sequential): restored 2 layer forward(s): 1 (Gelu): FastGelu, 3 (Gelu): FastGelu; "
            "1 function(s): my_pkg.math_ops.add") in caplog.messages
    assert str(undo_kernelize(model)) == "restored nothing (no kernel was installed)"


def test_env_switch_removes_the_kernel_an_earlier_call_installed(monkeypatch):
    # an inference-only kernel must not survive into training once kernels are switched off
    _register(layer=NoBackwardKernel, mode="inference")
    model = model_with_gelus()
    kernelize_model(model, mode="inference")
    assert uses_tanh(model[1]) and uses_tanh(model[3])
    monkeypatch.setenv("TWINKLE_FX_DISABLE_KERNELS", "1")
    kernelize_model(model.train(), mode="train")
    assert "forward" not in model[1].__dict__ and "forward" not in model[3].__dict__
    x = torch.randn(3, 8)
    model(x).sum().backward()
    assert not uses_tanh(model[1])


def test_env_switch_inside_kernelized_puts_the_earlier_kernel_back(monkeypatch):
    _register(mode="inference")
    model = kernelize_model(model_with_gelus(), mode="inference")
    monkeypatch.setenv("TWINKLE_FX_DISABLE_KERNELS", "1")
    with kernelized(model, mode="train"):
        assert not uses_tanh(model[1])
    assert uses_tanh(model[1])


@pytest.mark.parametrize("kwargs, message", [
    ({"mode": "fast"}, "Unknown kernel mode"),
    ({"mode": "inference", "device": "gpu"}, "Unknown device"),
])
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        kernelize_model(model_with_gelus(), **kwargs)


def test_deepcopy_and_pickle_keep_the_swap_and_its_undo():
    _register()
    model = model_with_gelus()
    kernelize_model(model, mode="inference")
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert uses_tanh(clone[1])
        assert clone[1].__dict__["forward"].module is clone[1]
        undo_kernelize(clone)
        assert not uses_tanh(clone[1])
    assert uses_tanh(model[1])


def test_repo_object_may_return_class_instance_or_callable():
    class Repo:
        def __init__(self, value):
            self.value = value

        def load(self):
            return self.value

    def tanh_forward(self, x):
        return torch.nn.functional.gelu(x, approximate="tanh")

    for i, loaded in enumerate([TanhGeluKernel, TanhGeluKernel(), tanh_forward]):
        name = f"FastGelu{i}"
        register_layer_kernel(kernel_name=name, repo=Repo(loaded), device="cpu")
        register_external_layer(Gelu, name)
        module = Gelu()
        kernelize_model(module, mode="inference", device="cpu")
        assert uses_tanh(module), loaded


def test_model_none_patches_functions_only():
    assert kernelize_model(None, mode="inference", device="cpu") is None
