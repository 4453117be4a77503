"""What a user sees at the default log level (WARNING), at INFO and in ``explain``."""

import logging

import pytest
import torch

from twinkle_fx import kernelize_model, register_external_layer, register_function_kernel, register_layer_kernel

from kernels_for_tests import Gelu, NoBackwardKernel, TanhGeluKernel, model_with_gelus


class FastLinear(torch.nn.Module):
    def forward(self, input):
        return torch.nn.functional.linear(input, self.weight, self.bias)


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("twinkle_fx")]


def test_a_layer_kernel_no_class_is_bound_to_is_warned_about_once(caplog):
    register_layer_kernel(kernel_name="linear", layer=FastLinear, device="cpu", mode="inference")
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    with caplog.at_level(logging.WARNING):
        kernelize_model(model, mode="inference")
        kernelize_model(model, mode="inference")
    unbound = [m for m in _warnings(caplog) if "'linear' is registered" in m]
    assert len(unbound) == 1 and "register_external_layer(nn.Linear, 'linear')" in unbound[0]
    register_external_layer(torch.nn.Linear, "linear")  # the fix the warning names
    kernelize_model(model, mode="inference")
    assert "forward" in model[0].__dict__


def test_explain_lists_the_unbound_kernel():
    from twinkle_fx import explain

    register_layer_kernel(kernel_name="linear", layer=FastLinear, device="cpu")
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    with torch.no_grad():
        report = explain(model, torch.randn(2, 8))
    assert any("'linear' is registered but no class is bound to it" in note for note in report.notes)
    assert "register_external_layer(nn.Linear, 'linear')" in report.summary()


def test_one_warning_when_every_candidate_falls_back(caplog):
    register_layer_kernel(kernel_name="FastGelu", layer=NoBackwardKernel, device="cpu")
    register_external_layer(Gelu, "FastGelu")
    with caplog.at_level(logging.WARNING):
        kernelize_model(model_with_gelus(), mode="train")
    [warning] = _warnings(caplog)
    assert "swapped 0 of 2 candidate module(s) and kept 2: 2 Gelu (" in warning
    assert "has_backward=False" in warning


class Relu(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x)


def test_the_warning_adds_up_swapped_and_kept_modules_and_functions(caplog):
    register_layer_kernel(kernel_name="FastGelu", layer=TanhGeluKernel, device="cpu")
    register_external_layer(Gelu, "FastGelu")
    register_layer_kernel(kernel_name="FastRelu", layer=NoBackwardKernel, device="cpu")
    register_external_layer(Relu, "FastRelu")
    for name in ("add", "mul"):
        register_function_kernel(func_name=name, target_module="my_pkg.math_ops", func_impl=getattr(torch, name),
                                 device="cpu", mode="inference")
    model = torch.nn.Sequential(Gelu(), Relu(), Gelu())
    with caplog.at_level(logging.WARNING):
        kernelize_model(model, mode="train", device="cpu")
    [warning] = _warnings(caplog)
    assert warning.startswith("kernelize_model(Sequential, train, cpu) swapped 2 of 3 candidate module(s) and kept "
                              "1: 1 Relu (FastRelu [cpu, any] from impl NoBackwardKernel: inference-only kernel"), warning
    # both functions kept for one cause: named together, once
    assert ("; patched 0 of 2 function(s) and kept 2: my_pkg.math_ops.add, my_pkg.math_ops.mul (no registration "
            "serves mode 'train'") in warning, warning


def test_a_repo_path_typo_is_visible_at_warning(caplog, tmp_path):
    register_layer_kernel(kernel_name="FastGelu", repo_path=tmp_path / "no-such-repo", package_name="k",
                          layer_name="Gelu", device="cpu")
    register_external_layer(Gelu, "FastGelu")
    with caplog.at_level(logging.WARNING):
        kernelize_model(model_with_gelus(), mode="inference")  # use_fallback=True: no error, but not silent
    [warning] = _warnings(caplog)
    assert "does not exist" in warning and "no-such-repo" in warning


def test_nothing_to_swap_in_a_model_is_a_warning_naming_its_uncovered_layers(caplog):
    class FamilyRMSNorm(torch.nn.Module):  # a layer class as transformers tags them
        kernel_layer_name = "RMSNorm"

        def forward(self, x):
            return x

    register_layer_kernel(kernel_name="FastGelu", layer=TanhGeluKernel, device="cpu")
    register_external_layer(Gelu, "FastGelu")
    with caplog.at_level(logging.WARNING):
        kernelize_model(torch.nn.Sequential(FamilyRMSNorm()), mode="inference", device="cpu")
    [warning] = _warnings(caplog)
    assert "swapped nothing" in warning and "without a kernel: FamilyRMSNorm" in warning


def test_uncovered_layer_classes_are_logged_once_at_info(caplog):
    class OtherRMSNorm(torch.nn.Module):
        kernel_layer_name = "RMSNorm"

        def forward(self, x):
            return x

    register_layer_kernel(kernel_name="FastGelu", layer=TanhGeluKernel, device="cpu")
    register_external_layer(Gelu, "FastGelu")
    model = torch.nn.Sequential(Gelu(), OtherRMSNorm())
    with caplog.at_level(logging.INFO, logger="twinkle_fx"):
        kernelize_model(model, mode="inference", device="cpu")
        kernelize_model(model, mode="inference", device="cpu")
    lines = [r.getMessage() for r in caplog.records if "without a kernel" in r.getMessage()]
    assert lines == ["layer classes of Sequential without a kernel: OtherRMSNorm"]
    from twinkle_fx.core.admission import coverage_notes

    assert coverage_notes(model) == ["layer classes of Sequential without a kernel: OtherRMSNorm"]
    assert _warnings(caplog) == []  # something was swapped, nothing fell back: no warning


@pytest.mark.parametrize("mode", ["inference", "train"])
def test_a_clean_kernelize_prints_nothing_at_warning(caplog, mode):
    register_layer_kernel(kernel_name="FastGelu", layer=TanhGeluKernel, device="cpu")
    register_external_layer(Gelu, "FastGelu")
    with caplog.at_level(logging.WARNING):
        kernelize_model(model_with_gelus(), mode=mode)
    assert _warnings(caplog) == []


class TaggedDouble(torch.nn.Module):
    kernel_layer_name = "TagOnly"  # as transformers' hub decorator tags a class

    def forward(self, x):
        return x * 2


class DoubleKernel(torch.nn.Module):
    def forward(self, x):
        return x + x


def test_swaps_and_coverage_notes_share_one_target_rule():
    """A tag alone does not make a class a target for a kernel registered with binds_by_tag=False,
    for the eager swap and for the coverage notes alike; binding the class does, for both."""
    from twinkle_fx import get_registry
    from twinkle_fx.core.modes import Mode
    from twinkle_fx.core.selection import is_layer_target, select_layer_kernel
    from twinkle_fx.core.admission import coverage_notes

    register_layer_kernel(kernel_name="TagOnly", layer=DoubleKernel, device="cpu", binds_by_tag=False)
    registry, model = get_registry(), torch.nn.Sequential(TaggedDouble())
    assert not is_layer_target(registry, TaggedDouble)
    assert select_layer_kernel(registry, TaggedDouble, "cpu", Mode.INFERENCE) is None
    assert any("TaggedDouble" in note for note in coverage_notes(model))
    register_external_layer(TaggedDouble, "TagOnly")
    assert is_layer_target(registry, TaggedDouble)
    assert select_layer_kernel(registry, TaggedDouble, "cpu", Mode.INFERENCE).choice is not None
    assert not any("TaggedDouble" in note for note in coverage_notes(model))
