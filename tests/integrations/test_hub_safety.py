"""Hub safety: pins honoured and shown, trust_remote_code passed to ``kernels.get_kernel``, the
``LOCAL_KERNELS`` override, malformed cache entries refused with a reason.

Everything goes through the real ``kernels.get_kernel`` (0.17.2) against the session's offline cache
(tests/conftest.py), with repos published by :func:`twinkle_fx.integrations.hub.publish_to_hub_cache`.
"""

import json
import logging
import types

import pytest
import torch

from twinkle_fx import (
    KernelLoadError,
    KernelSelectionError,
    kernelize_model,
    register_external_layer,
    register_layer_kernel,
    scoped_registry,
)
from twinkle_fx.core.modes import Mode
from twinkle_fx.core.registry import get_registry
from twinkle_fx.core.selection import select_layer_kernel
from twinkle_fx.core.sources import make_source
from twinkle_fx.integrations.hub import publish_to_hub_cache

from kernels_for_tests import Gelu

COMMIT_V1, COMMIT_V2 = "a" * 40, "b" * 40


def _scale_package(root, name, factor):
    """A kernel package whose layer ``Scale`` multiplies by ``factor`` (so each revision is recognisable)."""
    package = root / name
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("from . import layers\n")
    (package / "layers.py").write_text(
        "class Scale:\n"
        "    has_backward = True\n"
        "    can_torch_compile = True\n\n"
        f"    def forward(self, x):\n        return x * {factor}\n"
    )
    return package


def _publish_two_versions(tmp_path, hf_home, repo_id):
    name = repo_id.split("/")[1].replace("-", "_")
    publish_to_hub_cache(_scale_package(tmp_path / "v1", name, 1.0), repo_id, hf_home=hf_home, commit=COMMIT_V1, version=1)
    publish_to_hub_cache(_scale_package(tmp_path / "v2", name, 2.0), repo_id, hf_home=hf_home, commit=COMMIT_V2, version=2)


def _kernelize_gelu(**source):
    register_layer_kernel(kernel_name="FastGelu", layer_name="Scale", device="cpu", **source)
    register_external_layer(Gelu, "FastGelu")
    module = Gelu()
    kernelize_model(module, mode="inference", device="cpu", use_fallback=False)
    return module


@pytest.mark.parametrize(
    "pin, factor, shown",
    [
        ({}, 2.0, "revision main"),
        ({"revision": "main"}, 2.0, "revision main"),
        ({"revision": COMMIT_V1}, 1.0, f"revision {COMMIT_V1}"),
        ({"version": 1}, 1.0, "version 1"),
        ({"version": 2}, 2.0, "version 2"),
    ],
)
def test_revision_and_version_pins_are_honoured_and_shown(tmp_path, empty_offline_hub, caplog, pin, factor, shown):
    repo_id = "twinkle-tests/pinned-scale"
    _publish_two_versions(tmp_path, empty_offline_hub, repo_id)  # main -> v2
    with caplog.at_level(logging.INFO, logger="twinkle_fx"):
        module = _kernelize_gelu(repo_id=repo_id, **pin)
    x = torch.ones(3)
    torch.testing.assert_close(module(x), x * factor)
    swap_line = next(r.getMessage() for r in caplog.records if "swapped" in r.getMessage())
    assert f"hub {repo_id} ({shown})" in swap_line, swap_line
    selection = select_layer_kernel(get_registry(), Gelu, "cpu", Mode.INFERENCE)
    assert f"({shown})" in str(selection)


def test_a_missing_pin_is_an_error_naming_the_pin(tmp_path, empty_offline_hub):
    repo_id = "twinkle-tests/pinned-missing"
    _publish_two_versions(tmp_path, empty_offline_hub, repo_id)
    with pytest.raises(KernelSelectionError, match=r"version 3.*Version 3"):
        _kernelize_gelu(repo_id=repo_id, version=3)


def test_trust_remote_code_reaches_kernels_offline(tmp_path, empty_offline_hub, caplog):
    # Offline, kernels 0.17.2 cannot ask the Hub whether the publisher is trusted: without
    # trust_remote_code it loads the cached kernel anyway and warns that it skipped the check; with
    # trust_remote_code=True (or the repo in an allowlist) there is nothing to skip.
    repo_id = "untrusted-org/scale"
    publish_to_hub_cache(_scale_package(tmp_path, "scale", 3.0), repo_id, hf_home=empty_offline_hub)
    skipped = "Skipping publisher trust check"
    for trust, warned in ((False, True), (True, False), ([repo_id], False)):
        caplog.clear()
        with scoped_registry(inherit=False), caplog.at_level(logging.WARNING, logger="kernels"):
            module = _kernelize_gelu(repo_id=repo_id, trust_remote_code=trust)
        torch.testing.assert_close(module(torch.ones(2)), torch.full((2,), 3.0))
        assert any(skipped in r.getMessage() for r in caplog.records) == warned, (trust, caplog.text)


def test_untrusted_publisher_online_falls_back_naming_trust_remote_code(monkeypatch, caplog):
    # Online, kernels checks the publisher before downloading anything; the Hub's answer is stubbed
    # (no network in tests): the organisation is not a trusted kernel publisher.
    import huggingface_hub.constants
    import kernels.hf_hub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    overview = types.SimpleNamespace(trustedKernelPublisher=False)
    monkeypatch.setattr(kernels.hf_hub, "_get_hf_api",
                        lambda **_: types.SimpleNamespace(get_organization_overview=lambda org: overview))
    register_layer_kernel(kernel_name="FastGelu", repo_id="untrusted-org/online", layer_name="Scale", device="cpu")
    register_external_layer(Gelu, "FastGelu")
    module = Gelu()
    with caplog.at_level(logging.INFO, logger="twinkle_fx"):
        kernelize_model(module, mode="inference", device="cpu")
    assert "forward" not in module.__dict__
    fallback = next(r.getMessage() for r in caplog.records if "fallback" in r.getMessage())
    assert "untrusted-org/online" in fallback and "not from a trusted publisher" in fallback
    assert "trust_remote_code" in fallback
    with pytest.raises(KernelSelectionError, match="trust_remote_code"):
        kernelize_model(module, mode="inference", device="cpu", use_fallback=False)


def test_local_kernels_env_overrides_the_hub(tmp_path, empty_offline_hub, monkeypatch):
    # kernels.get_kernel (0.17.2) resolves LOCAL_KERNELS="org/name=/path[:org2/name2=/path2]" before
    # the Hub or its cache; the path holds the Hugging Face layout (build/<variant>/ + metadata.json).
    repo_id = "twinkle-tests/not-on-the-hub"
    variant = tmp_path / "checkout" / "build" / "torch-universal"
    _scale_package(variant, "local_scale", 5.0)
    (variant / "metadata.json").write_text(json.dumps({
        "id": "local_scale_0", "name": "local-scale", "version": 1, "license": "Apache-2.0",
        "backend": {"type": "cpu"}, "python-depends": [],
    }))
    with scoped_registry(inherit=False), pytest.raises(KernelSelectionError, match="HF_HUB_OFFLINE"):
        _kernelize_gelu(repo_id=repo_id)  # not cached, no override
    monkeypatch.setenv("LOCAL_KERNELS", f"{repo_id}={tmp_path / 'checkout'}")
    module = _kernelize_gelu(repo_id=repo_id)
    torch.testing.assert_close(module(torch.ones(2)), torch.full((2,), 5.0))


@pytest.mark.parametrize(
    "damage, reason",
    [
        (lambda snapshot: (snapshot / "build" / "torch-universal" / "metadata.json").write_text("{not json"), "metadata"),
        (lambda snapshot: (snapshot / "build" / "torch-universal" / "metadata.json").write_text(
            json.dumps({"name": "bad", "version": 1, "backend": {"type": "universal"}})), "universal"),
        (lambda snapshot: (snapshot / "build" / "torch-universal").rename(snapshot / "build" / "not-a-variant"),
         "build variant"),
    ],
    ids=["metadata-not-json", "unknown-backend", "no-variant-for-this-system"],
)
def test_malformed_hub_cache_entry_is_refused_with_the_reason(tmp_path, empty_offline_hub, damage, reason, request):
    repo_id = f"twinkle-tests/malformed-{request.node.callspec.id}"
    snapshot = publish_to_hub_cache(_scale_package(tmp_path, "scale", 1.0), repo_id, hf_home=empty_offline_hub,
                                    package_name="scale")
    damage(snapshot)
    source = make_source(what="test", is_layer=True, repo_id=repo_id, attr="Scale")
    with pytest.raises(KernelLoadError, match=reason) as error:
        source.load()
    assert repo_id in str(error.value) and "kernels.get_kernel failed" in str(error.value)
    assert "found but refused" in str(error.value) and "not in the local cache" not in str(error.value)


def test_network_failure_is_named_as_such_not_as_untrusted_publisher(monkeypatch):
    # kernels 0.17 checks the publisher's trust first: with the network down its error mentions
    # trust_remote_code, while the cause is the connection
    from twinkle_fx.core.errors import KernelLoadError
    from twinkle_fx.integrations import hub

    class Kernels:
        @staticmethod
        def get_kernel(repo_id, **kwargs):
            try:
                raise ConnectionError("Max retries exceeded with url: /api/models/org/kernel")
            except ConnectionError as e:
                raise ValueError("cannot check whether org/kernel is trusted; pass trust_remote_code=True") from e

    monkeypatch.setattr(hub, "_kernels_package", lambda where: Kernels)
    with pytest.raises(KernelLoadError, match="the Hugging Face Hub could not be reached") as info:
        hub.load_hub_kernel("org/kernel", revision=None, version=None, trust_remote_code=False, where="K")
    assert "publishers the Hub does not trust" not in str(info.value)
