"""Process-wide caches, each with an owner and a reset.

Some state has to outlive a call: a kernel package scanned for GPU-jitted Triton kernels, a
custom op registered for an opaque kernel, a log line said once. Each module that keeps such a
cache registers it here by its module name, with a function that empties it; :func:`reset_caches`
empties them all, so a test (``tests/conftest.py`` calls it after every test) or a long-running
process that switches registries starts from nothing. Resetting changes no result, only what is
recomputed or said again. What is not a cache stays: installed forwards and function patches are
undone with :func:`twinkle_fx.undo_kernelize`, and torch.library keeps the ops it was given.

Only modules that were imported registered a cache (a module never imported filled none).

Examples:
    >>> from twinkle_fx.core.caches import cache_owners, reset_caches
    >>> "twinkle_fx.eager.kernelize" in cache_owners()
    True
    >>> reset_caches() == cache_owners()
    True
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["owns_cache", "reset_caches", "cache_owners"]

_RESETS: dict[str, Callable[[], None]] = {}
_LOCK = threading.Lock()


def owns_cache(owner: str, reset: Callable[[], None]) -> None:
    """Register ``reset`` as the way to empty the caches of module ``owner`` (its ``__name__``; a
    second registration under the same owner replaces the first, so a reloaded module keeps one)."""
    with _LOCK:
        _RESETS[owner] = reset


def cache_owners() -> list[str]:
    """The modules whose caches :func:`reset_caches` empties, sorted."""
    with _LOCK:
        return sorted(_RESETS)


def reset_caches() -> list[str]:
    """Empty every registered cache; returns the owners, sorted."""
    with _LOCK:
        resets = sorted(_RESETS.items())
    for _, reset in resets:
        reset()
    return [owner for owner, _ in resets]
