"""register_kernels(config): strict validation before anything is registered; config never mutated."""

import copy

import pytest
import torch
from transformers.models.qwen2.modeling_qwen2 import Qwen2MLP

from my_pkg.fast_ops import fast_add
from twinkle_fx import get_registry, kernelize_model, register_external_layer, register_kernels

from kernels_for_tests import Gelu, TanhGeluKernel, uses_tanh


def _config(local_repo):
    return {
        "layers": {
            "FastGelu": {"layer": TanhGeluKernel, "device": "cpu"},
            "MyAwesomeMLP": [
                {"repo_path": str(local_repo), "package_name": "my_kernels", "layer_name": "Qwen2MLPTrainingKernel",
                 "device": "cuda", "mode": "train"},
                {"repo_path": str(local_repo), "package_name": "my_kernels", "layer_name": "Qwen2MLPTrainingKernel",
                 "device": "cpu", "mode": "train"},
            ],
        },
        "external_layers": {Gelu: "FastGelu", "transformers.models.qwen2.modeling_qwen2.Qwen2MLP": "MyAwesomeMLP"},
        "functions": {"my_pkg.math_ops.add": {"func_impl": fast_add, "device": "cpu", "mode": "inference"}},
    }


def test_config_registers_layers_bindings_and_functions(local_repo):
    config = _config(local_repo)
    snapshot = copy.deepcopy(config)
    register_kernels(config)
    assert config == snapshot
    registry = get_registry()
    assert registry.kernel_name_for(Qwen2MLP) == "MyAwesomeMLP"
    assert set(registry.layer_registrations("MyAwesomeMLP")) == {"cuda", "cpu"}
    assert registry.function_targets() == ["my_pkg.math_ops.add"]
    module = Gelu()
    kernelize_model(module, mode="inference", device="cpu")
    assert uses_tanh(module)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda c: c.__setitem__("layer", {}), "config: unknown key 'layer'; valid keys: layers, external_layers, functions"),
        (lambda c: c["layers"]["FastGelu"].__setitem__("repo_name", "x"), r"layers\['FastGelu'\]: unknown key 'repo_name'"),
        (lambda c: c["layers"]["MyAwesomeMLP"][1].__setitem__("devices", "cpu"), r"layers\['MyAwesomeMLP'\]\[1\]: unknown key 'devices'"),
        (lambda c: c["functions"]["my_pkg.math_ops.add"].__setitem__("impl", fast_add), r"functions\['my_pkg.math_ops.add'\]: unknown key 'impl'"),
        (lambda c: c["layers"]["FastGelu"].__setitem__("mode", "speedy"), "Unknown kernel mode 'speedy'"),
        (lambda c: c["functions"].__setitem__("add", {"func_impl": fast_add}), "no 'target_module'"),
        (lambda c: c["functions"].__setitem__("my_pkg.math_ops.add", {"func_impl": fast_add, "target_module": "other"}),
         "the key names module 'my_pkg.math_ops' but target_module is 'other'"),
        (lambda c: c["functions"].__setitem__(".add", {"func_impl": fast_add}), "the key must be a function name"),
        (lambda c: c["functions"].__setitem__("mod.", {"func_impl": fast_add}), "the key must be a function name"),
        (lambda c: c["external_layers"].__setitem__("transformers.NoSuchClass", "X"), "Cannot resolve layer class"),
        # a bad device or mode names the entry it sits in
        (lambda c: c["layers"]["MyAwesomeMLP"][1].__setitem__("device", "gpu"),
         r"layers\['MyAwesomeMLP'\]\[1\]: Unknown device 'gpu'"),
        (lambda c: c["layers"]["FastGelu"].__setitem__("mode", "speedy"), r"layers\['FastGelu'\]: Unknown kernel mode"),
        (lambda c: c["functions"]["my_pkg.math_ops.add"].__setitem__("device", "gpu"),
         r"functions\['my_pkg.math_ops.add'\]: Unknown device 'gpu'"),
        # an empty list registers nothing: a mistake, not a choice
        (lambda c: c["layers"].__setitem__("K", []), r"layers\['K'\]: an empty list registers nothing"),
        (lambda c: c["functions"].__setitem__("my_pkg.math_ops.mul", []), r"functions\['my_pkg.math_ops.mul'\]: an empty list"),
        # entries that contradict each other are refused, naming both, instead of the last one winning
        (lambda c: c["layers"]["MyAwesomeMLP"][1].__setitem__("device", "cuda"),
         r"layers\['MyAwesomeMLP'\]\[0\] and layers\['MyAwesomeMLP'\]\[1\] both register 'MyAwesomeMLP' for cuda \(train\)"),
        (lambda c: c["external_layers"].__setitem__(Qwen2MLP, "FastGelu"),
         r"external_layers\['transformers.models.qwen2.modeling_qwen2.Qwen2MLP'\] and external_layers\[<class "
         r"'transformers.models.qwen2.modeling_qwen2.Qwen2MLP'>\] bind Qwen2MLP to two kernel names \('MyAwesomeMLP' "
         r"and 'FastGelu'\)"),
        (lambda c: c["functions"].__setitem__("add", {"target_module": "my_pkg.math_ops", "func_impl": fast_add,
                                                      "device": "cpu", "mode": "inference"}),
         r"functions\['my_pkg.math_ops.add'\] and functions\['add'\] both register a kernel for my_pkg.math_ops.add on cpu"),
    ],
)
def test_bad_config_names_key_and_entry_and_registers_nothing(local_repo, mutate, message):
    config = _config(local_repo)
    mutate(config)
    snapshot = copy.deepcopy(config)
    with pytest.raises((ValueError, TypeError), match=message):
        register_kernels(config)
    assert config == snapshot
    registry = get_registry()
    assert registry.layer_kernel_names() == [] and registry.bindings() == {} and registry.function_targets() == []


def test_config_must_be_a_dict():
    with pytest.raises(TypeError, match="expects a dict"):
        register_kernels([("layers", {})])


def test_scoped_registry_unwinds_on_exception():
    from twinkle_fx import scoped_registry

    with pytest.raises(RuntimeError):
        with scoped_registry():
            register_kernels({"layers": {"FastGelu": {"layer": TanhGeluKernel}}})
            raise RuntimeError
    assert get_registry().layer_kernel_names() == []


def test_functions_keyed_by_name_with_target_module_as_documented(device):
    # The guide's and the scenarios' form: the function's name as key, its module in the entry.
    # fast_add is a Triton kernel: registered for the device of the run (on the CPU it needs the interpreter).
    import my_pkg.math_ops

    from twinkle_fx import undo_kernelize

    original = my_pkg.math_ops.add
    register_kernels({"functions": {"add": {"target_module": "my_pkg.math_ops", "func_impl": fast_add,
                                            "device": device}}})
    assert get_registry().function_targets() == ["my_pkg.math_ops.add"]
    kernelize_model(None, mode="inference", device=device)
    try:
        assert my_pkg.math_ops.add is fast_add
    finally:
        undo_kernelize()
    assert my_pkg.math_ops.add is original


def test_layer_name_defaults_to_kernel_name(local_repo):
    from twinkle_fx import register_layer_kernel
    from twinkle_fx import Mode
    from twinkle_fx.core.selection import select_layer_kernel

    register_layer_kernel(kernel_name="Qwen2MLPTrainingKernel", repo_path=str(local_repo),
                          package_name="my_kernels", device="cpu")
    register_external_layer(Qwen2MLP, "Qwen2MLPTrainingKernel")
    selection = select_layer_kernel(get_registry(), Qwen2MLP, "cpu", Mode.TRAINING)
    assert selection.choice is not None, selection.reason
    assert selection.choice.call.__qualname__.startswith("Qwen2MLPTrainingKernel")
