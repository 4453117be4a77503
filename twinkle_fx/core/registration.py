"""Public registration functions: they validate their arguments and write to the active registry.

The signatures of :func:`register_layer_kernel` and :func:`register_function_kernel` are the one
spec of the registration keywords (names, types, defaults): :data:`LAYER_KEYWORDS` and
:data:`FUNCTION_KEYWORDS` read them, and :func:`~twinkle_fx.core.config.register_kernels` checks and
completes its entries with them, then builds through the same :func:`layer_registration` /
:func:`function_registration` the single calls use.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from .devices import parse_device
from .errors import check_flag
from .modes import Mode, parse_mode
from .registry import FunctionRegistration, LayerRegistration, get_registry
from .sources import KernelSource, make_source

__all__ = ["register_layer_kernel", "register_external_layer", "register_function_kernel", "resolve_class",
           "KeywordSpec", "LAYER_KEYWORDS", "FUNCTION_KEYWORDS", "layer_registration", "function_registration"]


def _registration_mode(mode: Any) -> Mode:
    return Mode.ANY if mode is None else parse_mode(mode, allow_fallback=True)


def _device_and_mode(where: str, arguments: Mapping[str, Any]) -> tuple[str, Mode]:
    """The registration's device and mode; a bad one names ``where`` (in a config: the entry)."""
    try:
        return parse_device(arguments["device"], allow_any=True), _registration_mode(arguments["mode"])
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from e


def check_kernel_name(where: str, kernel_name: Any) -> str:
    if not isinstance(kernel_name, str) or not kernel_name.strip():
        raise ValueError(f"{where}: the kernel name must be a non-empty string, got {kernel_name!r}.")
    return kernel_name


def check_function_target(where: str, target_module: Any, func_name: Any) -> None:
    """``target_module`` a dotted module path and ``func_name`` one identifier (no dots: the module
    part belongs in target_module)."""
    if not isinstance(target_module, str) or not all(part.isidentifier() for part in target_module.split(".")):
        raise ValueError(f"{where}: target_module must be a dotted module path such as 'my_pkg.math_ops', "
                         f"got {target_module!r}.")
    if not isinstance(func_name, str) or not func_name.isidentifier():
        hint = ""
        if isinstance(func_name, str) and "." in func_name:
            module, _, name = func_name.rpartition(".")
            hint = f" (for {target_module}.{func_name} pass target_module={target_module + '.' + module!r}, func_name={name!r})"
        raise ValueError(f"{where}: func_name must be the function's name in target_module, got {func_name!r}{hint}.")


# The source keywords whose public names differ between layer and function kernels: the
# implementation, the attribute a repo is read for, and the keyword that attribute defaults to.
_SOURCE_NAMES = {True: ("layer", "layer_name", "kernel_name"), False: ("func_impl", "kernel_func_name", "func_name")}


def _source(arguments: Mapping[str, Any], *, what: str, is_layer: bool) -> KernelSource:
    """The kernel source named by all of a registration function's keywords: the one place that
    hands the source keywords of both signatures on to :func:`~twinkle_fx.core.sources.make_source`."""
    impl, attr, attr_default = _SOURCE_NAMES[is_layer]
    a = arguments
    return make_source(
        what=what, is_layer=is_layer, impl=a[impl], repo=a["repo"], repo_id=a["repo_id"], repo_path=a["repo_path"],
        package_name=a["package_name"], attr=a[attr] or a[attr_default], revision=a["revision"],
        version=a["version"], trust_remote_code=a["trust_remote_code"], impl_arg=impl,
    )


def register_layer_kernel(
    *,
    kernel_name: str,
    layer: Any = None,
    repo: Any = None,
    repo_id: str | None = None,
    repo_path: str | Path | None = None,
    package_name: str | None = None,
    layer_name: str | None = None,
    revision: str | None = None,
    version: int | str | None = None,
    device: str | None = None,
    mode: Any = None,
    trust_remote_code: bool | list[str] = False,
    binds_by_tag: bool = True,
) -> LayerRegistration:
    """Register a layer kernel under ``kernel_name`` for one device and mode.

    Exactly one source: ``layer`` (an nn.Module class, instance or ``forward(self, ...)`` function),
    ``repo`` (an object whose ``load()`` returns one), ``repo_path`` + ``package_name`` +
    ``layer_name`` (a local kernel repo), or ``repo_id`` + ``layer_name`` (+ ``revision`` or
    ``version``) on the Hugging Face Hub. Loading is lazy: nothing is imported or downloaded here.

    Args:
        kernel_name (`str`): the name layers are bound to (see :func:`register_external_layer`).
        layer_name (`str`, *optional*): the layer's attribute name in a repo (``repo_path`` or
            ``repo_id``); defaults to ``kernel_name``, the Hugging Face ``kernels`` convention.
        device (`str`, *optional*): "cuda", "cpu", "rocm", "xpu", "mps"/"metal", "npu"; `None` serves any device.
        mode (*optional*): "train", "inference", "compile", "train+compile"; `None` serves any mode.
        trust_remote_code (`bool | list[str]`, defaults to `False`): passed to the `kernels` loader
            for repos outside the organisations it trusts.
        binds_by_tag (`bool`, defaults to `True`): also serve classes that carry transformers'
            ``kernel_layer_name`` tag equal to ``kernel_name`` (the Hugging Face convention); `False`
            serves only classes bound with :func:`register_external_layer`.

    Returns:
        The :class:`LayerRegistration`. Registering the same name, device and mode again replaces it (logged).

    Raises:
        ValueError: unknown mode or device, none or several sources, both revision and version.

    Examples:
        >>> register_layer_kernel(kernel_name="MyAwesomeMLP", repo_path="/path/to/local/repo",
        ...                       package_name="my_kernels", layer_name="Qwen2MLPTrainingKernel",
        ...                       device="cuda", mode="train")  # lazy: the repo is read when a model needs it
        LayerRegistration(kernel_name='MyAwesomeMLP', device='cuda', mode=<Mode.TRAINING: 2>, source=<LocalRepoSource ...>, ...)
    """
    registration = layer_registration(dict(locals()), where="register_layer_kernel",
                                      what=f"layer kernel {kernel_name!r}")
    get_registry().add_layer(registration)
    return registration


def layer_registration(arguments: Mapping[str, Any], *, where: str, what: str | None = None,
                       flag_prefix: str = "") -> LayerRegistration:
    """Validate and build (not add) a :class:`LayerRegistration` from all of
    :func:`register_layer_kernel`'s keywords (``LAYER_KEYWORDS.complete`` fills the defaults)."""
    a = arguments
    check_kernel_name(where, a["kernel_name"])
    device, mode = _device_and_mode(where, a)
    return LayerRegistration(
        kernel_name=a["kernel_name"],
        device=device,
        mode=mode,
        source=_source(a, what=what or where, is_layer=True),
        binds_by_tag=check_flag(f"{flag_prefix}binds_by_tag", a["binds_by_tag"]),
    )


def resolve_class(cls: type | str) -> type:
    """A class, or one named by a dotted path ("transformers.models.qwen2.modeling_qwen2.Qwen2MLP")."""
    found: Any = cls
    if isinstance(cls, str) and "." in cls:
        module_name, _, attr = cls.rpartition(".")
        try:
            found = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"Cannot resolve layer class {cls!r}: {type(e).__name__}: {e}") from e
    if isinstance(found, type) and issubclass(found, torch.nn.Module):
        return found
    raise TypeError(f"Expected an nn.Module class or a dotted path to one, got {cls!r}"
                    + (f" ({found!r} is no nn.Module class)." if found is not cls else "."))


def register_external_layer(cls: type | str, kernel_name: str, *, within: Sequence[type | str] | None = None) -> None:
    """Bind a layer class (one you cannot decorate, e.g. from transformers) to ``kernel_name``.

    Instances of ``cls`` and of its subclasses are swapped by ``kernelize_model`` and matched by the
    ``twinkle`` backend. Classes with a ``kernel_layer_name`` attribute (Hugging Face
    ``@use_kernel_forward_from_hub``) are bound implicitly; an explicit binding wins.

    ``within`` limits the binding to instances whose parent module is one of those classes (or a
    subclass): ``torch.nn.LayerNorm`` within StarCoder2's decoder layer and model, not in every model.
    The parent is the module holding the instance as a submodule: ``kernelize_model`` reads it from the
    module tree, ``backend="twinkle"`` from Dynamo's module stack (the compiled root's own parent is
    unknown, so a limited binding never swaps the root).

    Examples:
        >>> from transformers.models.qwen2.modeling_qwen2 import Qwen2MLP
        >>> register_external_layer(Qwen2MLP, "MyAwesomeMLP")
    """
    klass = resolve_class(cls)
    check_kernel_name(f"register_external_layer({klass.__qualname__})", kernel_name)
    if within is not None:
        if isinstance(within, (str, type)) or not within:
            raise TypeError(f"register_external_layer({klass.__qualname__}): within={within!r}; pass a non-empty "
                            "sequence of parent classes, e.g. within=(MyDecoderLayer,).")
        within = tuple(resolve_class(c) for c in within)
    get_registry().bind_layer(klass, kernel_name, within)


def register_function_kernel(
    *,
    func_name: str,
    target_module: str,
    func_impl: Any = None,
    repo: Any = None,
    repo_id: str | None = None,
    repo_path: str | Path | None = None,
    package_name: str | None = None,
    kernel_func_name: str | None = None,
    revision: str | None = None,
    version: int | str | None = None,
    device: str | None = None,
    mode: Any = None,
    trust_remote_code: bool | list[str] = False,
    match_anywhere: bool = False,
) -> FunctionRegistration:
    """Register a kernel that replaces the function ``target_module.func_name``.

    Exactly one source: ``func_impl`` (a callable), ``repo`` (an object whose ``load()`` returns
    the kernel), ``repo_path`` + ``package_name`` (a local repo) or ``repo_id`` (+ ``revision`` or
    ``version``) on the Hub. From a repo the attribute ``kernel_func_name`` (default: ``func_name``)
    is taken. Nothing is imported here: :func:`apply_function_kernel` checks the target exists.

    Args:
        func_name (`str`): the function's name in ``target_module``.
        target_module (`str`): dotted module path, e.g. ``"my_pkg.math_ops"``.
        device, mode: as in :func:`register_layer_kernel`.
        match_anywhere (`bool`, defaults to `False`): under ``backend="twinkle"``, calls of the function
            and copies of it in other modules (a function of the same name computing the same thing,
            such as each transformers modeling file's ``apply_rotary_pos_emb``) are swapped; `True` also
            swaps the bare computation wherever a model writes it. Powerful for patterns of several
            ops, dangerous for one op: a registered ``add(x, y)`` would take every residual add.

    Examples:
        >>> from my_pkg.fast_ops import fast_add   # examples/my_pkg: a Triton add
        >>> registration = register_function_kernel(func_name="add", target_module="my_pkg.math_ops",
        ...                                         func_impl=fast_add, device="cuda", mode="inference")
        >>> registration.target
        'my_pkg.math_ops.add'
    """
    registration = function_registration(dict(locals()), where="register_function_kernel",
                                         what=f"function kernel for {target_module}.{func_name}")
    get_registry().add_function(registration)
    return registration


def function_registration(arguments: Mapping[str, Any], *, where: str, what: str | None = None,
                          flag_prefix: str = "") -> FunctionRegistration:
    """Validate and build (not add) a :class:`FunctionRegistration` from all of
    :func:`register_function_kernel`'s keywords (``FUNCTION_KEYWORDS.complete`` fills the defaults)."""
    a = arguments
    check_function_target(where, a["target_module"], a["func_name"])
    match_anywhere = check_flag(f"{flag_prefix}match_anywhere", a["match_anywhere"])
    device, mode = _device_and_mode(where, a)
    return FunctionRegistration(
        target_module=a["target_module"],
        func_name=a["func_name"],
        device=device,
        mode=mode,
        source=_source(a, what=what or where, is_layer=False),
        match_anywhere=match_anywhere,
    )


class KeywordSpec:
    """The keywords of a registration function, read from its signature: the one place they are
    named and given defaults. ``register_kernels`` entries are checked against it.

    Examples:
        >>> LAYER_KEYWORDS.complete("layers['MyMLP']", {"layer": object, "device": "cuda"}, kernel_name="MyMLP")["mode"] is None
        True
        >>> LAYER_KEYWORDS.complete("layers['MyMLP']", {"devcie": "cuda"}, kernel_name="MyMLP")
        Traceback (most recent call last):
        ...
        ValueError: layers['MyMLP']: unknown key 'devcie'; valid keys: layer, repo, repo_id, ...
    """

    def __init__(self, function: Callable[..., Any], *, keyed_by: str) -> None:
        self.function = function
        self.keyed_by = keyed_by  # the keyword a register_kernels entry takes from its key
        parameters = inspect.signature(function).parameters.values()
        self.defaults = {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}
        self.entry_keys = tuple(p.name for p in parameters if p.name != keyed_by)

    def complete(self, where: str, entry: Mapping[str, Any], **fixed: Any) -> dict[str, Any]:
        """``entry`` with every keyword (defaults filled in, ``fixed`` on top).

        Raises:
            ValueError: an unknown key, naming it, ``where`` and the valid keys.
        """
        unknown = [k for k in entry if k not in self.entry_keys]
        if unknown:
            raise ValueError(f"{where}: unknown key {unknown[0]!r}; valid keys: {', '.join(self.entry_keys)}.")
        return {**self.defaults, **entry, **fixed}

    def __repr__(self) -> str:
        return f"KeywordSpec({self.function.__name__}: {', '.join(self.entry_keys)})"


LAYER_KEYWORDS = KeywordSpec(register_layer_kernel, keyed_by="kernel_name")
FUNCTION_KEYWORDS = KeywordSpec(register_function_kernel, keyed_by="func_name")
