"""The Hugging Face ``kernels`` layer API of ``docs/seeds/hf-kernels-layers.md``, over twinkle_fx's
registry: code written for that document runs unchanged with twinkle_fx doing the swap.

=====================================  =============================================================
``use_kernel_forward_from_hub(name)``  class decorator: sets ``kernel_layer_name`` (behaviour unchanged)
``replace_kernel_forward_from_hub``    binds an existing class to a name (``register_external_layer``)
``LayerRepository``                    where a layer kernel lives on the Hub
``register_kernel_mapping(mapping)``   ``{name: {device: LayerRepository}}`` (or ``{device: {Mode:
                                       LayerRepository}}``) into the active registry
``use_kernel_mapping(mapping)``        the same, for a ``with`` block only
``kernelize(model, ...)``              ``kernelize_model`` with the document's ``needs_backward`` /
                                       ``needs_torch_compile`` / ``use_fallback`` arguments
=====================================  =============================================================

The installed ``kernels`` package (0.17) has most of these names but a newer ``kernelize`` (``mode=``
is required there, ``needs_backward`` is gone); this module keeps the document's form.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..core.modes import Mode
from ..core.registration import register_external_layer, register_layer_kernel
from ..core.registry import scoped_registry
from ..eager import kernelize_model

__all__ = ["LayerRepository", "kernelize", "register_kernel_mapping", "replace_kernel_forward_from_hub",
           "use_kernel_forward_from_hub", "use_kernel_mapping"]


def use_kernel_forward_from_hub(layer_name: str):
    """Class decorator: mark the class as extensible under ``layer_name``; its behaviour is unchanged.

    Examples:
        >>> @use_kernel_forward_from_hub("SiluAndMul")
        ... class SiluAndMul(torch.nn.Module):
        ...     def forward(self, x):
        ...         d = x.shape[-1] // 2
        ...         return torch.nn.functional.silu(x[..., :d]) * x[..., d:]
        >>> SiluAndMul.kernel_layer_name
        'SiluAndMul'
    """
    def decorate(cls: type) -> type:
        cls.kernel_layer_name = layer_name
        return cls

    return decorate


def replace_kernel_forward_from_hub(cls: type, layer_name: str) -> None:
    """Make an existing, undecorated class extensible under ``layer_name`` (a registry binding, so
    it is scoped and undone like every twinkle_fx registration)."""
    register_external_layer(cls, layer_name)


@dataclass(frozen=True)
class LayerRepository:
    """A layer kernel on the Hub: ``repo_id``, the layer's name in it, and a ``revision`` or ``version``."""

    repo_id: str
    layer_name: str
    revision: str | None = None
    version: int | str | None = None

    def __post_init__(self) -> None:
        if self.revision is not None and self.version is not None:
            raise ValueError(f"LayerRepository({self.repo_id!r}): pass revision or version, not both.")


def register_kernel_mapping(mapping: Mapping[str, Mapping[Any, Any]]) -> None:
    """Register ``{layer name: {device: LayerRepository}}`` (the device value may also be
    ``{Mode or mode string: LayerRepository}``) in the active registry.

    Raises:
        TypeError: an entry that is not a LayerRepository (the message names the layer and device).
    """
    for name, by_device in mapping.items():
        for device, entry in by_device.items():
            per_mode = entry.items() if isinstance(entry, Mapping) else [(None, entry)]
            for mode, repo in per_mode:
                if not isinstance(repo, LayerRepository):
                    raise TypeError(f"kernel mapping {name!r} / {device!r}: expected a LayerRepository, "
                                    f"got {type(repo).__name__}.")
                register_layer_kernel(kernel_name=name, repo_id=repo.repo_id, layer_name=repo.layer_name,
                                      revision=repo.revision, version=repo.version, device=device, mode=mode)


@contextlib.contextmanager
def use_kernel_mapping(mapping: Mapping[str, Mapping[Any, Any]], *, inherit_mapping: bool = True) -> Iterator[None]:
    """Register ``mapping`` for the ``with`` block only (and, with ``inherit_mapping=False``, hide
    every registration made outside it)."""
    with scoped_registry(inherit=inherit_mapping):
        register_kernel_mapping(mapping)
        yield


def kernelize(
    model: torch.nn.Module,
    *,
    device: str | torch.device | None = None,
    needs_backward: bool | None = None,
    needs_torch_compile: bool = False,
    use_fallback: bool = True,
    mode: Any = None,
) -> torch.nn.Module:
    """Swap Hub kernels into the extensible layers of ``model`` (in place; returns it).

    Args:
        device (*optional*): inferred from the model's parameters when not given.
        needs_backward (`bool`, *optional*): default ``model.training``: training never uses an
            inference-only kernel.
        needs_torch_compile (`bool`, defaults to `False`): only kernels that support ``torch.compile``.
        use_fallback (`bool`, defaults to `True`): keep the original ``forward`` where no kernel fits;
            `False` raises instead.
        mode (*optional*): a ``Mode`` or mode string, overriding the two ``needs_*`` flags (the newer
            ``kernels`` form).

    Examples:
        >>> model = nn.Sequential(nn.Linear(4, 4)).eval()
        >>> model = kernelize(model, device="cpu", needs_torch_compile=True, use_fallback=False)
    """
    if mode is None:
        mode = Mode.TRAINING if (model.training if needs_backward is None else needs_backward) else Mode.INFERENCE
        if needs_torch_compile:
            mode |= Mode.TORCH_COMPILE
    return kernelize_model(model, mode=mode, device=device, use_fallback=use_fallback)
