"""One TTIR per kernel signature while Inductor compiles a twinkle graph (compile time).

On a GPU the built-in kernels are ``torch.library.triton_op``s: AOTAutograd records each
``wrap_triton(kernel)[grid](...)`` launch, and to learn which tensors a launch writes, torch's
``triton_kernel_wrap.identify_mutated_tensors`` (torch 2.11) / ``identify_accessed_tensors``
(2.13) runs Triton's front end (``generate_ttir``) and walks the resulting TTIR. It does that again
for every launch of every layer, in the forward trace, the joint trace and Inductor's lowering of
both graphs: about 200 launches a step for the reference workload (24 layers), each analysed up to
three times, each analysis a Triton front-end compile of tens of ms on a slow host.

The TTIR of a launch depends only on the kernel and what Triton specialises on: the dtype of
each tensor (``generate_ttir`` itself replaces every fake tensor by a 2-element CPU tensor of that
dtype), the value of each plain scalar and constexpr, and every symbolic size replaced by 2; for a
launch with ``num_warps`` torch wraps the kernel in a new one-config ``Autotuner`` each time, whose
``fn`` and first config's kwargs are what ``generate_ttir`` compiles, so those are the key. While
:func:`memoized_ttir` is active, ``generate_ttir`` is answered from a memo keyed by exactly that,
so the 24 layers share one front-end run per distinct launch. Launches with TMA descriptors, or an
argument the key cannot describe, go to torch's function unchanged. The memo holds at most
:data:`MAX_ENTRIES` modules (each a few KB of MLIR), least recently used first out.

Measured with ``tools/compile_time_probe.py`` (see the compile-time section of docs/compile.md).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ...core.caches import owns_cache
from ...core.torch_internals import generate_ttir, is_inductor_tensor_box, set_generate_ttir

logger = logging.getLogger(__name__)

__all__ = ["memoized_ttir", "ttir_key", "MAX_ENTRIES", "stats"]

MAX_ENTRIES = 256

_lock = threading.RLock()
_active = 0  # nesting depth of memoized_ttir blocks (the backward compiles inside the forward's block or later)
_original: Callable[..., Any] | None = None
_memo: OrderedDict[tuple, Any] = OrderedDict()
_counts = {"hits": 0, "misses": 0, "bypassed": 0}


def _reset() -> None:
    with _lock:
        _memo.clear()
        _counts.update(hits=0, misses=0, bypassed=0)


owns_cache(__name__, _reset)


def stats() -> dict[str, int]:
    """Front-end runs answered from the memo (``hits``), run and stored (``misses``), and run
    without the memo (``bypassed``: TMA descriptors, or an argument the key cannot describe)."""
    with _lock:
        return dict(_counts)


def _arg_key(value: Any) -> tuple | None:
    import sympy

    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool, sympy.Expr)):
        return ("sym",)  # generate_ttir replaces every symbolic value by 2
    if isinstance(value, torch.Tensor) or is_inductor_tensor_box(value):
        return ("tensor", str(value.dtype if isinstance(value, torch.Tensor) else value.get_dtype()))
    if value is None or isinstance(value, (bool, int, float, str)):
        return (type(value).__name__, value)
    try:
        hash(value)  # triton dtypes and constexpr values
    except TypeError:
        return None
    return (type(value).__module__, type(value).__qualname__, value)


def ttir_key(kernel: Any, kwargs: dict[str, Any], tma_descriptor_metadata: Any) -> tuple | None:
    """The memo key of one ``generate_ttir(kernel, kwargs, tma_descriptor_metadata)`` call, or None
    when the call must not be memoized.

    Examples:
        >>> import torch
        >>> a = ttir_key("k", {"x": torch.empty(4, dtype=torch.bfloat16), "n": 7, "BLOCK": 64}, {})
        >>> a == ttir_key("k", {"x": torch.empty(9, dtype=torch.bfloat16), "n": 7, "BLOCK": 64}, {})
        True
        >>> a == ttir_key("k", {"x": torch.empty(4, dtype=torch.float32), "n": 7, "BLOCK": 64}, {})
        False
        >>> ttir_key("k", {"x": [1, 2]}, {}) is None   # not hashable: not memoized
        True
    """
    if tma_descriptor_metadata:
        return None
    kernel, kwargs = _unwrap_autotuner(kernel, kwargs)
    parts = []
    for name in sorted(kwargs):
        part = _arg_key(kwargs[name])
        if part is None:
            return None
        parts.append((name, part))
    device = torch.cuda.current_device() if torch.cuda.is_available() else -1
    return (kernel, device, tuple(parts))


def _unwrap_autotuner(kernel: Any, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """What ``generate_ttir`` compiles for ``kernel``: torch wraps a launch that passes ``num_warps``
    or ``num_stages`` in a new single-config ``Autotuner`` each time (so the object differs for every
    launch of every layer), and ``generate_ttir`` compiles the autotuner's ``fn`` with its first
    config's kwargs (launch options such as ``num_warps`` do not reach the TTIR)."""
    try:
        from triton.runtime.autotuner import Autotuner
    except ImportError:
        return kernel, kwargs
    if isinstance(kernel, Autotuner):
        if kernel.configs:
            kwargs = {**kwargs, **kernel.configs[0].kwargs}
        kernel = kernel.fn
    return kernel, kwargs


def _memoizing(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def generate_ttir(kernel: Any, kwargs: dict[str, Any], tma_descriptor_metadata: Any, *args: Any, **kw: Any) -> Any:
        try:
            key = None if args or kw else ttir_key(kernel, kwargs, tma_descriptor_metadata)
            hash(key)
        except Exception:  # noqa: BLE001 - an argument the key cannot describe: torch's own function answers
            logger.debug("TTIR memo: no key for a launch of %r", kernel, exc_info=True)
            key = None
        if key is None:
            with _lock:
                _counts["bypassed"] += 1
            return original(kernel, kwargs, tma_descriptor_metadata, *args, **kw)
        with _lock:
            if key in _memo:
                _memo.move_to_end(key)
                _counts["hits"] += 1
                module, names = _memo[key]
                return module, list(names)
        result = original(kernel, kwargs, tma_descriptor_metadata)
        with _lock:
            _counts["misses"] += 1
            _memo[key] = (result[0], tuple(result[1]))
            while len(_memo) > MAX_ENTRIES:
                _memo.popitem(last=False)
        return result

    generate_ttir.__twinkle_memo__ = True  # type: ignore[attr-defined]
    return generate_ttir


@contextlib.contextmanager
def memoized_ttir() -> Iterator[None]:
    """Answer torch's ``generate_ttir`` from the memo inside the block (re-entrant; restores torch's
    own function when the outermost block exits). Without Triton, or with a torch that has no
    ``generate_ttir``, the block changes nothing."""
    global _active, _original
    if generate_ttir() is None:
        yield
        return
    with _lock:
        if _active == 0:
            _original = generate_ttir()
            if not getattr(_original, "__twinkle_memo__", False):
                set_generate_ttir(_memoizing(_original))
        _active += 1
    try:
        yield
    finally:
        with _lock:
            _active -= 1
            if _active == 0:
                set_generate_ttir(_original)
                _original = None
                logger.debug("TTIR memo so far: %(hits)d answered, %(misses)d run, %(bypassed)d bypassed", _counts)
