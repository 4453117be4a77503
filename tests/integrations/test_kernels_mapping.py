"""The Hugging Face ``kernels`` package as a neighbour: its active mapping (``use_kernel_mapping``)
serves ``kernelize_model`` and ``backend="twinkle"``, and forwards ``kernels.kernelize`` replaced are
named in the compile report."""

from __future__ import annotations

import logging
import sys
import types
from pathlib import Path

import kernels
import pytest
import torch
from device_under_test import DEVICE  # "cuda" on a GPU machine, "cpu" (Triton interpreter) otherwise
from transformers import Qwen2Config, Qwen2ForCausalLM
from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

import twinkle_fx
from twinkle_fx import kernelize_model, register_layer_kernel, undo_kernelize
from twinkle_fx.core.reasons import ReasonKind
from twinkle_fx.core.swaps import foreign_forward, swapped_forward
from twinkle_fx.core.errors import KernelLoadError
from twinkle_fx.integrations import hub
from twinkle_fx.integrations.kernels_mapping import active_kernels_mapping, layer_registrations

REPO = Path(__file__).resolve().parents[2] / "kernels" / "twinkle_triton"


@pytest.fixture
def model(monkeypatch):
    # transformers 5.18-5.22 tags Qwen2RMSNorm with kernel_layer_name "RMSNorm" when kernels 0.17 is
    # installed; 5.23 does so only with kernels >= 0.18.2. Tag it the way kernels users tag third-party
    # layers (kernels.replace_kernel_forward_from_hub), undone after the test.
    monkeypatch.setattr(Qwen2RMSNorm, "kernel_layer_name", "RMSNorm", raising=False)
    torch.manual_seed(0)
    config = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=128)
    return Qwen2ForCausalLM(config).to(DEVICE).eval()


def _norms(model) -> list[torch.nn.Module]:
    return [m for m in model.modules() if isinstance(m, Qwen2RMSNorm)]


def _rms_norm_mapping(modes=None):
    repo = kernels.LocalLayerRepository(repo_path=REPO, layer_name="RMSNorm")
    return {"RMSNorm": {DEVICE: repo if modes is None else {mode: repo for mode in modes}}}


def test_kernelize_model_uses_the_active_kernels_mapping(model):
    ids = torch.randint(0, 128, (2, 8), device=DEVICE)
    with torch.no_grad():
        reference = model(ids).logits
    kernelize_model(model, mode="inference", device=DEVICE)
    assert not any(swapped_forward(m) for m in _norms(model))  # no mapping: nothing is a target

    with kernels.use_kernel_mapping(_rms_norm_mapping()):
        kernelize_model(model, mode="inference", device=DEVICE)
    swaps = [swapped_forward(m) for m in _norms(model)]
    assert len(swaps) == 5 and all(s is not None and s.kernel_name == "RMSNorm" for s in swaps)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, reference, rtol=1e-4, atol=1e-5)
    undo_kernelize(model)
    assert not any(swapped_forward(m) for m in _norms(model))


def test_twinkle_registrations_win_over_the_kernels_mapping(model):
    from twinkle_triton.layers import RMSNorm

    register_layer_kernel(kernel_name="RMSNorm", layer=RMSNorm, device=DEVICE)
    with kernels.use_kernel_mapping(_rms_norm_mapping()):
        assert layer_registrations("RMSNorm", DEVICE)  # the mapping is there ...
        kernelize_model(model, mode="inference", device=DEVICE)
    # ... but the kernel came from twinkle_fx's own registration (the package, not the kernels loader's copy)
    assert swapped_forward(_norms(model)[0]).fn is RMSNorm.forward


def test_kernels_mapping_modes_are_honoured(model):
    with kernels.use_kernel_mapping(_rms_norm_mapping(modes=[kernels.Mode.INFERENCE])):
        with pytest.raises(twinkle_fx.KernelSelectionError, match="no registration serves mode 'train'"):
            kernelize_model(model.train(), mode="train", device=DEVICE, use_fallback=False)
        kernelize_model(model.eval(), mode="inference", device=DEVICE)
    assert all(swapped_forward(m) for m in _norms(model))


def test_disable_kernel_mapping_is_honoured(model, monkeypatch):
    monkeypatch.setenv("DISABLE_KERNEL_MAPPING", "1")
    with kernels.use_kernel_mapping(_rms_norm_mapping()):
        kernelize_model(model, mode="inference", device=DEVICE)
    assert not any(swapped_forward(m) for m in _norms(model))


def test_the_twinkle_backend_uses_the_active_kernels_mapping(model, caplog):
    ids = torch.randint(0, 128, (2, 8), device=DEVICE)
    with kernels.use_kernel_mapping(_rms_norm_mapping()), torch.no_grad(), caplog.at_level(logging.WARNING):
        report = twinkle_fx.explain(model, ids)
    swapped = [r for r in report.swapped if r.target == "Qwen2RMSNorm -> RMSNorm"]
    assert len(swapped) == 5
    assert "from kernels mapping: LocalLayerRepository" in swapped[0].kernel
    # the report agrees with itself: the mapping counts as registered kernels, and the class it
    # swapped is not listed among those without a kernel
    assert not [m for m in caplog.messages if "found no registered kernels" in m]
    assert not [note for note in report.notes if "Qwen2RMSNorm" in note], report.notes


def test_the_compile_report_names_layers_kernels_kernelize_replaced(model):
    ids = torch.randint(0, 128, (2, 8), device=DEVICE)
    with kernels.use_kernel_mapping(_rms_norm_mapping()):
        kernels.kernelize(model, mode=kernels.Mode.INFERENCE, device=DEVICE)
    assert foreign_forward(model.model.norm).startswith("kernels.kernelize (")
    assert foreign_forward(model.model.layers[0].mlp) is None
    with torch.no_grad():
        report = twinkle_fx.explain(model, ids)  # the mapping is no longer active
    kept = [r for r in report.not_swapped if r.target == "Qwen2RMSNorm -> RMSNorm"]
    assert len(kept) == 5, report.summary()
    assert kept[0].reason.kind is ReasonKind.FOREIGN_FORWARD and "kernels.kernelize" in str(kept[0].reason)
    assert "no registered layer or function found" not in report.summary()


def test_a_kernels_folder_imported_in_the_packages_place_is_no_mapping_and_no_package(monkeypatch):
    """Without the Hugging Face package, ``import kernels`` finds a ``kernels/`` folder on sys.path (this repository's,
    from its root) as a namespace package, and transformers' availability check imports it: kernel selection goes
    on without a mapping, and a Hub kernel says which folder was found instead of the package."""
    folder = types.ModuleType("kernels")
    folder.__path__ = [str(REPO.parent)]
    monkeypatch.setitem(sys.modules, "kernels", folder)
    assert hub.is_namespace_folder(folder) and not hub.is_namespace_folder(kernels)
    assert active_kernels_mapping() == {}
    with pytest.raises(KernelLoadError, match=r"found the folder .*kernels instead .*pip install 'kernels"):
        hub._kernels_package("register_layer_kernel(repo_id='kernels-community/activation')")
