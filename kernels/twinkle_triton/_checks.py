"""The argument check every public function runs before its op: tensors a kernel would misread are
refused where torch computes or refuses them differently, with an error that names the argument."""

import torch

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
