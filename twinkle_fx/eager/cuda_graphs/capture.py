"""What a CUDA-graph capture of a forward needs, shared by the per-block graphs
(:mod:`twinkle_fx.eager.cuda_graphs.layer_graphs`) and the whole-model decode graphs (:mod:`twinkle_fx.eager.cuda_graphs.model_graphs`):
a hashable spec of a call's arguments with the tensors taken out, the check that a transformers KV
cache can be updated by a replay, the checks of what a graph would not see (hooks, moved
parameters, dropout).
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import torch

from ...core.torch_internals import dropout_classes, global_module_hooks_set, module_hook_dicts

TENSOR = object()  # placeholder of a tensor in an argument spec
data_ptr = torch.Tensor.data_ptr


class Decline(Exception):
    """This call cannot be graphed; the message is the reason (counted and logged once)."""


class KVCacheTag:
    """Tag of a KV cache in an argument spec: ``(KVCacheTag, id(cache))`` (the object is looked up by id)."""


class MappingTag:
    """Tag of a dict in a spec: ``(MappingTag, (type, keys, value specs))``. transformers passes the
    attention masks of a decode step as a dict (one per layer type) and returns ``ModelOutput``
    dataclasses (dicts whose fields are the keys), which are rebuilt from the keys."""


def is_cache(value: Any) -> bool:
    cache_utils = sys.modules.get("transformers.cache_utils")  # never imports transformers
    return cache_utils is not None and isinstance(value, cache_utils.Cache)


def spec_of(value: Any, tensors: list[torch.Tensor], caches: dict[int, Any] | None = None) -> Any:
    """A hashable description of ``value`` with its tensors replaced by ``TENSOR`` (appended to
    ``tensors``) and its transformers KV caches by ``(KVCacheTag, id)`` (added to ``caches``)."""
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return TENSOR
    kind = type(value)
    if value is None or kind in (bool, int, float, str):
        return (kind, value)
    if kind in (tuple, list):
        return (kind, tuple(spec_of(v, tensors, caches) for v in value))
    if caches is not None and is_cache(value):
        caches[id(value)] = value
        return (KVCacheTag, id(value))
    if isinstance(value, dict) and (kind is dict or dataclasses.is_dataclass(kind)):
        return (MappingTag, (kind, tuple(value), tuple(spec_of(v, tensors, caches) for v in value.values())))
    raise Decline(f"an argument of type {kind.__qualname__} (only tensors, plain values, tuples, lists, dicts, "
                  "transformers outputs and a transformers StaticCache are graphed)")


def rebuild(spec: Any, tensors, caches: dict[int, Any] | None = None) -> Any:
    if spec is TENSOR:
        return next(tensors)
    kind, value = spec
    if kind is tuple or kind is list:
        return kind(rebuild(s, tensors, caches) for s in value)
    if kind is KVCacheTag:
        return caches[value]
    if kind is MappingTag:
        cls, keys, specs = value
        values = [rebuild(s, tensors, caches) for s in specs]
        return cls(**dict(zip(keys, values))) if cls is not dict else dict(zip(keys, values))
    return value


def flatten_call(args: tuple, kwargs: dict, caches: dict[int, Any]) -> tuple[list[torch.Tensor], tuple]:
    tensors: list[torch.Tensor] = []
    spec = (tuple(spec_of(a, tensors, caches) for a in args),
            tuple((k, spec_of(v, tensors, caches)) for k, v in kwargs.items()))
    return tensors, spec


def rebuild_call(spec: tuple, tensors, caches: dict[int, Any] | None = None) -> tuple[tuple, dict]:
    it = iter(tensors)
    args = tuple(rebuild(s, it, caches) for s in spec[0])
    kwargs = {k: rebuild(s, it, caches) for k, s in spec[1]}
    return args, kwargs


def static_cache_state(cache: Any) -> tuple[tuple[int, ...], str | None]:
    """``(data pointers, None)`` when a CUDA graph may update ``cache`` (a transformers KV cache) in
    place, else ``((), reason)``.

    Graphed: transformers' ``StaticCache`` (or a subclass keeping ``Cache.update``) whose layers are
    all ``StaticLayer`` (full attention), initialised, not offloaded. ``StaticLayer.update`` (the same
    in transformers 5.17 and 5.22) writes the new keys and values with ``index_copy_`` at
    ``arange(n) + cumulative_length`` and advances ``cumulative_length`` with ``add_``: all three
    tensors are allocated once (at the first update) and only changed in place on the device, with
    no host-side value (no ``.item()``, no Python int), so a replay does exactly what the eager
    update does. ``reset()`` zeroes them in place (graphs stay valid); ``reorder_cache`` (beam
    search), offloading or ``.to()`` replace them: the pointers returned here then differ from the
    recorded ones and the graphs are dropped.

    Declined: ``DynamicCache`` (and any cache with dynamic layers: quantized, the default of
    ``generate``): its update grows the keys and values with ``torch.cat``, new tensors of a new
    shape every step, which no graph can replay; ``StaticSlidingWindowLayer`` (sliding-window and
    chunked attention layers of a StaticCache): its update branches on a Python int
    (``cumulative_length_int``) that a replay would not advance; other layer kinds (linear
    attention, indexer) and caches with their own ``update``.

    Examples:
        >>> import transformers, torch
        >>> config = transformers.Qwen2Config(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        ...                                   num_attention_heads=2, num_key_value_heads=1, vocab_size=32)
        >>> static_cache_state(transformers.DynamicCache(config=config))[1]  # doctest: +ELLIPSIS
        'a DynamicCache: its update grows the keys and values with torch.cat...'
        >>> cache = transformers.StaticCache(config=config, max_cache_len=8)
        >>> cache.early_initialization(batch_size=1, num_heads=1, head_dim=8, dtype=torch.float32, device="cpu")
        >>> len(static_cache_state(cache)[0]), static_cache_state(cache)[1]
        (3, None)
    """
    from transformers import cache_utils

    kind = type(cache).__name__
    layers = getattr(cache, "layers", None)
    if isinstance(cache, cache_utils.DynamicCache) or any(isinstance(x, cache_utils.DynamicLayer) for x in layers or ()):
        return (), (f"a {kind}: its update grows the keys and values with torch.cat (new tensors of a new shape "
                    "every step), which a CUDA graph cannot replay; use a StaticCache (e.g. "
                    "generate(..., cache_implementation=\"static\"))")
    if not isinstance(cache, cache_utils.StaticCache) or type(cache).update is not cache_utils.Cache.update:
        return (), (f"a cache of type {kind} (only transformers' StaticCache with full-attention layers is graphed: its update "
                    "only writes its own tensors in place)")
    if getattr(cache, "offloading", False):
        return (), f"a {kind} with offloading=True (its update moves layers between host and device)"
    if not layers:
        return (), f"a {kind} without layers"
    for index, layer in enumerate(layers):  # what can never be graphed first, then what the prefill will fix
        if type(layer) is not cache_utils.StaticLayer:
            if isinstance(layer, cache_utils.StaticSlidingWindowLayer):
                return (), (f"a {kind} with sliding-window layers ({type(layer).__name__} at layer {index}: its "
                            "update branches on a Python int, cumulative_length_int, that a graph replay would not "
                            "advance)")
            return (), (f"a {kind} with a {type(layer).__name__} at layer {index} (only StaticLayer, full attention, "
                        "updates in place without host-side state)")
    ptrs: list[int] = []
    for layer in layers:
        if not layer.is_initialized:
            return (), (f"a {kind} not initialised yet (its first update allocates its tensors; that pass runs "
                        "eagerly)")
        ptrs += (data_ptr(layer.keys), data_ptr(layer.values), data_ptr(layer.cumulative_length))
    return tuple(ptrs), None


def tensor_meta(t: torch.Tensor) -> tuple:
    return (t.shape, t.stride(), t.dtype, t.device, t.requires_grad)


def block_modules(model: torch.nn.Module) -> tuple[list[tuple[str, torch.nn.Module]], str | None]:
    """The model's repeated blocks (modules of the classes ``model._no_split_modules`` names), in
    model order, or ``([], reason)``."""
    names = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    if not names:
        return [], (f"{type(model).__name__} names no repeated block (transformers' _no_split_modules); "
                    "CUDA graphs are made per decoder layer")
    blocks = [(path, m) for path, m in model.named_modules() if type(m).__name__ in names]
    if not blocks:
        return [], f"no module of {type(model).__name__} is one of its blocks {sorted(names)}"
    return blocks, None


def dropout_reason(module: torch.nn.Module) -> str | None:
    for path, sub in module.named_modules():
        p = sub.p if isinstance(sub, dropout_classes()) else getattr(sub, "attention_dropout", 0.0)
        if isinstance(p, (int, float)) and p > 0:
            return f"dropout p={p} in {path or type(module).__name__} while training"
    return None


def global_hooks() -> bool:
    return global_module_hooks_set()


def hooked(submodules: list[torch.nn.Module]) -> bool:
    return any(hooks for m in submodules for hooks in module_hook_dicts(m))


def fixed_ptrs(modules: list[torch.nn.Module]) -> tuple:
    return tuple(data_ptr(t) for m in modules for d in (m._parameters, m._buffers) for t in d.values() if t is not None)
