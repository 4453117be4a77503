"""Admission: whether one module gets its class's layer kernel, the one rule of both paths.

``kernelize_model`` walks the model's module tree, the compile backend the modules Dynamo's graph
came from; both ask an :class:`Admission` the same questions in the same order, so one registry
swaps the same modules on both paths, or keeps them for the same :class:`~.reasons.Reason`:

1. is the module's class a target (:func:`~.selection.layer_target`: bound, or tagged with a
   registered ``kernel_layer_name``; a binding limited to some parents asks the module's parent,
   :func:`~.selection.select_bound_layer`)? A module whose class is no target is no candidate, and
   nothing is said about it;
2. was a kernel selected (``NO_KERNEL``, with the selection's reason)?
3. does the kernel's ``forward`` take what the layer's ``forward`` takes (``SIGNATURE``)?
4. does the kernel apply to this instance (its ``applies_to``, :func:`does_not_apply`: ``DOES_NOT_APPLY``)?
5. for a path that keeps a forward already installed on the module (the compile backend: the
   graph already runs it), is there one: twinkle_fx's eager kernel (``EAGER_SWAP``) or another
   tool's (``FOREIGN_FORWARD``)? ``kernelize_model`` replaces such a forward instead (its undo puts
   it back), so it does not ask.

Questions 1 to 3 depend on the class alone: an :class:`Admission` answers them once per class (once
per class and parent, for a binding limited to parents) and keeps the answer for its own life, one
``kernelize_model`` call or one graph pass. Not longer: a registration, a scope or a kernel mapping
that changes between calls changes the answer. Questions 4 and 5 read the instance, so they are
asked per module.

Examples:
    >>> from twinkle_fx import register_external_layer, register_layer_kernel
    >>> from twinkle_fx.core.registry import get_registry
    >>> class TanhGelu(nn.Module):
    ...     def forward(self, input):
    ...         return nn.functional.gelu(input, approximate="tanh")
    >>> _ = register_layer_kernel(kernel_name="FastGelu", layer=TanhGelu, device="cpu")
    >>> register_external_layer(nn.GELU, "FastGelu")
    >>> admission = Admission(get_registry(), "cpu", Mode.INFERENCE)
    >>> admission.target(nn.Linear) is None   # no target: no candidate
    True
    >>> admission.admit("1", nn.GELU(), admission.target(nn.GELU))
    LayerSwap(path='1', module=GELU(approximate='none'), choice=...)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import torch

from .modes import Mode
from .reasons import Reason, ReasonKind
from .registry import KernelRegistry, get_registry
from .selection import (BoundLayer, KernelChoice, Selection, is_layer_target, layer_target, select_bound_layer,
                        signature_mismatch)
from .swaps import LayerSwap, foreign_forward, swapped_forward

__all__ = ["Admission", "LayerTarget", "does_not_apply", "foreign_forward_reason", "looks_like_layer", "coverage_notes"]


@dataclass(frozen=True)
class LayerTarget:
    """A class whose instances are swap candidates, as one :class:`Admission` sees it: the kernel
    selection, and ``refusal`` when the class itself keeps every instance from the kernel (no kernel
    was selected, or its signature differs from the layer's)."""

    cls: type
    selection: Selection
    refusal: Reason | None = None


@dataclass(eq=False)
class Admission:
    """The rule, for one call: a registry, a device and a mode, and what the calling path can run.

    Args:
        allow_uncompilable: let a kernel with ``can_torch_compile=False`` through in a compile mode
            (the backend wraps such kernels opaquely; ``kernelize_model`` hands the model to
            ``torch.compile`` as it is, so it refuses them).
        keep_installed: keep a forward already installed on a module (question 5 of the module
            docstring): the compile backend's graph already runs it.
    """

    registry: KernelRegistry
    device: str
    mode: Mode
    _: KW_ONLY
    allow_uncompilable: bool = False
    keep_installed: bool = False
    _bound: dict[type, BoundLayer | None] = field(default_factory=dict, init=False, repr=False)
    # one answer per (class, parent); the parent is None but for bindings limited to parent classes
    # (register_external_layer(within=...))
    _targets: dict[tuple[type, type | None], LayerTarget | None] = field(default_factory=dict, init=False, repr=False)

    def target(self, cls: type, parent: Callable[[], type | None] | None = None) -> LayerTarget | None:
        """``cls`` as a swap target (questions 1 to 3), or None when its instances are no candidates.

        ``parent`` returns the class of the instance's parent module; it is called only for a class
        whose binding is limited to some parents, and without it such a class is no target.
        """
        if cls not in self._bound:
            self._bound[cls] = layer_target(self.registry, cls, device=self.device)
        bound = self._bound[cls]
        if bound is None:
            return None
        key = (cls, parent() if parent is not None and bound.binding.within is not None else None)
        if key not in self._targets:
            selection = select_bound_layer(bound, self.device, self.mode, allow_uncompilable=self.allow_uncompilable,
                                           parent=key[1])
            if selection is None:
                found = None
            elif selection.choice is None:
                found = LayerTarget(cls, selection, Reason(ReasonKind.NO_KERNEL, selection.reason or "no kernel"))
            else:
                mismatch = signature_mismatch(cls.forward, selection.choice.call)
                refusal = None if mismatch is None else Reason(ReasonKind.SIGNATURE, mismatch)
                found = LayerTarget(cls, selection, refusal)
            self._targets[key] = found
        return self._targets[key]

    def admit(self, path: str, module: torch.nn.Module, target: LayerTarget) -> LayerSwap | Reason:
        """The swap of ``module`` (at ``path`` in its model) to ``target``'s kernel, or why it keeps
        its forward (questions 2 to 5)."""
        if target.refusal is not None:
            return target.refusal
        choice = target.selection.choice
        not_applicable = does_not_apply(choice, module)
        if not_applicable is not None:
            return Reason(ReasonKind.DOES_NOT_APPLY, not_applicable)
        if self.keep_installed:
            eager = swapped_forward(module)
            if eager is not None:
                return Reason(ReasonKind.EAGER_SWAP, f"already kernelized eagerly (kernelize_model installed "
                              f"{eager.kernel_name}); the graph holds that kernel")
            foreign = foreign_forward(module)
            if foreign is not None:
                return _replaced_by(foreign)
        return LayerSwap(path, module, choice)


def _declared(choice: KernelChoice, name: str, default: Any) -> Any:
    """A declaration of a layer kernel, on its ``forward`` or on the kernel itself."""
    return getattr(choice.call, name, getattr(choice.kernel, name, default))


def does_not_apply(choice: KernelChoice, module: torch.nn.Module) -> str | None:
    """Why the layer kernel of ``choice`` does not apply to ``module``, or None when it does.

    A kernel states what it applies to with ``applies_to(module) -> str | None``, an attribute of
    its ``forward`` (or of the kernel class): the reason it does not compute what ``module`` computes
    (another activation, norm variant, head layout), read from the module's attributes. Both the
    eager path and the compile backend ask before swapping and report the reason. Kernels without
    ``applies_to`` apply wherever their signature fits. (On ``forward`` because Hugging Face
    ``kernels`` refuses layer classes with members beyond ``has_backward``/``can_torch_compile``.)

    Examples:
        >>> def silu_only(module):
        ...     return None if isinstance(module.act_fn, nn.SiLU) else f"act_fn is {module.act_fn}"
        >>> class SwiGLUMLP(nn.Module):
        ...     def forward(self, x): ...
        ...     forward.applies_to = silu_only
        >>> mlp = nn.Module()
        >>> mlp.act_fn = nn.GELU()
        >>> print(SwiGLUMLP.forward.applies_to(mlp))
        act_fn is GELU(approximate='none')
    """
    check = _declared(choice, "applies_to", None)
    if check is None:
        return None
    reason = check(module)
    if reason is None:
        return None
    return f"{choice.name} does not apply to this {type(module).__qualname__}: {reason}"


def _replaced_by(who: str) -> Reason:
    return Reason(ReasonKind.FOREIGN_FORWARD,
                  f"forward replaced by {who}: the graph runs that kernel as it is (twinkle_fx leaves it)")


def foreign_forward_reason(module: torch.nn.Module) -> Reason | None:
    """Why ``module`` keeps a forward another tool installed (``kernels.kernelize``), or None when
    none did."""
    who = foreign_forward(module)
    return None if who is None else _replaced_by(who)


# Class names that mark a transformers layer a kernel usually replaces: listed when a model has
# no kernel for them, so a user of an uncovered family learns it from the log.
_LAYER_SUFFIXES = ("Norm", "MLP", "Attention", "ForCausalLM", "Experts", "SparseMoeBlock")


def looks_like_layer(cls: type) -> bool:
    """Whether ``cls`` is a layer a kernel usually replaces (tagged, or a transformers norm, MLP, ...)."""
    if isinstance(getattr(cls, "kernel_layer_name", None), str):
        return True
    return cls.__module__.startswith("transformers.models.") and cls.__name__.endswith(_LAYER_SUFFIXES)


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
                       if looks_like_layer(cls) and not is_layer_target(registry, cls, device=device))
    if uncovered:
        notes.append(f"layer classes of {type(model).__name__} without a kernel: {', '.join(uncovered)}")
    return notes
