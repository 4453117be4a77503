"""Launch helpers shared by the kernels: block sizes, warps, grid sizes, compute dtype, row views.

Performance choices (untuned heuristics until measured on the device; see README.md):
- row kernels (norms, cross-entropy) put a whole row in one block, BLOCK = next_power_of_2(hidden),
  and scale num_warps with BLOCK so each thread holds a few 16-byte vectors (Liger's and Apex's
  choice for memory-bound row reductions);
- elementwise kernels use 1D blocks of 1024 elements with 4 warps: 8 elements a thread, one 16-byte
  load for bf16/fp16, two for fp32, which is what reaches copy bandwidth for streaming kernels;
- under the Triton interpreter (TRITON_INTERPRET=1, CPU) every program is a Python loop iteration
  over numpy arrays, so the same kernels run with few, large programs there.
"""

import functools
import os

import torch
import triton
import triton.language as tl

# Largest row a row kernel keeps in registers (64K fp32 elements, 16 per thread at 32 warps).
MAX_ROW_BLOCK = 65536

_ELEMENTWISE_BLOCK = 1024
_ELEMENTWISE_WARPS = 4
# Under the interpreter, programs are slow Python iterations: a big block keeps them few.
_INTERPRETER_ELEMENTWISE_BLOCK = 16384


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


FLOATING = "floating"  # float16, bfloat16, float32, float64
REAL = "real"  # FLOATING, integers and bool (not complex)
ANY_DTYPE = "any"


def check_tensors(op: str, *, dtypes: str = FLOATING, min_dim: int = 0, **tensors: torch.Tensor | None) -> None:
    """Refuse arguments a kernel would misread where torch computes or refuses them: a non-tensor, a
    dtype outside ``dtypes`` (:data:`FLOATING`, :data:`REAL` or :data:`ANY_DTYPE`), fewer than
    ``min_dim`` dimensions, or tensors on different devices (meta with real ones included). ``None``
    (an optional tensor left out) passes.

    Raises:
        TypeError: an argument is not a tensor or has a dtype outside ``dtypes``; the error names it.
        ValueError: an argument has too few dimensions or another device than the first; the error names it.

    Example:
        ```python
        check_tensors("rms_norm", min_dim=1, x=x, weight=weight)
        ```
    """
    first_name = device = None
    for name, t in tensors.items():
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} is a {type(t).__name__}, not a torch.Tensor; pass a tensor "
                            f"(e.g. torch.as_tensor({name}, dtype=..., device=...)).")
        if dtypes != ANY_DTYPE and not t.is_floating_point() and (dtypes == FLOATING or t.is_complex()):
            wanted = "a floating-point" if dtypes == FLOATING else "a real (floating, integer or bool)"
            raise TypeError(f"{op}: {name} has dtype {t.dtype}; pass {wanted} tensor (the kernel computes "
                            "no other dtype).")
        if t.dim() < min_dim:
            raise ValueError(f"{op}: {name} is a {t.dim()}-D tensor of shape {tuple(t.shape)}; pass at least "
                             f"{min_dim}-D (the last dimension is the one the op works along).")
        if device is None:
            first_name, device = name, t.device
        elif t.device != device:
            raise ValueError(f"{op}: {name} is on {t.device} but {first_name} is on {device}; pass every "
                             "tensor on one device.")


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


def elementwise_block() -> tuple[int, int]:
    """(BLOCK, num_warps) for a 1D elementwise kernel."""
    if interpreting():
        return _INTERPRETER_ELEMENTWISE_BLOCK, 1
    return _ELEMENTWISE_BLOCK, _ELEMENTWISE_WARPS


@functools.lru_cache(maxsize=None)
def _multiprocessor_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def persistent_programs(n_rows: int, device: torch.device, *, per_sm: int = 2) -> int:
    """Number of programs for a kernel that loops over rows and reduces across them (e.g. a
    weight gradient): a few per SM keeps every SM busy while the per-program partial sums stay
    few (they are summed by torch afterwards)."""
    if device.type == "cuda" and not interpreting():
        return max(1, min(n_rows, per_sm * _multiprocessor_count(device.index or 0)))
    return max(1, min(n_rows, 4))


def rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` as a 2D [rows, last dim] tensor whose last dim has stride 1.

    Rows may have any stride (a slice of a wider tensor costs no copy); only layouts that cannot
    be viewed that way (e.g. a transposed last dim) are copied.
    """
    x2 = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
    if x2.shape[-1] > 1 and x2.stride(-1) != 1:
        x2 = x2.contiguous()
    return x2
