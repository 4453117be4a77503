"""Integrations reach core through twinkle_fx.core.plugins: a plugged layer mapping is counted by
selection (below twinkle_fx's own registrations), a plugged Hub loader loads ``repo_id=`` kernels, and
with none plugged a Hub kernel fails with an error that says what to import."""

import sys
import types

import pytest
import torch

from twinkle_fx import KernelLoadError, get_registry, register_layer_kernel
from twinkle_fx.core import plugins
from twinkle_fx.core.modes import Mode
from twinkle_fx.core.registry import LayerRegistration
from twinkle_fx.core.selection import is_layer_target, select_layer_kernel
from twinkle_fx.core.sources import HubSource, ImplSource


class Tagged(torch.nn.Module):
    kernel_layer_name = "Doubled"

    def forward(self, x):
        return x


class Doubled(torch.nn.Module):
    def forward(self, x):
        return 2 * x


class Tripled(torch.nn.Module):
    def forward(self, x):
        return 3 * x


def _plug(monkeypatch, name, **functions):
    """Plug a module ``name`` holding ``functions`` in, for this test only."""
    monkeypatch.setitem(sys.modules, name, types.SimpleNamespace(__name__=name, **functions))
    monkeypatch.setattr(plugins, "_LAYER_MAPPINGS", list(plugins._LAYER_MAPPINGS))
    monkeypatch.setattr(plugins, "_hub_loader", plugins._hub_loader)


def _mapping(kernel_name, device):
    if kernel_name != "Doubled":
        return {}
    return {"cpu": {Mode.ANY: LayerRegistration("Doubled", "cpu", Mode.ANY, ImplSource(Doubled))}}


def test_importing_twinkle_fx_plugs_in_the_hugging_face_integrations():
    assert [m.__name__ for m in plugins.layer_mappings()] == ["twinkle_fx.integrations.kernels_mapping"]
    assert plugins.hub_loader("test").__name__ == "twinkle_fx.integrations.hub"


def test_a_plugged_layer_mapping_serves_the_devices_the_registry_has_nothing_for(monkeypatch):
    _plug(monkeypatch, "my_mapping", layer_names=lambda: ["Doubled"], layer_registrations=_mapping)
    assert select_layer_kernel(get_registry(), Tagged, "cpu", Mode.INFERENCE) is None
    plugins.plug_layer_mapping("my_mapping")
    plugins.plug_layer_mapping("my_mapping")  # once is enough
    assert plugins.layer_mappings()[-1].__name__ == "my_mapping" and len(plugins.layer_mappings()) == 2
    assert is_layer_target(get_registry(), Tagged, device="cpu")
    assert select_layer_kernel(get_registry(), Tagged, "cpu", Mode.INFERENCE).choice.kernel is Doubled
    # the registry's own registration for the device wins over the mapping's
    register_layer_kernel(kernel_name="Doubled", layer=Tripled, device="cpu")
    assert select_layer_kernel(get_registry(), Tagged, "cpu", Mode.INFERENCE).choice.kernel is Tripled


def test_hub_kernels_load_through_the_plugged_loader(monkeypatch):
    calls = []

    def load_hub_kernel(repo_id, **kwargs):
        calls.append((repo_id, kwargs["revision"], kwargs["version"]))
        package = types.ModuleType("doubled")
        package.layers = types.ModuleType("doubled.layers")
        package.layers.Doubled = Doubled
        return package

    _plug(monkeypatch, "my_hub", load_hub_kernel=load_hub_kernel, load_local_hf_kernel=None)
    plugins.plug_hub_loader("my_hub")
    assert HubSource("org/doubled", "Doubled", is_layer=True, version=2).load() is Doubled
    assert calls == [("org/doubled", None, 2)]


def test_a_hub_kernel_without_a_plugged_loader_says_what_to_import(monkeypatch):
    monkeypatch.setattr(plugins, "_hub_loader", None)
    with pytest.raises(KernelLoadError, match=r"hub org/doubled \(revision main\) layer 'Doubled': no Hugging Face "
                                              r"Hub loader is plugged .* import twinkle_fx.integrations"):
        HubSource("org/doubled", "Doubled", is_layer=True).load()
