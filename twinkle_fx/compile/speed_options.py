"""The backend options that decide speed rather than what is swapped: Inductor's own config, CUDA
graphs, GEMM fusion and the swap policy (checked here, used by :mod:`.inductor_options`,
:mod:`.gemm_fusion` and :mod:`.swap_policy`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .inductor_options import parse_inductor_options
from .rewrites.attention import GQA_ATTENTION

__all__ = ["parse_speed_options", "SWAP_POLICIES", "FUSE_PROJECTIONS"]

SWAP_POLICIES = ("measured", "always")
FUSE_PROJECTIONS = (True, False, "auto")


def parse_speed_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The speed options of ``options`` as keyword arguments of ``BackendOptions``.

    Raises:
        ValueError: a bad value (the message names the option and the valid values).

    Example:
        >>> parse_speed_options({"cudagraphs": True})
        {'inductor': {}, 'cudagraphs': True, 'fuse_projections': 'auto', 'gqa_attention': 'auto', 'causal_mask': True, 'swap_policy': 'always'}
    """
    cudagraphs = options.get("cudagraphs", False)
    if not isinstance(cudagraphs, bool):
        raise ValueError(f"twinkle backend option cudagraphs must be True or False, got {cudagraphs!r}.")
    fuse = options.get("fuse_projections", "auto")
    if not any(fuse is v if isinstance(v, bool) else fuse == v for v in FUSE_PROJECTIONS):
        raise ValueError(f"twinkle backend option fuse_projections must be True, False or 'auto', got {fuse!r}.")
    gqa = options.get("gqa_attention", "auto")
    if not any(gqa is v if isinstance(v, bool) else gqa == v for v in GQA_ATTENTION):
        raise ValueError(f"twinkle backend option gqa_attention must be True, False or 'auto', got {gqa!r}.")
    causal = options.get("causal_mask", True)
    if not isinstance(causal, bool):
        raise ValueError(f"twinkle backend option causal_mask must be True or False, got {causal!r}.")
    # the same default as BackendOptions (and options=None): "always"; before, a dict without the key
    # got "measured", so options={"cudagraphs": True} and mode="reduce-overhead" swapped different regions
    policy = options.get("swap_policy", "always")
    if policy not in SWAP_POLICIES:
        raise ValueError(f"twinkle backend option swap_policy={policy!r}; valid: {', '.join(SWAP_POLICIES)}.")
    return {"inductor": parse_inductor_options(options.get("inductor")), "cudagraphs": cudagraphs,
            "fuse_projections": fuse, "gqa_attention": gqa, "causal_mask": causal,
            "swap_policy": policy}
