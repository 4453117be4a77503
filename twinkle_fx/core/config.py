"""``register_kernels(config)``: one dict for layer kernels, layer bindings and function kernels.

The whole config is validated (and every source built) before anything is registered, so a bad
entry leaves the registry as it was. The config is never mutated.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .modes import format_mode
from .registration import (
    FUNCTION_KEYWORDS,
    LAYER_KEYWORDS,
    check_kernel_name,
    function_registration,
    layer_registration,
    resolve_class,
)
from .registry import FunctionRegistration, LayerRegistration, get_registry

__all__ = ["register_kernels"]

_TOP_KEYS = ("layers", "external_layers", "functions")


def _entries(where: str, value: Any) -> list[tuple[str, Mapping]]:
    items = [value] if isinstance(value, Mapping) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(e, Mapping) for e in items):
        raise ValueError(f"{where}: expected a dict of keyword arguments or a list of them, got {type(value).__name__}.")
    if not items:
        # an entry that registers nothing is a mistake (a list meant to be filled), not a choice
        raise ValueError(f"{where}: an empty list registers nothing; give one dict of keyword arguments per "
                         "device and mode, or drop the entry.")
    return [(f"{where}[{i}]" if len(items) > 1 else where, entry) for i, entry in enumerate(items)]


def _refuse_duplicates(entries: list[tuple[str, Any, str]], what: str) -> None:
    """Two entries for one key (``(where, key, description)``) would leave the later one in force
    silently: name both."""
    seen: dict[Any, str] = {}
    for where, key, description in entries:
        if key in seen:
            raise ValueError(f"{seen[key]} and {where} both register {description}; {what}")
        seen[key] = where


def _section(config: Mapping, key: str) -> Mapping:
    value = config.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        example = {"layers": "{'MyKernel': {'layer': MyKernel, 'device': 'cuda'}}",
                   "external_layers": "{Qwen2MLP: 'MyKernel'}",
                   "functions": "{'add': {'target_module': 'my_pkg.math_ops', 'func_impl': fast_add}}"}[key]
        raise ValueError(f"config[{key!r}] must be a dict such as {example}, got {type(value).__name__} {value!r:.60}.")
    return value


def _check_keys(where: str, entry: Mapping, allowed: tuple[str, ...]) -> None:
    unknown = [k for k in entry if k not in allowed]
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r}; valid keys: {', '.join(allowed)}.")


def _function_target(where: str, key: Any, target_module: Any) -> tuple[str, str]:
    """(target_module, func_name) of a ``functions`` entry.

    The documented form keys the entry by the function's name and names its module in the entry
    (``{"add": {"target_module": "my_pkg.math_ops", ...}}``); a dotted key
    (``{"my_pkg.math_ops.add": {...}}``) is a shorthand for the same.
    """
    if not isinstance(key, str) or not key or key.startswith(".") or key.endswith("."):
        raise ValueError(f"{where}: the key must be a function name (with 'target_module' in the entry) "
                         f"or 'module.func_name', got {key!r}.")
    if target_module is None:
        if "." not in key:
            raise ValueError(f"{where}: no 'target_module'; add \"target_module\": \"my_pkg.my_module\" to the "
                             f"entry, or key it as 'my_pkg.my_module.{key}'.")
        module, _, name = key.rpartition(".")
        return module, name
    if not isinstance(target_module, str) or not target_module:
        raise ValueError(f"{where}: target_module must be a dotted module path, got {target_module!r}.")
    if "." in key:
        module, _, name = key.rpartition(".")
        if module != target_module:
            raise ValueError(f"{where}: the key names module {module!r} but target_module is {target_module!r}; "
                             f"key the entry by the function name {name!r}, or drop target_module.")
        return module, name
    return target_module, key


def register_kernels(config: Mapping[str, Any]) -> None:
    """Register layer kernels, layer bindings and function kernels from one config.

    Each entry is the keyword arguments of :func:`register_layer_kernel` /
    :func:`register_function_kernel` (a dict, or a list of dicts for several devices/modes).
    ``functions`` is keyed by the function's name, with ``target_module`` in the entry; a dotted
    key ``"module.func_name"`` is accepted as a shorthand (a key and a ``target_module`` that
    disagree are an error).

    Examples:
        >>> from my_pkg.fast_ops import fast_add   # examples/my_pkg: a Triton add
        >>> register_kernels({
        ...     "layers": {"MyAwesomeMLP": [
        ...         {"repo_path": "/path/to/local/repo", "package_name": "my_kernels",
        ...          "layer_name": "Qwen2MLPTrainingKernel", "device": "cuda", "mode": "train"}]},
        ...     "external_layers": {"transformers.models.qwen2.modeling_qwen2.Qwen2MLP": "MyAwesomeMLP"},
        ...     "functions": {"add": {"target_module": "my_pkg.math_ops", "func_impl": fast_add, "device": "cuda"}},
        ... })

    Entries of one config must not contradict each other: two entries for the same kernel (or
    function), device and mode, or one class bound to two kernel names, are refused (a ValueError
    naming both) rather than letting the later one win silently; so is an empty list, which
    registers nothing. Registering again in a later call replaces the earlier registration (logged).

    Raises:
        ValueError / TypeError: naming the entry and the key; nothing is registered then.
    """
    if not isinstance(config, Mapping):
        raise TypeError(f"register_kernels expects a dict, got {type(config).__name__}.")
    _check_keys("config", config, _TOP_KEYS)

    layers: list[tuple[str, LayerRegistration]] = []
    for kernel_name, value in dict(_section(config, "layers")).items():
        check_kernel_name(f"layers[{kernel_name!r}]", kernel_name)
        for where, entry in _entries(f"layers[{kernel_name!r}]", value):
            arguments = LAYER_KEYWORDS.complete(where, entry, kernel_name=kernel_name)
            layers.append((where, layer_registration(arguments, where=where, flag_prefix=f"{where}: ")))
    _refuse_duplicates([(where, (r.kernel_name, r.device, r.mode), f"{r.kernel_name!r} for {r.device} "
                         f"({format_mode(r.mode)})") for where, r in layers],
                       "keep one, or give them different devices or modes.")

    bindings: list[tuple[str, type, str]] = []
    for cls, kernel_name in dict(_section(config, "external_layers")).items():
        where = f"external_layers[{cls!r}]"
        check_kernel_name(where, kernel_name)
        try:
            bindings.append((where, resolve_class(cls), kernel_name))
        except TypeError as e:
            raise TypeError(f"{where}: {e}") from e
    bound: dict[type, tuple[str, str]] = {}
    for where, klass, kernel_name in bindings:
        first = bound.setdefault(klass, (where, kernel_name))
        if first[1] != kernel_name:
            raise ValueError(f"{first[0]} and {where} bind {klass.__qualname__} to two kernel names ({first[1]!r} "
                             f"and {kernel_name!r}); a class is served by one kernel name: keep one entry.")

    functions: list[tuple[str, FunctionRegistration]] = []
    for key, value in dict(_section(config, "functions")).items():
        for where, entry in _entries(f"functions[{key!r}]", value):
            arguments = FUNCTION_KEYWORDS.complete(where, entry)
            arguments["target_module"], arguments["func_name"] = _function_target(where, key, entry.get("target_module"))
            functions.append((where, function_registration(arguments, where=where, flag_prefix=f"{where}: ")))
    _refuse_duplicates([(where, (r.target, r.device, r.mode), f"a kernel for {r.target} on {r.device} "
                         f"({format_mode(r.mode)})") for where, r in functions],
                       "keep one, or give them different devices or modes.")

    registry = get_registry()
    for _, registration in layers:
        registry.add_layer(registration)
    for _, cls, kernel_name in bindings:
        registry.bind_layer(cls, kernel_name)
    for _, registration in functions:
        registry.add_function(registration)
