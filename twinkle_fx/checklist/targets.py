"""What ``check_kernels`` checks: every layer class bound to a kernel name and every registered
function, each with the kernel the device gets (training first, else inference); the rest are
reported as not checked, with the reason."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Sequence
from typing import Any

from ..core.modes import Mode
from ..core.registry import KernelRegistry
from ..core.selection import select_function_kernel, select_layer_kernel
from .inputs import function_inputs, layer_inputs
from .report import CHECKLIST, SKIP, KernelCheck
from .runner import Target

__all__ = ["find_targets", "unchecked_check"]


def find_targets(registry: KernelRegistry, device: str, inputs: dict, tiny: bool, kernels: Sequence[str] | None,
             unchecked: list[KernelCheck]) -> list[Target]:
    """Every bound layer class and every registered function, with the kernel the device gets.

    Raises:
        ValueError: a name in ``kernels`` names no kernel, bound class or function of the registry.
    """
    if kernels:
        _check_known(registry, kernels)
    found: list[Target] = []

    def wanted(*names: str) -> bool:
        return not kernels or any(n in kernels for n in names)

    def select(selector, *args) -> tuple[Mode, Any]:
        selection = selector(registry, *args, device, Mode.TRAINING)
        if selection is None or selection.ok:
            return Mode.TRAINING, selection
        return Mode.INFERENCE, selector(registry, *args, device, Mode.INFERENCE)

    bound_names = set()
    for cls, kernel_name in registry.bindings().items():
        bound_names.add(kernel_name)
        if not wanted(kernel_name, cls.__qualname__):
            continue
        scope = registry.binding_scope(cls)  # a binding limited to parents: checked as under the first
        mode, selection = select(select_layer_kernel if scope is None else
                                 functools.partial(select_layer_kernel, parent=scope[0]), cls)
        if selection is None or not selection.ok:
            unchecked.append(unchecked_check(kernel_name, cls.__qualname__, "layer",
                                        selection.reason if selection else "no registrations"))
            continue
        make = inputs.get(cls)
        found.append(Target("layer", cls.__qualname__, selection.choice, mode, cls,
                             (lambda rows, width, dtype, dev, make=make: make(rows, dtype, dev)) if make else
                             (lambda rows, width, dtype, dev, cls=cls: layer_inputs(cls, rows, width, dtype, dev, tiny))))
    for kernel_name in registry.layer_kernel_names():
        if kernel_name not in bound_names and wanted(kernel_name):
            unchecked.append(unchecked_check(kernel_name, "-", "layer", "no class is bound to it (register_external_layer), "
                                        "so there is no original to check it against"))
    for target in registry.function_targets():
        if not wanted(target, target.rsplit(".", 1)[1]):
            continue
        module_name, func = target.rsplit(".", 1)
        try:
            original = getattr(importlib.import_module(module_name), func)
        except (ImportError, AttributeError) as e:
            unchecked.append(unchecked_check(target, target, "function", f"the original cannot be found: {e!r}"))
            continue
        mode, selection = select(select_function_kernel, target)
        if not selection.ok:
            unchecked.append(unchecked_check(target, target, "function", selection.reason))
            continue
        make = inputs.get(target) or inputs.get(original)
        found.append(Target("function", target, selection.choice, mode, original,
                             (lambda rows, width, dtype, dev, make=make: make(rows, dtype, dev)) if make else
                             (lambda rows, width, dtype, dev, fn=original, func=func: function_inputs(func, fn, rows, width, dtype, dev, tiny))))
    return found


def _check_known(registry: KernelRegistry, kernels: Sequence[str]) -> None:
    known = {*registry.layer_kernel_names()}
    for cls, kernel_name in registry.bindings().items():
        known.update((kernel_name, cls.__qualname__))
    for target in registry.function_targets():
        known.update((target, target.rsplit(".", 1)[1]))
    unknown = [name for name in kernels if name not in known]
    if unknown:
        registered = ", ".join(sorted(known)) or "nothing (register kernels first, e.g. in a --setup file)"
        raise ValueError(f"unknown kernel name(s) {', '.join(map(repr, unknown))}: no registered kernel, bound class "
                         f"or function is called so; registered: {registered}")


def unchecked_check(kernel: str, target: str, kind: str, reason: str) -> KernelCheck:
    check = KernelCheck(kernel=kernel, target=target, kind=kind, verdicts=dict.fromkeys(CHECKLIST, SKIP))
    check.notes["correctness"] = f"not checked: {reason}"
    return check
