"""Selection: which registered kernel serves a layer class or a function on a device in a mode.

Both the eager path and the compile backend ask the same question and get the same answer, a
:class:`Selection`: the chosen kernel, or the reason there is none (and why each candidate was
rejected), so the report and the fallback log can say it.
"""

from __future__ import annotations

import inspect
import sys
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .devices import registration_keys, triton_interpreter_problem
from .errors import KernelLoadError
from .modes import Mode, format_mode, mode_fallback_order
from .plugins import layer_mappings
from .registry import FunctionRegistration, KernelRegistry, LayerBinding, LayerRegistration

__all__ = ["KernelChoice", "Selection", "BoundLayer", "is_layer_target", "layer_target", "select_layer_kernel",
           "select_bound_layer", "select_function_kernel", "signature_mismatch", "KERNEL_DECLARATIONS"]

# Class attributes a layer kernel may declare beyond forward (anything else is state the replaced
# layer does not have: see _stateless_problem).
KERNEL_DECLARATIONS = {"has_backward", "can_torch_compile"}


@dataclass(frozen=True)
class KernelChoice:
    """A loaded kernel that passed the mode / capability checks.

    ``call`` is ``forward(self, *args)`` for a layer kernel, the replacement callable for a function.
    """

    registration: LayerRegistration | FunctionRegistration
    kernel: Any
    call: Callable[..., Any]
    has_backward: bool
    can_torch_compile: bool

    @property
    def name(self) -> str:
        reg = self.registration
        return reg.kernel_name if isinstance(reg, LayerRegistration) else reg.target

    def __str__(self) -> str:
        return str(self.registration)


@dataclass(frozen=True)
class Selection:
    """The answer for one target: ``choice`` or ``reason`` (never both)."""

    target: str
    device: str
    mode: Mode
    choice: KernelChoice | None = None
    reason: str | None = None
    rejected: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return self.choice is not None

    def __str__(self) -> str:
        where = f"{self.target} on {self.device} ({format_mode(self.mode)})"
        if self.choice is not None:
            return f"{where}: {self.choice}"
        return f"{where}: no kernel: {self.reason}"


def capabilities(kernel: Any) -> tuple[bool, bool]:
    """``(has_backward, can_torch_compile)`` declared by a kernel class, instance or function.

    Defaults: has_backward True, can_torch_compile False (the Hugging Face kernels convention).
    """
    return bool(getattr(kernel, "has_backward", True)), bool(getattr(kernel, "can_torch_compile", False))


class _Refused(Exception):
    """A loaded kernel that cannot serve as one (stateful, no signature); the message says why."""


def _stateless_problem(cls: type) -> str | None:
    """Why a layer kernel class is not stateless (as the ``kernels`` package's ``_validate_layer``).

    Its ``forward`` runs with the replaced module as ``self``: state set in an ``__init__``, and
    members of the kernel class, are not there at call time.
    """
    base = torch.nn.Module if issubclass(cls, torch.nn.Module) else object
    if cls.__init__ is not base.__init__:
        return (f"layer kernel class {cls.__qualname__} defines __init__: its forward runs on the replaced "
                "module, which never ran it; keep the state in the layer and drop __init__")
    base_members = set(dir(base)) | {"forward"}
    extra = sorted(name for name in dir(cls) if name not in base_members and name not in KERNEL_DECLARATIONS
                   and not (name.startswith("__") and name.endswith("__")))
    if extra:
        return (f"layer kernel class {cls.__qualname__} has members the replaced layer does not have "
                f"({', '.join(extra)}): its forward runs with the replaced module as self, so self.{extra[0]} "
                "would not be found; move them into forward or a module-level function")
    return None


def _layer_call(kernel: Any) -> Callable[..., Any]:
    if isinstance(kernel, torch.nn.Module):
        kernel = type(kernel)
    if isinstance(kernel, type):
        forward = getattr(kernel, "forward", None)
        if forward is None or forward is torch.nn.Module.forward:
            raise KernelLoadError(f"layer kernel class {kernel.__qualname__} defines no forward().")
        problem = _stateless_problem(kernel)
        if problem is not None:
            raise _Refused(problem)
        return forward
    if callable(kernel):
        return kernel
    raise KernelLoadError(f"layer kernel {kernel!r} is neither an nn.Module class, an instance, nor a callable.")


# A class-based function kernel is instantiated once, so every selection gets the same callable and
# "already patched with this kernel" holds (weak: an unloaded class takes its instance with it).
_INSTANCES: "weakref.WeakKeyDictionary[type, Any]" = weakref.WeakKeyDictionary()
_INSTANCES_LOCK = threading.Lock()


def _function_call(kernel: Any) -> Callable[..., Any]:
    # a class whose instances are the kernel (an nn.Module, or any class defining __call__, as the
    # documents' FuncRepositoryProtocol example returns): calling the class would construct it
    if isinstance(kernel, type) and (issubclass(kernel, torch.nn.Module)
                                     or any("__call__" in vars(k) for k in kernel.__mro__ if k is not object)):
        with _INSTANCES_LOCK:
            instance = _INSTANCES.get(kernel)
            if instance is None:
                instance = _INSTANCES[kernel] = kernel()
        return instance
    if callable(kernel):
        return kernel
    raise KernelLoadError(f"function kernel {kernel!r} is not callable.")


def _select(
    target: str,
    registrations: dict[str, dict[Mode, Any]],
    device: str,
    mode: Mode,
    make_call: Callable[[Any], Callable[..., Any]],
    allow_uncompilable: bool,
) -> Selection:
    if not registrations:
        return Selection(target, device, mode, reason="nothing is registered for it")
    candidates = [
        registrations[key][reg_mode]
        for key in registration_keys(device)
        if key in registrations
        for reg_mode in mode_fallback_order(mode)
        if reg_mode in registrations[key]
    ]
    if not candidates:
        registered = ", ".join(
            f"{dev}:{'/'.join(format_mode(m) for m in modes)}" for dev, modes in sorted(registrations.items())
        )
        if not any(key in registrations for key in registration_keys(device)):
            reason = f"no kernel for device {device!r} (registered: {registered})"
        else:
            reason = f"no registration serves mode {format_mode(mode)!r} on {device!r} (registered: {registered})"
        return Selection(target, device, mode, reason=reason)

    rejected: list[str] = []
    for registration in candidates:
        try:
            kernel = registration.source.load()
            call = make_call(kernel)
        except KernelLoadError as e:
            # the error already names the source; add which registration it was
            rejected.append(f"[{registration.device}, {format_mode(registration.mode)}] failed to load: {e}")
            continue
        except _Refused as e:
            rejected.append(f"{registration}: {e}")
            continue
        problem = triton_interpreter_problem(kernel, device)
        if problem is not None:
            rejected.append(f"{registration}: {problem}")
            continue
        has_backward, can_compile = capabilities(kernel)
        if Mode.TRAINING in mode and not has_backward:
            rejected.append(f"{registration}: inference-only kernel (has_backward=False) in training mode")
            continue
        if Mode.TORCH_COMPILE in mode and not can_compile and not allow_uncompilable:
            rejected.append(f"{registration}: cannot be used under torch.compile (can_torch_compile=False)")
            continue
        choice = KernelChoice(registration, kernel, call, has_backward, can_compile)
        return Selection(target, device, mode, choice=choice, rejected=tuple(rejected))
    return Selection(target, device, mode, reason="; ".join(rejected), rejected=tuple(rejected))


@dataclass(frozen=True)
class BoundLayer:
    """A layer class whose instances are swap targets: the registry's binding of it, and the
    registrations of its kernel name (with the plugged layer mappings' where a device was given)."""

    cls: type
    binding: LayerBinding
    registrations: dict[str, dict[Mode, LayerRegistration]]

    @property
    def name(self) -> str:
        return f"{self.cls.__qualname__} -> {self.binding.kernel_name}"

    def serves(self, registration: LayerRegistration) -> bool:
        # A class bound explicitly is served by every registration of its kernel name; a class that only
        # carries the name as transformers' kernel_layer_name tag only by registrations with
        # binds_by_tag=True (transformers puts kernel_layer_name="RMSNorm" on ~130 classes of differing
        # semantics, so the built-in kernels register with binds_by_tag=False).
        return registration.binds_by_tag or self.binding.explicit


def layer_target(registry: KernelRegistry, cls: type, *, device: str | None = None) -> BoundLayer | None:
    """The rule that makes a layer class a swap target, for eager swaps, the compile backend and
    reports alike: its binding and registrations when instances of ``cls`` are targets, else None. A
    class is a target when it (or a base) is bound with :func:`register_external_layer`, or carries a
    ``kernel_layer_name`` tag with a registration that binds by tag (``binds_by_tag=True``);
    transformers tags many classes, so a tag without such a registration makes no target. A binding
    limited to some parents (``within=``) still makes a target: :func:`select_bound_layer` asks the
    parent. Loads nothing.

    Args:
        device (`str`, *optional*): also count the layer mappings plugged into core (the Hugging Face
            ``kernels`` mapping in effect, ``use_kernel_mapping``) for this device; they fill the
            device keys twinkle_fx has nothing for.
    """
    binding = registry.layer_binding(cls)
    if binding is None:
        return None
    registrations = registry.layer_registrations(binding.kernel_name)
    # the plugged mappings fill the device keys twinkle_fx has no registration for (the first mapping with a key wins)
    for mapping in layer_mappings() if device is not None else ():
        for key, modes in mapping.layer_registrations(binding.kernel_name, device).items():
            registrations.setdefault(key, modes)
    bound = BoundLayer(cls, binding, registrations)
    if not binding.explicit and not any(bound.serves(r) for modes in registrations.values() for r in modes.values()):
        return None
    return bound


def select_bound_layer(bound: BoundLayer, device: str, mode: Mode, *, allow_uncompilable: bool = False,
                       parent: type | None = None) -> Selection | None:
    """The kernel for instances of ``bound.cls`` under a module of class ``parent``, or ``None`` when
    they are no target there (:func:`select_layer_kernel` has the arguments)."""
    within = bound.binding.within
    if within is not None and (parent is None or not issubclass(parent, within)):
        return None  # a binding limited to some parents (register_external_layer(..., within=...))
    selection = _select(bound.name, bound.registrations, device, mode, _layer_call, allow_uncompilable)
    if selection.choice is not None and not bound.serves(selection.choice.registration):
        return None
    return selection


def select_layer_kernel(
    registry: KernelRegistry,
    cls: type,
    device: str,
    mode: Mode,
    *,
    allow_uncompilable: bool = False,
    parent: type | None = None,
) -> Selection | None:
    """The kernel for instances of ``cls``, or ``None`` if ``cls`` is no target: not bound with
    :func:`register_external_layer` and not carrying a ``kernel_layer_name`` that has registrations.

    Args:
        allow_uncompilable: let a kernel with ``can_torch_compile=False`` through in compile mode
            (the backend wraps such kernels opaquely and says so in its report).
        parent: the class of the instance's parent module. A binding limited to some parents
            (``register_external_layer(..., within=...)``) serves only instances under them, so
            without a parent it is no target.
    """
    bound = layer_target(registry, cls, device=device)
    if bound is None:
        return None
    return select_bound_layer(bound, device, mode, allow_uncompilable=allow_uncompilable, parent=parent)


def is_layer_target(registry: KernelRegistry, cls: type, *, device: str | None = None) -> bool:
    """Whether instances of ``cls`` are swap targets (:func:`layer_target`'s rule; with ``device``,
    the ``kernels`` mapping counts too). Loads nothing."""
    return layer_target(registry, cls, device=device) is not None


def select_function_kernel(
    registry: KernelRegistry,
    target: str,
    device: str,
    mode: Mode,
    *,
    allow_uncompilable: bool = False,
) -> Selection:
    """The kernel replacing function ``target`` ("module.func")."""
    return _select(target, registry.function_registrations(target), device, mode, _function_call, allow_uncompilable)


def _same_default(a: Any, b: Any) -> bool:
    """Whether two default values are the same value (not merely equal-looking: True is not 1)."""
    if a is b:
        return True
    if isinstance(a, bool) or isinstance(b, bool):
        return False
    if isinstance(a, (int, float, complex)) and isinstance(b, (int, float, complex)):
        return a == b
    if type(a) is type(b) and isinstance(a, (str, bytes)):
        return a == b
    if type(a) is type(b) and isinstance(a, tuple):
        return len(a) == len(b) and all(_same_default(x, y) for x, y in zip(a, b))
    return False


def _parameters(fn: Callable[..., Any], drop_self: bool) -> list[inspect.Parameter]:
    params = list(inspect.signature(fn).parameters.values())
    return params[1:] if drop_self and params else params


def _renamed_parameters(ours: list[inspect.Parameter], theirs: list[inspect.Parameter],
                        original: Callable[..., Any]) -> str | None:
    """The cause of a signature mismatch when it is a rename (same position and kind, another name
    neither side has elsewhere): a library release renamed the layer's parameter, as transformers
    5.24 did with ``past_key_values`` -> ``cache``. None when the mismatch is anything else."""
    if len(ours) != len(theirs):
        return None
    our_names, their_names = {p.name for p in ours}, {p.name for p in theirs}
    renamed = []
    for mine, layer in zip(ours, theirs):
        if mine.name == layer.name:
            continue
        if mine.kind != layer.kind or mine.name in their_names or layer.name in our_names:
            return None
        renamed.append(f"parameter {mine.name!r} is named {layer.name!r} in the layer")
    if not renamed:
        return None
    package = (getattr(original, "__module__", None) or "").split(".", 1)[0]
    version = getattr(sys.modules.get(package), "__version__", None) if package else None
    where = f"renamed in {package} {version}?" if version else "renamed?"
    return f"{'; '.join(renamed)} ({where})"


def signature_mismatch(original: Callable[..., Any], kernel_forward: Callable[..., Any]) -> str | None:
    """Why ``kernel_forward`` cannot replace ``original`` (both ``forward(self, ...)``), or None.

    Parameter names, kinds and default values must agree: callers pass arguments by name and rely
    on the defaults (``scale=1.0`` replacing ``scale=2.0`` would change every call that omits it).
    A kernel without a Python signature (a builtin) cannot be checked, so it is refused.
    """
    try:
        ours = _parameters(kernel_forward, drop_self=True)
    except (TypeError, ValueError):
        return (f"the kernel's forward {kernel_forward!r} has no Python signature to check against the layer's; "
                "wrap it in a Python function forward(self, ...)")
    try:
        theirs = _parameters(original, drop_self=True)
    except (TypeError, ValueError):
        return f"the layer's forward {original!r} has no Python signature to check the kernel against"
    if [(p.name, p.kind) for p in ours] != [(p.name, p.kind) for p in theirs]:
        fmt = lambda ps: ", ".join(p.name for p in ps)  # noqa: E731
        diff = f"forward signature ({fmt(ours)}) differs from the layer's ({fmt(theirs)})"
        cause = _renamed_parameters(ours, theirs, original)
        return diff if cause is None else f"{cause}; {diff}"
    for mine, layer in zip(ours, theirs):
        if not _same_default(mine.default, layer.default):
            show = lambda d: "no default" if d is inspect.Parameter.empty else f"{d!r}"  # noqa: E731
            return (f"forward parameter {mine.name!r} defaults to {show(mine.default)}, the layer's to "
                    f"{show(layer.default)}: calls that omit it would compute something else")
    return None
