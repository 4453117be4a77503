"""Bad arguments fail at once, with an error that names the argument or the entry."""

import pytest
import torch

from my_pkg.fast_ops import fast_add
from twinkle_fx import (
    kernelize_model,
    kernelized,
    register_external_layer,
    register_function_kernel,
    register_kernels,
    register_layer_kernel,
    undo_kernelize,
    verification_report,
)
from twinkle_fx.function import apply_function_kernel

from kernels_for_tests import Gelu, TanhGeluKernel, model_with_gelus


@pytest.mark.parametrize("call, error, message", [
    (lambda: kernelize_model("x"), TypeError, "kernelize_model: model must be a torch.nn.Module or None, got str"),
    (lambda: undo_kernelize(42), TypeError, "undo_kernelize: model must be a torch.nn.Module or None, got int"),
    (lambda: verification_report("m"), TypeError, "verification_report: model must be"),
    (lambda: kernelize_model(model_with_gelus(), use_fallback="no"), TypeError, "use_fallback must be True or False, got 'no'"),
    (lambda: kernelize_model(model_with_gelus(), verify="yes"), TypeError, "verify must be True or False, got 'yes'"),
    (lambda: apply_function_kernel(device="cpu", strict="yes"), TypeError, "strict must be True or False"),
])
def test_kernelize_arguments(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_kernelized_checks_its_arguments_before_the_block():
    with pytest.raises(TypeError, match="kernelized: model must be"):
        with kernelized(3):
            pass


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(version=[1]), TypeError, "version must be an int or a version string"),
    (dict(trust_remote_code="yes"), TypeError, "trust_remote_code must be True, False or a list"),
    (dict(revision=5), TypeError, "revision must be a non-empty string"),
])
def test_hub_source_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        register_layer_kernel(kernel_name="K", repo_id="org/name", device="cpu", **kwargs)


def test_repo_path_must_be_a_path():
    with pytest.raises(TypeError, match="repo_path must be a path"):
        register_layer_kernel(kernel_name="K", repo_path=123, package_name="p", device="cpu")


def test_a_builtin_layer_is_refused_at_registration():
    with pytest.raises(TypeError, match="has no Python signature"):
        register_layer_kernel(kernel_name="K", layer=torch.relu, device="cpu")


def test_a_dotted_func_name_says_where_the_module_part_goes():
    with pytest.raises(ValueError, match="pass target_module='my_pkg.math_ops', func_name='add'"):
        register_function_kernel(func_name="math_ops.add", target_module="my_pkg", func_impl=fast_add)


def test_a_function_name_given_as_target_module_gets_a_hint():
    register_function_kernel(func_name="add", target_module="my_pkg.math_ops", func_impl=fast_add, device="cpu")
    with pytest.raises(ValueError, match="pass the module, not 'module.function'"):
        apply_function_kernel(target_module="my_pkg.math_ops.add", device="cpu", strict=True)


def test_non_module_class_is_refused_by_both_apis():
    with pytest.raises(TypeError, match="nn.Module class"):
        register_external_layer(int, "K")
    with pytest.raises(TypeError, match=r"external_layers\[<class 'int'>\].*nn.Module class"):
        register_kernels({"external_layers": {int: "K"}})


@pytest.mark.parametrize("name", [123, "", None, "  "])
def test_register_kernels_refuses_bad_kernel_names(name):
    with pytest.raises(ValueError, match="the kernel name must be a non-empty string"):
        register_kernels({"layers": {name: {"layer": TanhGeluKernel, "device": "cpu"}}})
    with pytest.raises(ValueError, match="the kernel name must be a non-empty string"):
        register_kernels({"external_layers": {Gelu: name}})


@pytest.mark.parametrize("section", ["layers", "external_layers", "functions"])
def test_a_section_that_is_no_dict_names_the_section(section):
    with pytest.raises(ValueError, match=rf"config\['{section}'\] must be a dict such as"):
        register_kernels({section: "K"})


@pytest.mark.parametrize("key", ["mod.", ".f", "my_pkg..add", "my pkg.add"])
def test_malformed_function_keys_are_refused(key):
    with pytest.raises(ValueError):
        register_kernels({"functions": {key: {"func_impl": fast_add}}})


def test_nothing_is_registered_when_one_entry_is_bad():
    from twinkle_fx import get_registry

    with pytest.raises(ValueError):
        register_kernels({"layers": {"Fine": {"layer": TanhGeluKernel}, "": {"layer": TanhGeluKernel}}})
    assert get_registry().layer_kernel_names() == []
