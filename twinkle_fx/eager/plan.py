"""What one ``kernelize_model`` call will do to a model's layers, decided before anything changes.

Each module is asked :mod:`twinkle_fx.core.admission`'s rule, the compile backend's too: a module
whose class is a target is a candidate, and it is swapped or keeps its forward for a
:class:`~twinkle_fx.core.reasons.Reason`. A forward installed earlier stays only where this call
admits the same module again (a kernel that does not serve this call is removed, as
``kernels.kernelize`` does). What the registrations leave out (classes that look like layers
without a kernel, layer kernels no class is bound to) is noted for the log and for ``explain``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..core.admission import Admission
from ..core.modes import Mode, format_mode
from ..core.reasons import Reason, ReasonKind
from ..core.registry import get_registry
from ..core.selection import is_layer_target
from ..core.swaps import LayerSwap, swapped_forward

__all__ = ["LayerPlan", "plan_layers", "coverage_notes"]

# Class names that mark a transformers layer a kernel usually replaces: listed when a model has
# no kernel for them, so a user of an uncovered family learns it from the log.
_LAYER_SUFFIXES = ("Norm", "MLP", "Attention", "ForCausalLM", "Experts", "SparseMoeBlock")


def _looks_like_layer(cls: type) -> bool:
    if isinstance(getattr(cls, "kernel_layer_name", None), str):
        return True
    return cls.__module__.startswith("transformers.models.") and cls.__name__.endswith(_LAYER_SUFFIXES)


@dataclass
class LayerPlan:
    """What one ``kernelize_model`` call will do to the layers of a model.

    Attributes:
        swaps: the admitted modules, each with its kernel.
        kept: module path -> why that candidate keeps its forward.
        stale: ``(path, module, why)`` of modules whose earlier kernel does not serve this call.
        fallbacks: ``(class, reason as logged) -> paths`` of the kept candidates, grouped for the log.
        errors: one line per kept candidate (``use_fallback=False`` raises the first).
        candidates: how many modules are candidates (swapped or kept).
        uncovered: names of the model's classes that look like layers and have no kernel.
        unbound: registered layer kernel names no class of the model or the registry is bound to.
    """

    swaps: list[LayerSwap] = field(default_factory=list)
    kept: dict[str, Reason] = field(default_factory=dict)
    stale: list[tuple[str, torch.nn.Module, str]] = field(default_factory=list)
    fallbacks: dict[tuple[type, str], list[str]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    candidates: int = 0
    uncovered: list[str] = field(default_factory=list)
    unbound: list[str] = field(default_factory=list)


def _logged(reason: Reason, choice: object) -> str:
    # a signature mismatch does not name the kernel (the compile report shows it in a field of its
    # own); the eager log and error name the registration in front of it
    return f"{choice}: {reason}" if reason.kind is ReasonKind.SIGNATURE else str(reason)


def plan_layers(model: torch.nn.Module, device: str, mode: Mode) -> LayerPlan:
    """Admit every module of ``model`` (the active registry, ``device``, ``mode``); changes nothing.

    Examples:
        >>> from twinkle_fx import register_external_layer, register_layer_kernel
        >>> class TanhGelu(nn.Module):
        ...     def forward(self, input):
        ...         return nn.functional.gelu(input, approximate="tanh")
        >>> _ = register_layer_kernel(kernel_name="FastGelu", layer=TanhGelu, device="cuda")
        >>> register_external_layer(nn.GELU, "FastGelu")
        >>> plan = plan_layers(nn.Sequential(nn.Linear(4, 4), nn.GELU()), "cpu", Mode.INFERENCE)
        >>> plan.candidates, plan.swaps, plan.kept["1"].kind
        (1, [], <ReasonKind.NO_KERNEL: 'no kernel selected'>)
    """
    registry = get_registry()
    rule = Admission(registry, device, mode)
    plan = LayerPlan()
    bound_names = set(registry.bindings().values())
    modules = dict(model.named_modules())
    for path, module in modules.items():
        cls = type(module)
        name = getattr(cls, "kernel_layer_name", None)
        if isinstance(name, str):
            bound_names.add(name)
        parent = (lambda owner=path.rpartition(".")[0]: type(modules[owner])) if path else None
        target = rule.target(cls, parent)
        current = swapped_forward(module)
        where = path or "<model>"
        if target is None:
            if current is not None:
                plan.stale.append((where, module, f"{cls.__qualname__} is no longer bound to a registered kernel"))
            continue
        plan.candidates += 1
        admitted = rule.admit(path, module, target)
        if isinstance(admitted, LayerSwap):
            plan.swaps.append(admitted)
            continue
        plan.kept[path] = admitted
        reason = _logged(admitted, target.selection.choice)
        plan.fallbacks.setdefault((cls, reason), []).append(where)
        plan.errors.append(f"{where} ({cls.__qualname__}) on {device} ({format_mode(mode)}): {reason}")
        if current is not None:
            plan.stale.append((where, module, f"{current.kernel_name} does not serve it now: {reason}"))
    # the class alone, without a parent: a class bound only under some parents is covered nowhere
    plan.uncovered = sorted({type(m).__name__ for m in modules.values()
                             if _looks_like_layer(type(m)) and rule.target(type(m)) is None})
    plan.unbound = sorted(set(registry.layer_kernel_names()) - bound_names)
    return plan


def coverage_notes(model: torch.nn.Module) -> list[str]:
    """What the registrations leave out for ``model``: layer kernels no class is bound to, and the
    model's layer classes that no kernel serves (for ``explain`` and reports).

    Examples:
        >>> from twinkle_fx import register_layer_kernel
        >>> _ = register_layer_kernel(kernel_name="linear", layer=nn.Linear, device="cpu")
        >>> coverage_notes(nn.Sequential(nn.Linear(8, 8)))
        ["layer kernel 'linear' is registered but no class is bound to it: bind the class it replaces, e.g. register_external_layer(nn.Linear, 'linear')"]
    """
    registry = get_registry()
    # the kernels package's mapping serves a device: without the model's, its layers would be
    # listed as having no kernel although the mapping swaps them
    device = next((t.device.type for t in (*model.parameters(), *model.buffers())), None)
    classes = {type(m) for m in model.modules()}
    bound = set(registry.bindings().values()) | {
        name for cls in classes if isinstance(name := getattr(cls, "kernel_layer_name", None), str)}
    notes = [f"layer kernel {name!r} is registered but no class is bound to it: bind the class it replaces, e.g. "
             f"register_external_layer(nn.Linear, {name!r})"
             for name in sorted(set(registry.layer_kernel_names()) - bound)]
    uncovered = sorted(cls.__name__ for cls in classes
                       if _looks_like_layer(cls) and not is_layer_target(registry, cls, device=device))
    if uncovered:
        notes.append(f"layer classes of {type(model).__name__} without a kernel: {', '.join(uncovered)}")
    return notes
