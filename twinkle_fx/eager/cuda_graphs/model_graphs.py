"""One CUDA graph per decode step: the model's whole forward, for inference with a StaticCache.

``kernelize_model(model, mode="inference", cuda_graphs=True)`` graphs each decoder layer
(:mod:`twinkle_fx.eager.cuda_graphs.layer_graphs`). A decode step at batch 1 launches about fifteen kernels per
layer that take a few microseconds each on the device; per-layer graphs leave the host one replay
per layer plus everything between the layers (embedding, rotary tables, final norm, LM head) and
the Python of the layer calls, so the host, not the device, sets the pace. A decode step with a
transformers ``StaticCache`` has the same shapes every step and touches the cache only in place,
so the whole forward can be one graph: the host then copies the step's few small inputs (token
ids, positions, the 4-D mask ``generate`` builds for a static cache) and replays once.

What is graphed: a call of the model's own forward (the module ``kernelize_model`` was given) under
``torch.no_grad`` whose arguments include a StaticCache that a replay can update
(:func:`~twinkle_fx.eager.cuda_graphs.capture.static_cache_state`: initialised, full-attention layers).
The signature is the argument spec (shapes, strides, dtypes, plain values), and the cache by
identity and memory: ``generate`` makes a new cache per call, so each call records its own graph
(the first signature of a shape runs eagerly once first: Triton compiles, cuBLAS initialises) and
the graphs of caches that no longer exist are dropped. Anything else (training, the prefill, which
allocates the cache, a ``DynamicCache``, hooks, autocast) runs the forward as it is, where the
per-layer graphs still serve. A capture that fails (a host sync inside the forward) is logged as a
WARNING with its cause once; that signature then runs through the per-layer graphs.

What a caller must know: the outputs (the logits) are the graph's static tensors, overwritten by the
next decode step, as with ``torch.compile(mode="reduce-overhead")``; ``generate`` copies what it
keeps, a hand-written loop that keeps logits across steps must clone them.
Each replay checks that the parameters and buffers of the modules the model had when it was
kernelized are where they were (a moved one records again) and that none has hooks; a submodule
replaced after ``kernelize_model`` is not seen by a graph recorded before: call ``kernelize_model``
again after changing the model's structure.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any

import torch

from ...core.torch_internals import module_hook_dicts
from .capture import (TENSOR, Decline, KVCacheTag, MappingTag, data_ptr, dropout_reason, fixed_ptrs,
                            flatten_call, rebuild, rebuild_call, spec_of, static_cache_state, tensor_meta)

logger = logging.getLogger(__name__)

__all__ = ["ModelGraphs", "MAX_MODEL_GRAPHS"]

# Whole-forward graphs kept per model (one per live StaticCache and step shape); each holds its static
# inputs and outputs, the activations are the shared pool's
MAX_MODEL_GRAPHS = 8


class _Entry:
    """The graph of one decode-step signature and the tensors it reads and writes."""

    def __init__(self, graph: torch.cuda.CUDAGraph, static_in: list[torch.Tensor], out_spec: Any,
                 static_out: list[torch.Tensor], caches: list[weakref.ref], params: tuple) -> None:
        self.graph = graph
        self.static_in = static_in
        self.in_ptrs = [data_ptr(s) for s in static_in]
        self.out_spec = out_spec
        self.static_out = static_out
        self.caches = caches
        self.params = params

    def alive(self) -> bool:
        return all(ref() is not None for ref in self.caches)


class ModelGraphs:
    """The whole-forward decode graphs of one model, sharing the memory pool and the status of the
    model's :class:`~twinkle_fx.eager.cuda_graphs.layer_graphs.GraphSet` (whose per-layer graphs stand aside while a
    whole forward is warmed up or captured)."""

    def __init__(self, model: torch.nn.Module, graphs: Any) -> None:
        self.graphs = graphs
        self.entries: dict[tuple, _Entry] = {}
        self.warm: set[tuple] = set()  # call shapes (signatures without the caches) that ran once eagerly
        self.failed: set[tuple] = set()
        modules = list(model.modules())
        self.modules = modules
        # the hook dicts of every submodule, read at each call: a graph would not call a hook
        self.hook_dicts = [d for m in modules for d in module_hook_dicts(m, backward=False)]

    def call(self, fn: Callable[..., Any], module: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
        if torch.is_grad_enabled() or self.graphs.inside_model_graph:
            return fn(module, *args, **kwargs)
        try:
            caches: dict[int, Any] = {}
            tensors, in_spec = flatten_call(args, kwargs, caches)
            if not caches:
                return fn(module, *args, **kwargs)  # not a decode step with a KV cache: the layers' graphs
            key = self._key(module, tensors, in_spec, caches)
            if any(self.hook_dicts):
                raise Decline("forward hooks on a module of the model (a graph would not call them)")
            entry = self.entries.get(key)
            if entry is None:
                if key in self.failed:
                    return fn(module, *args, **kwargs)
                self._check_recordable(module)
                shapes = _without_caches(key)
                if shapes not in self.warm:  # the first call of a shape: Triton compiles, cuBLAS initialises
                    self.warm.add(shapes)
                    with self.graphs.model_graph_scope():
                        return fn(module, *args, **kwargs)
                entry = self._record(key, fn, module, tensors, in_spec, caches)
                if entry is None:
                    return fn(module, *args, **kwargs)
            elif fixed_ptrs(self.modules) != entry.params:
                del self.entries[key]
                raise Decline("a parameter or buffer of the model moved to other memory")
        except Decline as reason:
            self.graphs.status.model_eager[str(reason)] += 1
            return fn(module, *args, **kwargs)
        for t, s, ptr in zip(tensors, entry.static_in, entry.in_ptrs):
            if data_ptr(t) != ptr:
                s.copy_(t)
        entry.graph.replay()
        self.graphs.status.replays["model"] += 1
        return rebuild(entry.out_spec, iter(entry.static_out), caches)

    def _key(self, module: torch.nn.Module, tensors: list[torch.Tensor], in_spec: tuple,
             caches: dict[int, Any]) -> tuple:
        reason = self.graphs._static_reason(module)
        if reason is not None:
            raise Decline(reason)
        ptrs: tuple[int, ...] = ()
        for cache in caches.values():
            cache_ptrs, reason = static_cache_state(cache)
            if reason is not None:
                raise Decline(reason)
            ptrs += cache_ptrs
        return (in_spec, tuple(map(tensor_meta, tensors)), ptrs)

    def _check_recordable(self, module: torch.nn.Module) -> None:
        if module.training and (reason := dropout_reason(module)) is not None:
            raise Decline(reason)
        for stale in [k for k, e in self.entries.items() if not e.alive()]:  # their caches are gone
            del self.entries[stale]
        if len(self.entries) >= MAX_MODEL_GRAPHS:
            raise Decline(f"more than {MAX_MODEL_GRAPHS} live decode signatures (caches or shapes)")

    def _record(self, key: tuple, fn: Callable[..., Any], module: torch.nn.Module, tensors: list[torch.Tensor],
                in_spec: tuple, caches: dict[int, Any]) -> _Entry | None:
        """The graph of a new signature, captured on copies of this call's inputs (the call then
        replays it); None when the capture fails (logged once; the signature is not tried again)."""
        static_in = []
        for t in tensors:
            static = torch.empty_like(t, memory_format=torch.preserve_format)  # dense: an expanded mask is copied
            static.copy_(t)
            static_in.append(static)
        args, kwargs = rebuild_call(in_spec, static_in, caches)
        graph = torch.cuda.CUDAGraph()
        try:
            with self.graphs.model_graph_scope(), self.graphs.capturing(graph):
                out = fn(module, *args, **kwargs)
            outs: list[torch.Tensor] = []
            out_caches: dict[int, Any] = {}
            out_spec = spec_of(out, outs, out_caches)
            if not out_caches.keys() <= caches.keys():
                raise ValueError("the forward returned a KV cache it was not given")
        except Exception as e:  # noqa: BLE001 - logged with the error; the per-layer graphs serve this signature
            self.failed.add(key)
            logger.warning("CUDA graphs: capturing the whole forward of %s for a decode step raised %r; such "
                           "steps run through the per-layer graphs", type(module).__name__, e)
            self.graphs.status.model_eager["the whole-forward capture failed (see the warning)"] += 1
            return None
        entry = _Entry(graph, static_in, out_spec, [o.detach() for o in outs],
                       [weakref.ref(c) for c in caches.values()], fixed_ptrs(self.modules))
        self.entries[key] = entry
        self.graphs.status.model_graphs += 1
        logger.info("CUDA graphs: recorded the whole forward of %s for a decode step", type(module).__name__)
        return entry


def _without_caches(key: tuple) -> tuple:
    """``key`` without what names a cache (its id and memory): the shapes and values of a call."""
    in_spec, metas, _ = key
    return ((tuple(_spec_without_caches(s) for s in in_spec[0]),
             tuple((k, _spec_without_caches(s)) for k, s in in_spec[1])), metas)


def _spec_without_caches(spec: Any) -> Any:
    if spec is TENSOR:
        return spec
    kind, value = spec
    if kind is KVCacheTag:
        return (kind, None)
    if kind is tuple or kind is list:
        return (kind, tuple(_spec_without_caches(s) for s in value))
    if kind is MappingTag:
        cls, keys, specs = value
        return (kind, (cls, keys, tuple(_spec_without_caches(s) for s in specs)))
    return spec

