"""The Hugging Face ``kernels`` package as a neighbour: its active layer mapping.

``kernels`` keeps one layer mapping (``kernels.register_kernel_mapping``, scoped with
``kernels.use_kernel_mapping``) in a context variable: layer name -> device type -> repositories by
``kernels.Mode``. twinkle_fx reads that mapping whenever it selects a kernel for a layer class, so a
user's existing mapping serves ``kernelize_model`` and ``torch.compile(model, backend="twinkle")``
alike (``kernels.kernelize`` itself cannot be used under ``torch.compile``: it swaps forwards before
compiling). Classes take part the way ``kernels.kernelize`` picks them: by their
``kernel_layer_name`` (set by ``kernels.use_kernel_forward_from_hub`` and transformers' hub
decorators), or bound with :func:`~twinkle_fx.register_external_layer`.

It is a :class:`~twinkle_fx.core.plugins.LayerMapping` (``layer_names``, ``layer_registrations``), plugged
into core by :mod:`twinkle_fx.integrations`. Precedence: for a layer name and a device type,
twinkle_fx's own registrations win; the ``kernels`` mapping fills only the (name, device) pairs
twinkle_fx has nothing for. ``DISABLE_KERNEL_MAPPING=1``
(the ``kernels`` switch) makes twinkle_fx ignore the mapping too. The ``kernels`` package is never
imported here: if nothing imported it, nobody can have registered a mapping.

Example::

    import kernels
    repo = kernels.LocalLayerRepository(repo_path=Path("kernels/twinkle_triton"), layer_name="RMSNorm")
    with kernels.use_kernel_mapping({"RMSNorm": {"cuda": repo}}):
        kernelize_model(model, mode="train")           # Qwen2RMSNorm (kernel_layer_name "RMSNorm") swapped
        compiled = torch.compile(model, backend="twinkle")   # the same mapping inside the graph

(:func:`layer_registrations` has a runnable example of the mapping as twinkle_fx reads it.)
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

from ..core.caches import owns_cache
from ..core.devices import ANY_DEVICE, registration_keys
from ..core.modes import Mode, parse_mode
from ..core.registry import LayerRegistration
from ..core.sources import RepoObjectSource
from .hub import is_namespace_folder

__all__ = ["active_kernels_mapping", "layer_names", "layer_registrations"]


def active_kernels_mapping() -> dict[str, Any]:
    """The ``kernels`` layer mapping in effect in this context (layer name -> device type ->
    ``kernels`` DeviceRepos); empty when ``kernels`` was never imported (a ``kernels/`` folder imported in its
    place holds no mapping) or its mapping is disabled."""
    module = sys.modules.get("kernels")
    if module is None or is_namespace_folder(module) or os.environ.get("DISABLE_KERNEL_MAPPING", "0") not in ("", "0"):
        return {}
    globals_module = sys.modules.get("kernels.layer.globals")
    mapping_var = getattr(globals_module, "_KERNEL_MAPPING", None)
    if mapping_var is None:
        # kernels 0.17 keeps the mapping in kernels.layer.globals._KERNEL_MAPPING (a ContextVar of
        # a dict); a release that moves it must not fail silently
        version = getattr(module, "__version__", "?")
        raise RuntimeError(
            f"twinkle_fx cannot read the layer mapping of kernels {version} (kernels.layer.globals._KERNEL_MAPPING "
            "is gone; twinkle_fx reads kernels 0.17);\nregister the kernels with twinkle_fx instead "
            "(twinkle_fx.register_layer_kernel(..., repo=<your LayerRepository>)) or set DISABLE_KERNEL_MAPPING=1."
        )
    return mapping_var.get()


def layer_names() -> list[str]:
    """The layer names the active ``kernels`` mapping has entries for."""
    return list(active_kernels_mapping())


class _MappingSource(RepoObjectSource):
    """A repository from the ``kernels`` mapping (``LayerRepository``, ``LocalLayerRepository``, ...)."""

    def describe(self) -> str:
        repo = self.repo
        # str(LayerRepository) resolves its revision on the Hub: describe it from its fields instead
        where = getattr(repo, "_repo_id", None) or getattr(repo, "_repo_path", None)
        pin = getattr(repo, "_revision", None) or getattr(repo, "_version", None)
        text = f"kernels mapping: {type(repo).__name__}"
        if where is not None:
            text += f" {where}" + (f" ({pin})" if pin is not None else "")
        layer = getattr(repo, "layer_name", None)
        return text + (f", layer {layer}" if layer else "")


# one source per repository object, so a kernel is loaded once however often the mapping is read
# (kernels' own layer cache is keyed the same way)
_SOURCES: dict[int, tuple[Any, _MappingSource]] = {}
_SOURCES_LOCK = threading.Lock()


def _forget_sources() -> None:
    with _SOURCES_LOCK:
        _SOURCES.clear()


owns_cache(__name__, _forget_sources)


def _source(repo: Any) -> _MappingSource:
    with _SOURCES_LOCK:
        entry = _SOURCES.get(id(repo))
        if entry is None or entry[0] is not repo:
            entry = (repo, _MappingSource(repo))
            _SOURCES[id(repo)] = entry
        return entry[1]


def layer_registrations(kernel_name: str, device: str) -> dict[str, dict[Mode, LayerRegistration]]:
    """``device key -> mode -> registration`` from the active ``kernels`` mapping for ``kernel_name``,
    for the keys that serve ``device`` only (reading the CUDA entry queries the GPU's capability).

    Examples:
        >>> import kernels, twinkle_triton
        >>> from pathlib import Path
        >>> repo = kernels.LocalLayerRepository(repo_path=Path(twinkle_triton.__file__).parent, layer_name="RMSNorm")
        >>> with kernels.use_kernel_mapping({"RMSNorm": {"cpu": repo}}):
        ...     layer_registrations("RMSNorm", "cpu")
        {'cpu': {<Mode.ANY: 1>: LayerRegistration(kernel_name='RMSNorm', device='cpu', ...)}}
    """
    by_device = active_kernels_mapping().get(kernel_name)
    if not by_device:
        return {}
    found: dict[str, dict[Mode, LayerRegistration]] = {}
    for key in registration_keys(device):
        device_repos = by_device.get(key) if key != ANY_DEVICE else None
        repos = None if device_repos is None else device_repos.repos
        if not repos:
            continue
        found[key] = {}
        for kernels_mode, repo in repos.items():
            mode = parse_mode(kernels_mode, allow_fallback=True)
            found[key][mode] = LayerRegistration(kernel_name, key, mode, _source(repo))
    return found
