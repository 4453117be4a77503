"""The one kernel registry shared by ``kernelize_model`` and the ``twinkle`` compile backend.

It holds four tables:

- layer kernels: kernel_name -> device -> mode -> :class:`LayerRegistration`;
- layer bindings: nn.Module class -> kernel_name (``register_external_layer``; classes carrying a
  ``kernel_layer_name`` attribute, as set by Hugging Face ``kernels`` decorators, bind implicitly);
- function kernels: "module.func" -> device -> mode -> :class:`FunctionRegistration`;
- graph rewrites: the names of the compile backend's rewrites of computations no
  module or function names (attention as transformers writes it, projections reading one input).
  Every registry starts with all of :data:`GRAPH_REWRITES`; removing one by name turns it off wherever
  that registry is in effect (``options=`` of one ``torch.compile`` call choose among those left).

The active registry is per context (a ``ContextVar``): :func:`scoped_registry` gives a block its
own copy, so tests and libraries never leak registrations into each other, nor threads into each
other. A thread started inside a block uses the block's registry, a thread pool's task the registry
in effect where it was submitted (see :func:`scoped_registry` for how); a scope another thread opens
later never reaches it. All access is guarded by a lock.

Registering is pure data: nothing is imported, loaded or traced until a kernel is used.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import functools
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .errors import check_flag
from .modes import Mode, format_mode
from .sources import KernelSource

logger = logging.getLogger(__name__)

__all__ = [
    "LayerRegistration",
    "FunctionRegistration",
    "LayerBinding",
    "GRAPH_REWRITES",
    "KernelRegistry",
    "get_registry",
    "scoped_registry",
]


@dataclass(frozen=True)
class LayerRegistration:
    """One layer kernel: ``kernel_name`` served on ``device`` in ``mode`` by ``source``."""

    kernel_name: str
    device: str
    mode: Mode
    source: KernelSource
    # False: serves only classes bound with register_external_layer, not classes that merely carry
    # transformers' kernel_layer_name tag (the built-in mapping: the tag "RMSNorm" sits on ~130
    # classes of differing semantics, and models= must limit what it reaches)
    binds_by_tag: bool = True

    def __str__(self) -> str:
        return f"{self.kernel_name} [{self.device}, {format_mode(self.mode)}] from {self.source.describe()}"


@dataclass(frozen=True)
class FunctionRegistration:
    """One function kernel replacing ``target_module.func_name`` on ``device`` in ``mode``."""

    target_module: str
    func_name: str
    device: str
    mode: Mode
    source: KernelSource
    # the compile backend swaps calls of the function and copies of it in other modules; True also
    # swaps the bare computation wherever it is written (a registered add(x, y) would then take
    # every residual add of a model)
    match_anywhere: bool = False
    # what the compile backend derived from this registration (the traced pattern): it lives and
    # dies with the registration, so a scoped registry leaves nothing behind
    compile_cache: dict[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)

    @property
    def target(self) -> str:
        return f"{self.target_module}.{self.func_name}"

    def __str__(self) -> str:
        return f"{self.target} [{self.device}, {format_mode(self.mode)}] from {self.source.describe()}"


@dataclass(frozen=True)
class LayerBinding:
    """Why instances of a class are a layer kernel's: ``explicit`` (``register_external_layer``,
    limited to instances under the parent classes ``within`` when that is not None), else the class's
    ``kernel_layer_name`` tag."""

    kernel_name: str
    explicit: bool
    within: tuple[type, ...] | None


#: the compile backend's graph rewrites (the passes in ``compile/passes`` look their names up), and what each does
GRAPH_REWRITES: dict[str, str] = {
    "causal_attention": "scaled_dot_product_attention given a causal mask that depends on no input -> is_causal=True",
    "gqa_attention": "scaled_dot_product_attention on key/value repeated to the query's heads (repeat_kv) -> "
                     "twinkle_triton.gqa_attention",
    "fused_projections": "linears that read the same input (q/k/v, gate/up) -> one GEMM on concatenated weights",
    "decode_gemv": "linears on a few rows (decode) -> twinkle_triton.gemv / gemv_swiglu, with the SwiGLU product "
                   "and the residual add fused",
    "decode_cache": "the rotary kernel and a static KV cache's two index_copy_ writes (decode) -> "
                    "twinkle_triton.apply_rotary_pos_emb_to_cache; with the GQA attention that reads them and the "
                    "cache length's update -> twinkle_triton.rotary_cache_attention",
    "residual_norm": "a residual add read by a swapped RMSNorm layer -> twinkle_triton.add_rms_norm",
    "embedding_grad": "an embedding's dense weight gradient in a backward graph (plus a tied LM head's) -> "
                      "twinkle_triton.embedding_grad_sums, gathered where the gradient is written or added in "
                      "place to the fused loss's saved head gradient (twinkle_triton.add_embedding_grad)",
    "scaled_gradient": "a saved gradient a backward graph returns times the loss's gradient (the fused loss's "
                       "untied LM-head gradient) -> twinkle_triton.scale_in_place, nothing touched when that is 1",
    "matmul_sums": "a sum of matrix products in a traced graph (a layer input's gradient from q, k and v) -> "
                   "twinkle_fx::matmul_sum, GEMMs that accumulate into one another",
    "topk": "a top-k of the largest values along a short last dimension in a traced graph (a mixture-of-experts "
            "router's) -> twinkle_triton.topk, one kernel",
}


_Table = dict[str, dict[str, dict[Mode, object]]]


def _put(table: _Table, key: str, device: str, mode: Mode, entry: object, label: str) -> None:
    slot = table.setdefault(key, {}).setdefault(device, {})
    if mode in slot:
        logger.info("%s re-registered for %s/%s; the later registration wins (%s)", label, device, format_mode(mode), entry)
    slot[mode] = entry


class KernelRegistry:
    """Registrations of layer and function kernels. Usually reached through :func:`get_registry`.

    Examples:
        >>> reg = KernelRegistry()
        >>> reg.bind_layer(torch.nn.GELU, "FastGelu")
        >>> reg.kernel_name_for(torch.nn.GELU)
        'FastGelu'
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._layers: _Table = {}
        self._bindings: dict[type, str] = {}
        self._within: dict[type, tuple[type, ...]] = {}  # bound class -> parent classes it is limited to
        self._functions: _Table = {}
        self._graph_rewrites: set[str] = set(GRAPH_REWRITES)
        self.generation = 0  # bumped on every change: caches keyed on it stay valid exactly as long as the registry

    # -- writing -----------------------------------------------------------------------------
    def add_layer(self, registration: LayerRegistration) -> None:
        with self._lock:
            _put(self._layers, registration.kernel_name, registration.device, registration.mode, registration, f"layer kernel {registration.kernel_name!r}")
            self.generation += 1

    def bind_layer(self, cls: type, kernel_name: str, within: tuple[type, ...] | None = None) -> None:
        """Bind ``cls`` to ``kernel_name``; with ``within``, only instances whose parent module is one
        of those classes (binding the same kernel within other parents adds to them; an unscoped
        binding replaces the scope)."""
        with self._lock:
            previous = self._bindings.get(cls)
            if previous is not None and previous != kernel_name:
                logger.info("%s was bound to %r, now to %r (later wins)", cls.__qualname__, previous, kernel_name)
            scope = self._within.get(cls) if previous == kernel_name else None
            if within is None or (previous == kernel_name and scope is None):
                self._within.pop(cls, None)
            else:
                self._within[cls] = tuple(dict.fromkeys((*(scope or ()), *within)))
            self._bindings[cls] = kernel_name
            self.generation += 1

    def add_function(self, registration: FunctionRegistration) -> None:
        with self._lock:
            _put(self._functions, registration.target, registration.device, registration.mode, registration, f"function kernel for {registration.target}")
            self.generation += 1

    def remove_graph_rewrite(self, name: str) -> None:
        """Turn the compile backend's graph rewrite ``name`` off (one of :data:`GRAPH_REWRITES`)
        wherever this registry is in effect; :meth:`add_graph_rewrite` turns it on again.

        Examples:
            >>> with scoped_registry() as registry:
            ...     registry.remove_graph_rewrite("gqa_attention")
            ...     registry.graph_rewrite_names()  # doctest: +NORMALIZE_WHITESPACE
            ['causal_attention', 'fused_projections', 'decode_gemv', 'decode_cache', 'residual_norm',
             'embedding_grad', 'scaled_gradient', 'matmul_sums', 'topk']
        """
        with self._lock:
            _check_graph_rewrite(name)
            self._graph_rewrites.discard(name)
            self.generation += 1

    def add_graph_rewrite(self, name: str) -> None:
        """Turn the graph rewrite ``name`` (one of :data:`GRAPH_REWRITES`) on again."""
        with self._lock:
            _check_graph_rewrite(name)
            self._graph_rewrites.add(name)
            self.generation += 1

    # -- reading -----------------------------------------------------------------------------
    def has_graph_rewrite(self, name: str) -> bool:
        with self._lock:
            return name in self._graph_rewrites

    def graph_rewrite_names(self) -> list[str]:
        """The graph rewrites this registry lets the compile backend make, in :data:`GRAPH_REWRITES` order."""
        with self._lock:
            return [name for name in GRAPH_REWRITES if name in self._graph_rewrites]

    def layer_binding(self, cls: type) -> LayerBinding | None:
        """What binds ``cls`` to a layer kernel name, read at once: an explicit binding (searched along
        the MRO, with the parents it is limited to), else the ``kernel_layer_name`` class attribute set
        by Hugging Face ``kernels`` decorators; None when neither names one."""
        with self._lock:
            for klass in cls.__mro__:
                if klass in self._bindings:
                    return LayerBinding(self._bindings[klass], explicit=True, within=self._within.get(klass))
        name = getattr(cls, "kernel_layer_name", None)
        return LayerBinding(name, explicit=False, within=None) if isinstance(name, str) else None

    def kernel_name_for(self, cls: type) -> str | None:
        """The kernel name bound to ``cls`` (:meth:`layer_binding`'s)."""
        binding = self.layer_binding(cls)
        return None if binding is None else binding.kernel_name

    def binding_scope(self, cls: type) -> tuple[type, ...] | None:
        """The parent classes the explicit binding of ``cls`` (or of the base it is bound through) is
        limited to; None when it is not limited (or not bound)."""
        binding = self.layer_binding(cls)
        return None if binding is None else binding.within

    def is_bound(self, cls: type) -> bool:
        """Whether ``cls`` (or a base) was bound explicitly with :func:`register_external_layer`."""
        binding = self.layer_binding(cls)
        return binding is not None and binding.explicit

    def layer_registrations(self, kernel_name: str) -> dict[str, dict[Mode, LayerRegistration]]:
        """device -> mode -> registration for ``kernel_name`` (a copy)."""
        with self._lock:
            return {dev: dict(modes) for dev, modes in self._layers.get(kernel_name, {}).items()}  # type: ignore[misc]

    def function_registrations(self, target: str) -> dict[str, dict[Mode, FunctionRegistration]]:
        """device -> mode -> registration for ``"module.func"`` (a copy)."""
        with self._lock:
            return {dev: dict(modes) for dev, modes in self._functions.get(target, {}).items()}  # type: ignore[misc]

    def function_targets(self, target_module: str | None = None) -> list[str]:
        """Registered ``"module.func"`` targets, optionally only those in ``target_module``."""
        with self._lock:
            targets = list(self._functions)
        if target_module is None:
            return targets
        return [t for t in targets if t.rsplit(".", 1)[0] == target_module]

    def all_function_registrations(self) -> list[FunctionRegistration]:
        with self._lock:
            return [r for devs in self._functions.values() for modes in devs.values() for r in modes.values()]  # type: ignore[misc]

    def bindings(self) -> dict[type, str]:
        with self._lock:
            return dict(self._bindings)

    def layer_kernel_names(self) -> list[str]:
        with self._lock:
            return list(self._layers)

    # -- scoping -----------------------------------------------------------------------------
    def copy(self) -> "KernelRegistry":
        """An independent registry with the same registrations (sources, and their load caches, are shared)."""
        new = KernelRegistry()
        with self._lock:
            new._layers = {k: {d: dict(m) for d, m in devs.items()} for k, devs in self._layers.items()}
            new._functions = {k: {d: dict(m) for d, m in devs.items()} for k, devs in self._functions.items()}
            new._bindings = dict(self._bindings)
            new._within = dict(self._within)
            new._graph_rewrites = set(self._graph_rewrites)
            new.generation = self.generation
        return new

    def __repr__(self) -> str:
        with self._lock:
            return (f"<KernelRegistry layers={list(self._layers)} bindings={len(self._bindings)} "
                    f"functions={list(self._functions)} graph_rewrites={self.graph_rewrite_names()}>")


def _check_graph_rewrite(name: object) -> None:
    if name not in GRAPH_REWRITES:
        raise ValueError(f"{name!r} is not a graph rewrite of the compile backend; the rewrites are "
                         f"{', '.join(map(repr, GRAPH_REWRITES))}")


_GLOBAL_REGISTRY = KernelRegistry()
_ACTIVE_REGISTRY: contextvars.ContextVar[KernelRegistry | None] = contextvars.ContextVar("twinkle_fx_registry", default=None)
# threading.Thread attribute holding the registry in effect where the thread was started: before
# Python 3.14 a new thread starts with an empty context, so the ContextVar alone would drop the scope
_STARTED_IN = "_twinkle_fx_registry"
_THREAD_HOOK_LOCK = threading.Lock()
# set while a ThreadPoolExecutor.submit runs: a worker thread it starts serves every later task of the
# pool, so it takes no scope of its own; each task carries the one in effect where it was submitted
_SUBMITTING = threading.local()


def _scope_in_effect() -> KernelRegistry | None:
    active = _ACTIVE_REGISTRY.get()
    if active is not None:
        return active
    return getattr(threading.current_thread(), _STARTED_IN, None)


def _run_in(registry: KernelRegistry, fn: Any, args: tuple, kwargs: dict) -> Any:
    token = _ACTIVE_REGISTRY.set(registry)
    try:
        return fn(*args, **kwargs)
    finally:
        _ACTIVE_REGISTRY.reset(token)


def _pass_scopes_to_new_threads() -> None:
    """Wrap ``threading.Thread.start`` and ``ThreadPoolExecutor.submit`` (once per process), so a
    thread remembers the scope in effect in the thread that started it, at that moment, and a pool's
    task runs in the registry in effect where it was submitted (the global one outside any scope),
    whichever task happened to start the pool's threads. Installed by the first
    :func:`scoped_registry`: until a scope exists there is nothing to pass on."""
    with _THREAD_HOOK_LOCK:
        original = threading.Thread.start
        if getattr(original, "_passes_twinkle_fx_scope", False):
            return
        original_submit = concurrent.futures.ThreadPoolExecutor.submit

        @functools.wraps(original)
        def start(self: threading.Thread, *args: Any, **kwargs: Any) -> Any:
            scope = None if getattr(_SUBMITTING, "active", False) else _scope_in_effect()
            if scope is not None and not hasattr(self, _STARTED_IN):
                setattr(self, _STARTED_IN, scope)
            return original(self, *args, **kwargs)

        @functools.wraps(original_submit)
        def submit(self: concurrent.futures.ThreadPoolExecutor, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            registry = get_registry()  # set explicitly even when global: the worker's context may hold a stale one
            outer, _SUBMITTING.active = getattr(_SUBMITTING, "active", False), True
            try:
                return original_submit(self, _run_in, registry, fn, args, kwargs)
            finally:
                _SUBMITTING.active = outer

        start._passes_twinkle_fx_scope = True  # type: ignore[attr-defined]
        concurrent.futures.ThreadPoolExecutor.submit = submit  # type: ignore[method-assign]
        threading.Thread.start = start  # type: ignore[method-assign]


def get_registry() -> KernelRegistry:
    """The registry in effect here: the innermost :func:`scoped_registry` of this context, else the
    one in effect where this thread was started, else the process-wide one."""
    scope = _scope_in_effect()
    return _GLOBAL_REGISTRY if scope is None else scope


@contextlib.contextmanager
def scoped_registry(*, inherit: bool = True) -> Iterator[KernelRegistry]:
    """Make registrations inside the block private to it; they vanish when it exits (also on error).

    Scopes follow ``contextvars`` semantics: a block is seen by the code it runs, by asyncio tasks
    created inside it, and by threads started inside it (a ``threading.Thread`` started in the block
    keeps the block's registry for its whole life, even after the block exits, as a copied context
    would; Python before 3.14 does not copy contexts into threads, so the first ``scoped_registry``
    wraps ``threading.Thread.start`` to hand the scope over). A ``ThreadPoolExecutor`` task (asyncio's
    ``run_in_executor`` included) sees the registry in effect where it was submitted, not the one where
    the pool happened to start its threads: its worker threads take no scope, and the first
    ``scoped_registry`` wraps ``ThreadPoolExecutor.submit`` to carry it with each task. Nothing else
    sees it: neither other threads (a worker's own scope never takes over the main thread's registry)
    nor threads started before the block opened. Registrations made in such a thread land in the
    block's registry.

    Args:
        inherit (`bool`, defaults to `True`): start from a copy of the registrations in effect;
            `False` starts with no kernels and every graph rewrite, as a new registry does.

    Examples:
        >>> from twinkle_fx import get_registry, scoped_registry, register_layer_kernel
        >>> with scoped_registry():
        ...     _ = register_layer_kernel(kernel_name="Fast", layer=torch.nn.Identity, device="cpu")
        ...     "Fast" in get_registry().layer_kernel_names()
        True
        >>> "Fast" in get_registry().layer_kernel_names()   # the scope took it along
        False
    """
    check_flag("inherit", inherit)
    _pass_scopes_to_new_threads()
    registry = get_registry().copy() if inherit else KernelRegistry()
    token = _ACTIVE_REGISTRY.set(registry)
    try:
        yield registry
    finally:
        _ACTIVE_REGISTRY.reset(token)
