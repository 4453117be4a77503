"""``torch.compile(..., backend="twinkle", options={...})``: the backend's options, validated."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from ..modes import Mode, format_mode, parse_mode

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
            example inputs at compile time; on a mismatch keep the original graph and report it.
        report (`bool`, defaults to `False`): log each graph's report at INFO level.
    """

    compiler: str = "inductor"
    mode: Mode | None = None
    verify: bool = False
    report: bool = False

    def describe_mode(self) -> str:
        return "auto" if self.mode is None else format_mode(self.mode)


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
    return BackendOptions(compiler, mode, options.get("verify", False), options.get("report", False))
