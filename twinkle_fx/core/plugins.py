"""Where integrations plug into core, so that core never imports them.

Core needs two things from outside it, each a small protocol that a module meets with module-level
functions:

- a :class:`HubLoader` loads kernel repositories published the Hugging Face way (``repo_id=`` kernels,
  and local repos in the Hugging Face layout); :mod:`twinkle_fx.integrations.hub` is one, over the
  ``kernels`` package;
- a :class:`LayerMapping` holds layer kernels registered outside twinkle_fx's registry; selection
  counts them for the (name, device) pairs the registry has nothing for.
  :mod:`twinkle_fx.integrations.kernels_mapping` is one: the ``kernels`` package's
  ``use_kernel_mapping``.

An integration plugs in by module name, and the module is imported when core first needs it, so
plugging in costs nothing at start-up. Importing ``twinkle_fx`` plugs in ``twinkle_fx.integrations``,
so every use of the library has them.

Examples:
    >>> [mapping.__name__ for mapping in layer_mappings()]
    ['twinkle_fx.integrations.kernels_mapping']
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Collection
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

from .errors import KernelLoadError

if TYPE_CHECKING:
    from .modes import Mode

__all__ = ["HubLoader", "LayerMapping", "plug_hub_loader", "plug_layer_mapping", "hub_loader", "layer_mappings"]


class HubLoader(Protocol):
    """Loads a kernel package the Hugging Face way; every failure is a :class:`KernelLoadError`
    naming ``where`` (the registration) and what to do."""

    def load_hub_kernel(self, repo_id: str, *, revision: str | None, version: int | str | None,
                        trust_remote_code: bool | list[str], where: str) -> ModuleType: ...

    def load_local_hf_kernel(self, path: Path, *, trust_remote_code: bool | list[str], where: str) -> ModuleType: ...


class LayerMapping(Protocol):
    """Layer kernels registered outside twinkle_fx's registry."""

    def layer_names(self) -> Collection[str]:
        """The kernel names it has entries for (none: it adds nothing anywhere)."""

    def layer_registrations(self, kernel_name: str, device: str) -> dict[str, dict[Mode, Any]]:
        """``device key -> mode ->`` :class:`~twinkle_fx.core.registry.LayerRegistration` for ``kernel_name``,
        for the keys that serve ``device`` (the registry is not imported here: it imports the sources,
        which ask this module for the Hub loader)."""


_LOCK = threading.Lock()
_hub_loader: str | None = None
_LAYER_MAPPINGS: list[str] = []


def plug_hub_loader(module_name: str) -> None:
    """Make the module ``module_name`` (a :class:`HubLoader`) load Hub and Hugging Face-layout kernels
    (in place of any plugged in before)."""
    global _hub_loader
    with _LOCK:
        _hub_loader = module_name


def plug_layer_mapping(module_name: str) -> None:
    """Count the layer kernels of the module ``module_name`` (a :class:`LayerMapping`) in every selection."""
    with _LOCK:
        if module_name not in _LAYER_MAPPINGS:
            _LAYER_MAPPINGS.append(module_name)


def hub_loader(where: str) -> HubLoader:
    """The plugged :class:`HubLoader`.

    Raises:
        KernelLoadError: none is plugged in (``where`` names the kernel that needed one).
    """
    name = _hub_loader
    if name is None:
        raise KernelLoadError(f"{where}: no Hugging Face Hub loader is plugged into twinkle_fx.core; import "
                              "twinkle_fx.integrations, which plugs in twinkle_fx.integrations.hub.")
    return importlib.import_module(name)


def layer_mappings() -> list[LayerMapping]:
    """The plugged :class:`LayerMapping` modules, in the order they were plugged in."""
    with _LOCK:
        names = list(_LAYER_MAPPINGS)
    return [importlib.import_module(name) for name in names]
