"""How the kernels are launched: block sizes, warps and grids, the compute dtype each kernel is
specialised on, and the launch itself without Triton's per-call JIT dispatch. Each op file's
``_launch*`` functions launch its own kernels with these.

Grid and block choices (untuned heuristics until measured on the device; see README.md):
- row kernels (norms, cross-entropy) put a whole row in one block, BLOCK = next_power_of_2(hidden),
  and scale num_warps with BLOCK so each thread holds a few 16-byte vectors (Liger's and Apex's
  choice for memory-bound row reductions);
- elementwise kernels use 1D blocks of 1024 elements with 4 warps: 8 elements a thread, one 16-byte
  load for bf16/fp16, two for fp32, which is what reaches copy bandwidth for streaming kernels;
- under the Triton interpreter (TRITON_INTERPRET=1, CPU) every program is a Python loop iteration
  over numpy arrays, so the same kernels run with few, large programs there;
- ``BLOCK_LIMIT`` caps every block along a row or a flat range (:func:`loop_block`,
  :func:`elementwise_block`) on any device. It is off by default; tests lower it so that, at their small
  shapes, the kernels loop over several blocks (the online-softmax merge of the loss kernels, partial
  last blocks, a row split across programs) as they do at real sizes on the GPU.

The launch: ``kernel[grid](*args, **meta)`` runs Triton's ``JITFunction.run`` on every call: it binds
the arguments, computes a specialization of each one, turns the options into a string for the cache
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

import contextvars
import functools
import math
import operator
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
import triton
import triton.language as tl

from ._torch_internals import current_cuda_device, current_cuda_raw_stream

__all__ = ["BLOCK_LIMIT", "CachedLauncher", "accumulation_dtype", "cached_launcher", "cdiv", "compute_dtype",
           "dot_options", "elementwise_block", "interpreting", "loop_block", "multiprocessor_count", "next_power_of_2",
           "persistent_programs", "reset", "row_block", "rows", "run_with_scratch", "shared_memory_per_block",
           "specialization_key"]

# ----------------------------------------------------------------------------- grids, blocks, dtypes

# Largest row a row kernel keeps in registers (64K fp32 elements, 16 per thread at 32 warps).
MAX_ROW_BLOCK = 65536

_ELEMENTWISE_BLOCK = 1024
_ELEMENTWISE_WARPS = 4
# Under the interpreter, programs are slow Python iterations: a big block keeps them few.
_INTERPRETER_ELEMENTWISE_BLOCK = 16384
# Largest block (a power of 2, at least 16) of any kernel that covers a row or a flat range in blocks,
# read at each launch; None: each kernel's own block. See the module docstring.
BLOCK_LIMIT: int | None = None


def interpreting() -> bool:
    """True when Triton runs kernels through its CPU interpreter (read at launch time)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def next_power_of_2(n: int) -> int:
    """Smallest power of 2 >= ``n`` (1 for ``n <= 1``). ``triton.next_power_of_2`` is a
    ``constexpr_function`` since Triton 3.5: 4 us a call on the host (measured with 3.6 and 3.9), this 0.1 us."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for ints (``triton.cdiv`` is a ``constexpr_function`` too: 4 us a call)."""
    return -(-a // b)


def compute_dtype(dtype: torch.dtype) -> tl.dtype:
    """Accumulation dtype of a kernel: fp32 for 16/32-bit floats, fp64 for fp64 (gradcheck), int64
    for integers and bool (exact, and wrapping like torch's own integer arithmetic once stored)."""
    if not dtype.is_floating_point:
        return tl.int64
    return tl.float64 if dtype == torch.float64 else tl.float32


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """The torch dtype that sums of ``dtype`` values (partial gradients, losses) are kept in: fp64 for
    fp64 (gradcheck), else fp32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def row_block(n_cols: int, *, op: str) -> tuple[int, int]:
    """(BLOCK, num_warps) for a kernel holding one row of ``n_cols`` elements in one block."""
    block = next_power_of_2(n_cols)
    if block > MAX_ROW_BLOCK:
        raise ValueError(
            f"{op}: the last dimension has {n_cols} elements; the Triton kernel keeps a row in one "
            f"block of at most {MAX_ROW_BLOCK}. Use {op}_reference for wider rows."
        )
    if block >= 32768:
        num_warps = 32
    elif block >= 8192:
        num_warps = 16
    elif block >= 2048:
        num_warps = 8
    else:
        num_warps = 4
    return block, num_warps


def _limited(block: int) -> int:
    return block if BLOCK_LIMIT is None else min(block, BLOCK_LIMIT)


def loop_block(n: int, gpu_block: int) -> int:
    """BLOCK of a kernel that covers ``n`` elements in blocks (a loop over a row, or programs along it):
    ``gpu_block`` on the GPU, all of ``n`` (up to ``MAX_ROW_BLOCK``) under the interpreter, at most
    ``BLOCK_LIMIT`` on either."""
    return _limited(min(next_power_of_2(n), MAX_ROW_BLOCK) if interpreting() else gpu_block)


def elementwise_block() -> tuple[int, int]:
    """(BLOCK, num_warps) for a 1D elementwise kernel (BLOCK at most ``BLOCK_LIMIT``)."""
    if interpreting():
        return _limited(_INTERPRETER_ELEMENTWISE_BLOCK), 1
    return _limited(_ELEMENTWISE_BLOCK), _ELEMENTWISE_WARPS


@functools.lru_cache(maxsize=None)
def _device_properties(device_index: int) -> Any:
    return torch.cuda.get_device_properties(device_index)


def _properties(device: torch.device) -> Any:
    """A CUDA ``device``'s properties, read from the driver once per device."""
    return _device_properties(device.index if device.index is not None else torch.cuda.current_device())


def multiprocessor_count(device: torch.device) -> int:
    """The SMs of a CUDA ``device``."""
    return _properties(device).multi_processor_count


def shared_memory_per_block(device: torch.device) -> int:
    """Bytes of shared memory one program may use on a CUDA ``device``: the opt-in maximum (227 KiB on Hopper),
    which Triton's launches use; ROCm names only the default."""
    props = _properties(device)
    return int(getattr(props, "shared_memory_per_block_optin", getattr(props, "shared_memory_per_block", 49152)))


def persistent_programs(n_rows: int, device: torch.device, *, per_sm: int = 2) -> int:
    """Number of programs for a kernel that loops over rows and reduces across them (e.g. a
    weight gradient): a few per SM keeps every SM busy while the per-program partial sums stay
    few (they are summed by torch afterwards)."""
    if device.type == "cuda" and not interpreting():
        return max(1, min(n_rows, per_sm * multiprocessor_count(device)))
    return max(1, min(n_rows, 4))


def dot_options(dtype: torch.dtype, *, fp32_like_matmul: bool = False) -> dict[str, str | bool]:
    """The ``DOT_PRECISION`` and ``DOT_UPCAST`` constexprs of a kernel whose ``tl.dot`` operands are ``dtype``.

    ``DOT_PRECISION`` is ``tl.dot``'s ``input_precision``, which only fp32 operands read: ``"ieee"``,
    exact fp32 products (Triton's default rounds them to TF32, 10 mantissa bits, far outside an fp32
    tolerance), unless ``fp32_like_matmul`` asks to follow torch's float32 matmul precision as
    ``F.linear`` does (``"highest"``: exact, else ``"tf32"``). ``DOT_UPCAST``: the Triton interpreter
    (3.9) returns garbage (~1e10) for ``tl.dot`` of bf16 tiles, so there the operands go in as fp32
    copies (bf16 x bf16 products are exact in fp32: the result is the GPU's).
    """
    tf32 = dtype == torch.float32 and fp32_like_matmul and torch.get_float32_matmul_precision() != "highest"
    return {"DOT_PRECISION": "tf32" if tf32 else "ieee", "DOT_UPCAST": interpreting() and dtype == torch.bfloat16}


def run_with_scratch(device: torch.device, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` with Triton's allocator set to take kernels' global scratch memory from torch's allocator on
    ``device``: a kernel that builds a TMA descriptor on the device keeps it there, and its launch fails without
    an allocator. The allocator is set in a copy of the caller's context (Triton keeps it in a context
    variable), so an allocator the caller set is its own again after the call, and whichever thread runs the
    call (autograd's, for a backward) has one for it. A scratch tensor is freed when its launch returns: the
    caching allocator hands its memory out again only to work queued after that kernel on the same stream."""
    return contextvars.copy_context().run(_with_scratch, device, fn, args)


def _with_scratch(device: torch.device, fn: Callable[..., Any], args: tuple) -> Any:
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device=device))
    return fn(*args)


def rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` as a 2D [rows, last dim] tensor whose last dim has stride 1.

    Rows may have any stride (a slice of a wider tensor costs no copy); only layouts that cannot
    be viewed that way (e.g. a transposed last dim) are copied.
    """
    x2 = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
    if x2.shape[-1] > 1 and x2.stride(-1) != 1:
        x2 = x2.contiguous()
    return x2


# ----------------------------------------------------------------------------- the launch

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
        launcher[(rows,)](x, residual, weight, out, summed, stride_x, stride_r, stride_w, rows, n_cols, eps,
                          HAS_RESIDUAL=False, ROWS=1, BLOCK=1024, COMPUTE_DTYPE=tl.float32, num_warps=4)
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
        device = current_cuda_device()
        key = (types, device, specialization_key(plan, args), tuple(meta.items()))
        entry = self._compiled.get(key)
        if entry is None or self._pre_run_hooks or _hooks_active():
            self._launch_jit(key, grid, args, meta)
            return
        run, function, packed_metadata, tail = entry
        n = len(grid)
        run(grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1, current_cuda_raw_stream(device),
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
