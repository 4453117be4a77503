"""Process-wide caches have an owner and a reset (twinkle_fx.core.caches), and the test fixtures use it."""

import logging
import re
import sys
import weakref

import torch

import twinkle_fx.builtin  # noqa: F401  imports the modules most caches live in
import twinkle_fx.compiler.backend  # noqa: F401
import twinkle_fx.compiler.entry  # noqa: F401
import twinkle_fx.integrations.kernels_mapping  # noqa: F401
from twinkle_fx import kernelize_model, register_external_layer, register_layer_kernel
from twinkle_fx.core.caches import cache_owners, reset_caches

# module-level containers that are state, not caches: emptying them would lose what undo needs
STATE = {
    "twinkle_fx.core.caches._RESETS": "the owners themselves",
    "twinkle_fx.core.swaps._LEDGER": "the functions patched now (undo_kernelize puts them back)",
    "twinkle_fx.core.swaps._INSTALLED": "the forwards installed now (undo_kernelize puts them back)",
    "twinkle_fx.core.selection._INSTANCES": "one instance per class-based function kernel, so a patch is recognised",
}


def _containers():
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "twinkle_fx" or name.startswith("twinkle_fx.")):
            continue
        for attr, value in list(vars(module).items()):
            if re.fullmatch(r"_[A-Z][A-Z0-9_]*", attr) and isinstance(
                    value, (dict, set, list, weakref.WeakKeyDictionary, weakref.WeakValueDictionary)):
                yield name, attr, value


def test_every_module_level_cache_has_an_owner_that_empties_it():
    reset_caches()
    # a container still empty after the reset is filled at run time; one filled at import is a constant
    unowned = [f"{name}.{attr}" for name, attr, value in _containers()
               if len(value) == 0 and name not in cache_owners() and f"{name}.{attr}" not in STATE]
    assert unowned == [], f"caches without an owner (register a reset with twinkle_fx.core.caches.owns_cache): {unowned}"
    for name in ("twinkle_fx.eager.kernelize", "twinkle_fx.compiler.regions.splice", "twinkle_fx.compiler.inner.ttir_memo",
                 "twinkle_fx.compiler.graph.structure", "twinkle_fx.core.devices",
                 "twinkle_fx.integrations.kernels_mapping"):
        assert name in cache_owners()


def test_a_reset_makes_a_once_only_line_said_again(caplog):
    class FamilyRMSNorm(torch.nn.Module):
        kernel_layer_name = "RMSNorm"

        def forward(self, x):
            return x

    class Kernel(torch.nn.Module):
        def forward(self, x):
            return x

    register_layer_kernel(kernel_name="Id", layer=Kernel, device="cpu")
    register_external_layer(torch.nn.Identity, "Id")
    model = torch.nn.Sequential(torch.nn.Identity(), FamilyRMSNorm())

    def said():
        caplog.clear()
        kernelize_model(model, mode="inference", device="cpu")
        return [m for m in caplog.messages if "without a kernel: FamilyRMSNorm" in m]

    with caplog.at_level(logging.INFO, logger="twinkle_fx"):
        assert len(said()) == 1
        assert said() == []  # said once per process ...
        reset_caches()
        assert len(said()) == 1  # ... until the caches are reset


def test_the_kernels_own_caches_have_a_reset():
    from twinkle_triton import _launch, rotary

    rotary._CHECKED.add(("shape",))
    rotary.reset()
    _launch.reset()
    assert rotary._CHECKED == set() and _launch._LAUNCHERS == {}
