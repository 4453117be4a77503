"""Launch compiled Triton kernels without the JIT's per-call dispatch.

``kernel[grid](*args, **meta)`` runs Triton's ``JITFunction.run`` on every call: it binds the
arguments, computes a specialization of each one, turns the options into a string for the cache
key, checks the kernel's globals, and (triton 3.5/3.6) builds launch metadata and calls the (empty)
launch hook chains, before the compiled kernel's launcher runs. For the short kernels of a
transformer layer that host work is longer than the kernel itself (see the numbers in README.md).

:class:`CachedLauncher` makes the first launch of each *specialization* through the JIT, keeps
the ``CompiledKernel`` it returns, and later launches the same compiled kernel through its own
launcher (``CompiledKernel.run``, the call ``JITFunction.run`` ends with) with the same arguments.
The kernel, its arguments and the launch are the same, so results are identical to the JIT path.

What Triton specializes a compiled kernel on, and so what the cache key must separate (it may
separate more, never less): the type of each argument (a tensor's dtype; int width; floats are
fp32, bools u1), whether pointers are 16-byte aligned, for ints whether they equal 1 or are
divisible by 16, the values of ``tl.constexpr`` arguments, the launch options (``num_warps``, ...)
and the device. The key holds the ints themselves (shapes and strides: a new shape costs one JIT
launch, which finds the kernel in Triton's own cache), the dtypes, and the pointers' alignment,
recognised for all of them at once with one ``math.gcd`` in the common case.

The JIT path is taken whenever something may observe or change a launch: launch hooks
(``triton.knobs.runtime.launch_enter_hook``, e.g. Proton), pre-run hooks on the kernel, or a
kernel that is not a plain ``JITFunction`` (the interpreter's ``InterpretedFunction``, autotuners).
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["CachedLauncher", "cached_launcher", "specialization_key"]

# Distinct specializations kept per kernel; past this (a workload of ever new shapes) the cache
# starts afresh rather than grow without bound.
MAX_CACHED = 4096

_data_ptr = torch.Tensor.data_ptr
_dtype = operator.attrgetter("dtype")


def _getter(positions: Sequence[int]) -> Callable[[tuple], tuple]:
    """``args -> tuple(args[i] for i in positions)`` in C (itemgetter of one index returns the item)."""
    if not positions:
        return lambda args: ()
    if len(positions) == 1:
        (i,) = positions
        return lambda args: (args[i],)
    return operator.itemgetter(*positions)


class _Plan:
    """Where the tensors, ints and other values sit in one call's positional arguments."""

    __slots__ = ("tensors", "ints", "others")

    def __init__(self, types: tuple[type, ...]) -> None:
        tensors, ints, others = [], [], []
        for i, t in enumerate(types):
            if issubclass(t, torch.Tensor):
                tensors.append(i)
            elif t is bool:  # before int: bool is an int subclass, and Triton types it u1
                others.append(i)
            elif issubclass(t, int):
                ints.append(i)
            elif t is not float:  # floats are fp32 whatever their value; anything else goes in by value
                others.append(i)
        self.tensors, self.ints, self.others = _getter(tensors), _getter(ints), _getter(others)


def specialization_key(plan: _Plan, args: tuple) -> tuple:
    """What of ``args`` Triton's specialization depends on, as a hashable key (see the module docstring)."""
    tensors = plan.tensors(args)
    pointers = tuple(map(_data_ptr, tensors))
    aligned = True if not pointers or math.gcd(*pointers) % 16 == 0 else tuple(p % 16 == 0 for p in pointers)
    return (tuple(map(_dtype, tensors)), aligned, plan.ints(args), plan.others(args))


def _hooks_active() -> bool:
    """True when Triton launch hooks are registered (they must see every launch: use the JIT path)."""
    runtime = _knobs_runtime()
    if runtime is None:
        return False
    for hook in (getattr(runtime, "launch_enter_hook", None), getattr(runtime, "launch_exit_hook", None)):
        if hook is not None and getattr(hook, "calls", True):  # an empty HookChain (triton >= 3.5) is inactive
            return True
    return False


@functools.lru_cache(maxsize=1)
def _knobs_runtime():
    try:
        from triton import knobs
    except ImportError:  # triton < 3.4: hooks live on CompiledKernel; the JIT path handles them
        return None
    return knobs.runtime


class CachedLauncher:
    """``launcher[grid](*args, **meta)``: launches ``kernel`` like ``kernel[grid](*args, **meta)``.

    ``args`` are the kernel's leading parameters, positionally; ``meta`` the remaining ones (the
    ``tl.constexpr`` parameters) and launch options such as ``num_warps``, by keyword.

    Example:
        ```python
        launcher = cached_launcher(_rms_norm_fwd_kernel)
        launcher[(rows,)](x, residual, weight, out, summed, stride_x, stride_r, stride_w, n_cols, eps,
                          HAS_RESIDUAL=False, BLOCK=1024, COMPUTE_DTYPE=tl.float32, num_warps=4)
        ```
    """

    def __init__(self, kernel) -> None:
        self.kernel = kernel
        self._plans: dict[tuple[type, ...], _Plan] = {}
        # key -> (launcher, function handle, packed metadata, trailing argument values)
        self._compiled: dict[tuple, tuple] = {}
        self._pre_run_hooks = getattr(kernel, "pre_run_hooks", ())  # the kernel's own list: sees later additions
        self._param_names = [p.name for p in kernel.params]
        self._defaults = {p.name: p.default for p in kernel.params if p.has_default}

    def __getitem__(self, grid: Sequence[int]) -> Callable[..., None]:
        return functools.partial(self.launch, grid)

    def launch(self, grid: Sequence[int], *args: Any, **meta: Any) -> None:
        types = tuple(map(type, args))
        plan = self._plans.get(types)
        if plan is None:
            plan = self._plans[types] = _Plan(types)
        device = torch._C._cuda_getDevice()
        key = (types, device, specialization_key(plan, args), tuple(meta.items()))
        entry = self._compiled.get(key)
        if entry is None or self._pre_run_hooks or _hooks_active():
            self._launch_jit(key, grid, args, meta)
            return
        run, function, packed_metadata, tail = entry
        n = len(grid)
        run(grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1, torch._C._cuda_getCurrentRawStream(device),
            function, packed_metadata, None, None, None, *args, *tail)

    def _launch_jit(self, key: tuple, grid: Sequence[int], args: tuple, meta: dict) -> None:
        compiled = self.kernel[grid](*args, **meta)
        if hasattr(compiled, "result"):  # an asynchronous compile's future
            compiled = compiled.result()
        missing = [n for n in self._param_names[len(args):] if n not in meta and n not in self._defaults]
        if compiled is None or missing:
            return  # nothing to cache (the JIT raised already if arguments were missing)
        # The launcher takes every parameter in signature order, constexprs included (it skips them).
        tail = tuple(meta[n] if n in meta else self._defaults[n] for n in self._param_names[len(args):])
        if len(self._compiled) >= MAX_CACHED:
            self._compiled.clear()
        self._compiled[key] = (compiled.run, compiled.function, compiled.packed_metadata, tail)


_LAUNCHERS: dict[int, CachedLauncher] = {}


def reset() -> None:
    """Drop every cached launcher (each is rebuilt at its kernel's next launch); for test fixtures."""
    _LAUNCHERS.clear()


def cached_launcher(kernel):
    """The :class:`CachedLauncher` of ``kernel`` (one per kernel), or ``kernel`` itself when it is
    not a plain ``triton.runtime.JITFunction`` (the interpreter, an autotuner)."""
    launcher = _LAUNCHERS.get(id(kernel))
    if launcher is not None and launcher.kernel is kernel:
        return launcher
    from triton.runtime.jit import JITFunction

    if type(kernel) is not JITFunction:
        return kernel
    launcher = _LAUNCHERS[id(kernel)] = CachedLauncher(kernel)
    return launcher
