"""``torch.compile(..., backend="twinkle", options={...})``: the backend's options, validated."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from ..core.modes import Mode, parse_mode

__all__ = ["BackendOptions", "parse_options", "COMPILERS"]

COMPILERS = ("inductor", "aot_eager", "eager")


@dataclass(frozen=True)
class BackendOptions:
    """Options of the ``twinkle`` backend.

    Args:
        compiler (`str`, defaults to `"inductor"`): the inner compiler the rewritten graph goes to:
            "inductor", "aot_eager" or "eager".
        mode (*optional*): "train", "inference", "train+compile", ... (the compile flag is implied).
            Default: training when grad is enabled and a graph input (a parameter) requires grad,
            else inference.
        verify (`bool`, defaults to `False`): run the graph before and after the rewrite on the
            example inputs at compile time, and a graph with dynamic shapes also at an odd size of
            each dynamic dimension (or a WARNING says only the example shapes were checked); on a
            mismatch keep the original graph and report it. See :mod:`.verify`.
        report (`bool`, defaults to `False`): log each graph's report at INFO level.
        inductor (`dict`, *optional*): ``torch._inductor.config`` patches for the inner Inductor
            ("max_autotune", "freezing", ...); see :mod:`.inductor_options`.
        cudagraphs (`bool`, defaults to `False`): CUDA graphs, as torch.compile's
            ``mode="reduce-overhead"`` (which cannot be given together with ``options=``).
        fuse_projections (`bool` or `"auto"`, defaults to `"auto"`): one GEMM for the linears that
            read the same input (q/k/v, gate/up); "auto" where measured to pay, see :mod:`.gemm_fusion`.
        gqa_attention (`bool` or `"auto"`, defaults to `"auto"`): SDPA on key/value repeated to the
            query's heads (transformers' ``repeat_kv``) becomes one grouped-query attention kernel
            that reads each KV head once; "auto" for queries of at most 16 tokens (decode steps),
            see :mod:`.rewrites.attention`.
        causal_mask (`bool`, defaults to `True`): SDPA given a causal mask that depends on no input
            (transformers materialises one under torch.compile) runs with ``is_causal=True`` instead,
            i.e. flash attention over the lower half, see :mod:`.rewrites.attention`.
        swap_policy (`str`, defaults to `"always"`): "always" swaps every region; "measured" keeps
            Inductor's code where a kernel was measured slower than Inductor's at that shape (a per-op
            table from one H100, :mod:`.swap_policy`; not yet shown to win end to end, so opt-in).
        dump_graphs (`str`, *optional*): a directory; the graph before and after each pass is written
            there (as ``TWINKLE_FX_DUMP_GRAPHS=<dir>`` does), see :mod:`.pipeline`.
    """

    compiler: str = "inductor"
    mode: Mode | None = None
    verify: bool = False
    report: bool = False
    # the speed options: Inductor passthrough, CUDA graphs, GEMM fusion, swap policy
    inductor: dict = field(default_factory=dict)
    cudagraphs: bool = False
    fuse_projections: bool | str = "auto"
    gqa_attention: bool | str = "auto"
    causal_mask: bool = True
    swap_policy: str = "always"
    dump_graphs: str | None = None


def parse_options(options: Mapping[str, Any] | None) -> BackendOptions:
    """Validate ``options`` (unknown keys and bad values raise ValueError naming them)."""
    if options is None:
        return BackendOptions()
    if not isinstance(options, Mapping):
        raise ValueError(f"twinkle backend options must be a dict, got {type(options).__name__}.")
    valid = [f.name for f in fields(BackendOptions)]
    for key in options:
        if key not in valid:
            raise ValueError(f"Unknown twinkle backend option {key!r}; valid options: {', '.join(valid)}.")
    compiler = options.get("compiler", "inductor")
    if compiler not in COMPILERS:
        raise ValueError(f"twinkle backend option compiler={compiler!r}; valid compilers: {', '.join(COMPILERS)}.")
    mode = options.get("mode")
    if mode is not None:
        mode = parse_mode(mode) | Mode.TORCH_COMPILE
    for key in ("verify", "report"):
        if not isinstance(options.get(key, False), bool):
            raise ValueError(f"twinkle backend option {key} must be True or False, got {options[key]!r}.")
    dump_graphs = options.get("dump_graphs")
    if dump_graphs is not None and not isinstance(dump_graphs, (str, os.PathLike)):
        raise ValueError(f"twinkle backend option dump_graphs must be a directory path, got {dump_graphs!r}.")
    from .speed_options import parse_speed_options

    return BackendOptions(compiler, mode, options.get("verify", False), options.get("report", False),
                          **parse_speed_options(options), dump_graphs=None if dump_graphs is None else os.fspath(dump_graphs))
