"""What one ``kernelize_model`` call will do to a model's layers, decided before anything changes.

Each module is asked :mod:`twinkle_fx.core.admission`'s rule, the compile backend's too: a module
whose class is a target is a candidate, and it is swapped or keeps its forward for a
:class:`~twinkle_fx.core.reasons.Reason`. A forward installed earlier stays only where this call
admits the same module again (a kernel that does not serve this call is removed, as
``kernels.kernelize`` does). What the registrations leave out (classes that look like layers
without a kernel, layer kernels no class is bound to) is noted for the log, as ``explain`` notes it
(:func:`~twinkle_fx.core.admission.coverage_notes`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..core.admission import Admission, looks_like_layer
from ..core.modes import Mode, format_mode
from ..core.reasons import Reason, ReasonKind
from ..core.registry import get_registry
from ..core.swaps import LayerSwap, swapped_forward

__all__ = ["LayerPlan", "plan_layers"]

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
                             if looks_like_layer(type(m)) and rule.target(type(m)) is None})
    plan.unbound = sorted(set(registry.layer_kernel_names()) - bound_names)
    return plan
