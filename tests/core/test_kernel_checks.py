"""Checks made at swap time, never per call: signatures with defaults, stateless kernels, the device
the model is on, Triton kernels that need the interpreter on the CPU."""

import sys
import types

import logging

import pytest
import torch
import triton

from twinkle_fx import (
    KernelSelectionError,
    kernelize_model,
    register_external_layer,
    register_layer_kernel,
)
from twinkle_fx.core.selection import signature_mismatch

from kernels_for_tests import Gelu, model_with_gelus


class Scaled(torch.nn.Module):
    def forward(self, x, scale=2.0):
        return x * scale


class ScaleOneKernel(torch.nn.Module):
    def forward(self, x, scale=1.0):
        return x * scale


class StatefulKernel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.factor = 3.0

    def forward(self, x, scale=2.0):
        return x * self.factor


class HelperKernel(torch.nn.Module):
    factor = 3.0

    def _helper(self, x):
        return x * self.factor

    def forward(self, x, scale=2.0):
        return self._helper(x)


def _swap(kernel, layer=Scaled):
    register_layer_kernel(kernel_name="K", layer=kernel, device="cpu")
    register_external_layer(layer, "K")
    module = layer()
    with pytest.raises(KernelSelectionError) as info:
        kernelize_model(module, mode="inference", device="cpu", use_fallback=False)
    assert "forward" not in module.__dict__
    return str(info.value)


def test_a_different_default_value_is_refused_eagerly_and_for_compile():
    assert "'scale' defaults to 1.0, the layer's to 2.0" in _swap(ScaleOneKernel)
    # the compile path asks the same question
    assert "defaults to 1.0" in signature_mismatch(Scaled.forward, ScaleOneKernel.forward)
    assert signature_mismatch(Scaled.forward, Scaled.forward) is None


def test_a_renamed_parameter_is_named_as_the_cause_of_a_signature_mismatch():
    import transformers

    class CausalLM(torch.nn.Module):
        def forward(self, input_ids, cache=None, labels=None):
            return input_ids

    class Head(torch.nn.Module):
        def forward(self, input_ids, past_key_values=None, labels=None):
            return input_ids

    # the layer's forward as a transformers release defines it
    CausalLM.forward.__module__ = "transformers.models.qwen2.modeling_qwen2"
    reason = signature_mismatch(CausalLM.forward, Head.forward)
    assert reason.startswith("parameter 'past_key_values' is named 'cache' in the layer (renamed in transformers "
                             f"{transformers.__version__}?); forward signature (input_ids, past_key_values, labels) "
                             "differs from the layer's (input_ids, cache, labels)"), reason
    CausalLM.forward.__module__ = __name__
    assert "is named 'cache' in the layer (renamed?)" in signature_mismatch(CausalLM.forward, Head.forward)
    # a parameter added, not renamed: only the signatures
    assert signature_mismatch(CausalLM.forward, Scaled.forward).startswith("forward signature (x, scale)")


def test_a_kernel_with_its_own_init_is_refused_with_the_reason():
    message = _swap(StatefulKernel)
    assert "StatefulKernel defines __init__" in message


def test_a_kernel_with_members_the_layer_lacks_is_refused():
    message = _swap(HelperKernel)
    assert "members the replaced layer does not have (_helper, factor)" in message


def test_a_builtin_returned_by_a_repo_is_refused_at_swap_time():
    class Repo:
        def load(self):
            return torch.relu  # no Python signature: it could never be checked, every call would fail

    register_layer_kernel(kernel_name="K", repo=Repo(), device="cpu")
    register_external_layer(Gelu, "K")
    module = Gelu()
    with pytest.raises(KernelSelectionError, match="no Python signature"):
        kernelize_model(module, mode="inference", device="cpu", use_fallback=False)


@pytest.mark.gpu
def test_cuda_for_a_cpu_model_warns_to_move_it(caplog):
    # the documents' order: kernelize for the GPU, then move the model
    register_layer_kernel(kernel_name="K", layer=ScaleOneKernel, device="cuda")
    model = model_with_gelus()
    with caplog.at_level(logging.WARNING):
        kernelize_model(model, mode="inference", device="cuda")
    assert "weights are on the CPU: move it (model.to('cuda')) before calling it" in caplog.text


@pytest.mark.gpu
def test_cpu_for_a_cuda_model_is_refused_up_front():
    register_layer_kernel(kernel_name="K", layer=ScaleOneKernel, device="cpu")
    model = model_with_gelus().cuda()
    with pytest.raises(ValueError, match=r"weights are on 'cuda': move the model first \(model.to\('cpu'\)\) or pass device='cuda'"):
        kernelize_model(model, mode="inference", device="cpu")
    assert all("forward" not in m.__dict__ for m in model.modules())


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_cuda_without_a_gpu_is_refused_up_front():
    with pytest.raises(ValueError, match="torch sees no GPU"):
        kernelize_model(None, mode="inference", device="cuda")


@pytest.fixture
def gpu_jitted_package(monkeypatch):
    """A kernel package whose Triton kernel was jitted for a GPU (as without TRITON_INTERPRET=1)."""

    def _kernel(x_ptr):
        pass

    package = types.ModuleType("gpu_only_kernels")
    package.__path__ = []
    layers = types.ModuleType("gpu_only_kernels.layers")
    layers._kernel = triton.runtime.jit.JITFunction(_kernel)

    class FastGelu(torch.nn.Module):
        def forward(self, x):
            return x

    FastGelu.__module__ = layers.__name__
    layers.FastGelu = FastGelu
    monkeypatch.setitem(sys.modules, package.__name__, package)
    monkeypatch.setitem(sys.modules, layers.__name__, layers)
    return FastGelu


def test_a_gpu_jitted_triton_kernel_is_refused_on_the_cpu(gpu_jitted_package):
    register_layer_kernel(kernel_name="K", layer=gpu_jitted_package, device="cpu")
    register_external_layer(Gelu, "K")
    module = Gelu()
    with pytest.raises(KernelSelectionError, match="set TRITON_INTERPRET=1 before importing gpu_only_kernels"):
        kernelize_model(module, mode="inference", device="cpu", use_fallback=False)
    kernelize_model(module, mode="inference", device="cpu")  # with fallback: the original, and a WARNING
    assert "forward" not in module.__dict__


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter runs only where no GPU is")
def test_interpreted_kernels_pass_the_triton_check():
    from twinkle_triton import layers

    from twinkle_fx.core.devices import triton_interpreter_problem

    assert triton_interpreter_problem(layers.RMSNorm, "cpu") is None
    assert triton_interpreter_problem(torch.mul, "cpu") is None  # torch's own Inductor kernels are no reason


def test_builtin_kernels_accept_a_single_device_string():
    from twinkle_fx import get_registry
    from twinkle_fx.builtin import use_builtin_kernels

    use_builtin_kernels(devices="cpu", models=("qwen2",))
    assert set(get_registry().layer_registrations("RMSNorm")) == {"cpu"}
