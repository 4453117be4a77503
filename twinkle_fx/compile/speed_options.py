"""The backend options that decide speed rather than what is swapped: Inductor's own config, CUDA
graphs, GEMM fusion and the swap policy (checked here, used by :mod:`.inductor_options`,
:mod:`.gemm_fusion` and :mod:`.swap_policy`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .inductor_options import parse_inductor_options

__all__ = ["parse_speed_options", "SWAP_POLICIES", "FUSE_PROJECTIONS"]

SWAP_POLICIES = ("measured", "always")
FUSE_PROJECTIONS = (True, False, "auto")


def parse_speed_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The speed options of ``options`` as keyword arguments of ``BackendOptions``.

    Raises:
        ValueError: a bad value (the message names the option and the valid values).

    Example:
        >>> parse_speed_options({"cudagraphs": True})
        {'inductor': {}, 'cudagraphs': True, 'fuse_projections': 'auto', 'swap_policy': 'always'}
    """
    cudagraphs = options.get("cudagraphs", False)
    if not isinstance(cudagraphs, bool):
        raise ValueError(f"twinkle backend option cudagraphs must be True or False, got {cudagraphs!r}.")
    fuse = options.get("fuse_projections", "auto")
    if not any(fuse is v if isinstance(v, bool) else fuse == v for v in FUSE_PROJECTIONS):
        raise ValueError(f"twinkle backend option fuse_projections must be True, False or 'auto', got {fuse!r}.")
    # the same default as BackendOptions (and options=None): "always"; before, a dict without the key
    # got "measured", so options={"cudagraphs": True} and mode="reduce-overhead" swapped different regions
    policy = options.get("swap_policy", "always")
    if policy not in SWAP_POLICIES:
        raise ValueError(f"twinkle backend option swap_policy={policy!r}; valid: {', '.join(SWAP_POLICIES)}.")
    return {"inductor": parse_inductor_options(options.get("inductor")), "cudagraphs": cudagraphs,
            "fuse_projections": fuse, "swap_policy": policy}
