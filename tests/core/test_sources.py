"""Where kernels come from: local repos (both layouts), repo objects, the Hub (offline cache)."""

import json
import logging
import shutil

import pytest
import torch

from twinkle_fx import (
    KernelLoadError,
    KernelSelectionError,
    kernelize_model,
    register_external_layer,
    register_layer_kernel,
)
from twinkle_fx.core.sources import HubSource, LocalRepoSource, make_source

from kernels_for_tests import Gelu, uses_tanh

TANH_LAYERS = """
import torch

class TanhGelu(torch.nn.Module):
    has_backward = True
    can_torch_compile = True

    def forward(self, x):
        return torch.nn.functional.gelu(x, approximate="tanh")
"""


def _write_package(root, name="my_kernels", layers=TANH_LAYERS, init="from . import layers\n"):
    package = root / name
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(init)
    (package / "layers.py").write_text(layers)
    return root


def _swap_with(device="cpu", **source):
    register_layer_kernel(kernel_name="FastGelu", device=device, **source)
    register_external_layer(Gelu, "FastGelu")
    module = Gelu()
    kernelize_model(module, mode="inference", device=device, use_fallback=False)
    return module


def test_plain_package_local_repo(tmp_path):
    repo = _write_package(tmp_path)
    assert uses_tanh(_swap_with(repo_path=repo, package_name="my_kernels", layer_name="TanhGelu"))


def test_two_local_repos_with_the_same_package_name_do_not_collide(tmp_path):
    a = _write_package(tmp_path / "a")
    b = _write_package(tmp_path / "b", layers=TANH_LAYERS.replace('approximate="tanh"', 'approximate="none"'))
    la = LocalRepoSource(a, "my_kernels", "TanhGelu", is_layer=True).load()
    lb = LocalRepoSource(b, "my_kernels", "TanhGelu", is_layer=True).load()
    assert la is not lb and la.__module__ != lb.__module__


def test_hf_layout_local_repo(tmp_path):
    variant = tmp_path / "repo" / "build" / "torch-universal"
    _write_package(variant, name="tanh_gelu")
    (variant / "metadata.json").write_text(json.dumps({
        "id": "tanh_gelu_0", "name": "tanh-gelu", "version": 1, "license": "Apache-2.0",
        "backend": {"type": "cpu"}, "python-depends": [],
    }))
    assert uses_tanh(_swap_with(repo_path=tmp_path / "repo", package_name="tanh_gelu", layer_name="TanhGelu"))


def test_malformed_hf_layout_is_refused_with_the_reason(tmp_path):
    variant = tmp_path / "repo" / "build" / "torch-universal"
    _write_package(variant, name="tanh_gelu")
    (variant / "metadata.json").write_text("{not json")
    source = LocalRepoSource(tmp_path / "repo", "other", "TanhGelu", is_layer=True)
    with pytest.raises(KernelLoadError, match="metadata"):
        source.load()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"repo_path": "/does/not/exist", "package_name": "my_kernels", "layer_name": "TanhGelu"}, "does not exist"),
        ({"package_name": "missing_pkg", "layer_name": "TanhGelu"}, "package 'missing_pkg' not found"),
        ({"package_name": "my_kernels", "layer_name": "Nope"}, "no layer named 'Nope'; available: TanhGelu"),
    ],
)
def test_local_repo_load_errors_name_the_culprit(tmp_path, kwargs, message):
    kwargs.setdefault("repo_path", _write_package(tmp_path))
    with pytest.raises(KernelSelectionError, match=message):
        _swap_with(**kwargs)


@pytest.mark.parametrize("init", ["raise RuntimeError('kernel build is broken')\n", "import not_a_module_xyz\n",
                                  "1 / 0\n"])
def test_kernel_import_that_raises_anything_falls_back_or_raises(tmp_path, init, caplog):
    repo = _write_package(tmp_path, init=init)
    register_layer_kernel(kernel_name="FastGelu", repo_path=repo, package_name="my_kernels", layer_name="TanhGelu",
                          device="cpu")
    register_external_layer(Gelu, "FastGelu")
    module = Gelu()
    with pytest.raises(KernelSelectionError, match="importing"):
        kernelize_model(module, mode="inference", device="cpu", use_fallback=False)
    with caplog.at_level(logging.INFO, logger="twinkle_fx"):
        kernelize_model(module, mode="inference", device="cpu")
    assert "forward" not in module.__dict__
    assert any("fallback" in r.getMessage() and "importing" in r.getMessage() for r in caplog.records)


def test_load_is_lazy_and_cached(tmp_path):
    calls = []

    class Repo:
        def load(self):
            calls.append(1)
            return lambda self, x: torch.nn.functional.gelu(x, approximate="tanh")

    register_layer_kernel(kernel_name="FastGelu", repo=Repo(), device="cpu")
    assert calls == []
    register_external_layer(Gelu, "FastGelu")
    model = torch.nn.Sequential(Gelu(), Gelu())
    kernelize_model(model, mode="inference", device="cpu")
    kernelize_model(torch.nn.Sequential(Gelu()), mode="inference", device="cpu")
    assert calls == [1]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({}, "exactly one of layer=, repo=, repo_id=, repo_path= \\(got none\\)"),
        ({"layer": Gelu, "repo_id": "org/x", "layer_name": "L"}, "got layer, repo_id"),
        ({"repo_id": "org/x", "layer_name": "L", "revision": "main", "version": 1}, "either revision= or version="),
        ({"repo_id": "not-a-repo-id", "layer_name": "L"}, "org/name"),
        ({"layer": Gelu, "revision": "main"}, "only apply to repo_id"),
        ({"layer": Gelu, "mode": "sometimes"}, "Unknown kernel mode"),
        ({"layer": Gelu, "device": "tpu9"}, "Unknown device"),
    ],
)
def test_registration_argument_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        register_layer_kernel(kernel_name="K", **kwargs)


def test_hub_kernel_from_offline_cache_through_kernels_get_kernel(offline_hub, device):
    # a Triton kernel: on the device of the run (on the CPU it needs the interpreter)
    module = _swap_with(device, repo_id="kernels-community/activation", layer_name="SiluAndMul", revision="main")
    x = torch.randn(4, 10, device=device)
    torch.testing.assert_close(module(x), torch.nn.functional.silu(x[:, :5]) * x[:, 5:])


def test_hub_version_pin(offline_hub):
    source = make_source(what="t", is_layer=True, repo_id="kernels-community/activation", attr="SiluAndMul", version=1)
    assert isinstance(source, HubSource) and source.pin() == "version 1"
    assert source.load().__name__ == "SiluAndMul"


def test_hub_offline_without_cache_falls_back_with_reason_or_raises(empty_offline_hub, caplog):
    register_layer_kernel(kernel_name="FastGelu", repo_id="kernels-community/not-cached", layer_name="X", device="cpu")
    register_external_layer(Gelu, "FastGelu")
    module = Gelu()
    with caplog.at_level(logging.INFO, logger="twinkle_fx"):
        kernelize_model(module, mode="inference", device="cpu")
    assert "forward" not in module.__dict__
    message = next(r.getMessage() for r in caplog.records if "fallback" in r.getMessage())
    assert "kernels-community/not-cached" in message and "HF_HUB_OFFLINE" in message
    with pytest.raises(KernelSelectionError, match="kernels.get_kernel failed"):
        kernelize_model(module, mode="inference", device="cpu", use_fallback=False)


def test_hub_kernel_from_a_copied_repo_is_independent_of_the_source_tree(tmp_path, offline_hub):
    # The cache is a copy: deleting a scratch copy of the package does not matter to the cache.
    scratch = tmp_path / "pkg"
    shutil.copytree(offline_hub / "hub", scratch)
    assert any(scratch.rglob("metadata.json"))
