"""Graph recorders the backend feeds, and the readable form they record (public face:
:mod:`twinkle_fx.testing`)."""

from __future__ import annotations

import contextvars
import re
from dataclasses import dataclass, field

import torch.fx as fx

__all__ = ["RecordedGraphs", "active_recorders", "RECORDERS", "readable", "normalize_gm", "root_as_self"]


@dataclass
class RecordedGraphs:
    """Readable code of every graph one block compiled with the ``twinkle`` backend.

    ``before[i]`` / ``after[i]`` are Dynamo graph ``i`` before and after the rewrite;
    ``forward`` / ``backward`` are the AOTAutograd graphs (inner compiler ``aot_eager`` only;
    the backward appears once a backward pass has run).
    """

    before: list[str] = field(default_factory=list)
    after: list[str] = field(default_factory=list)
    forward: list[str] = field(default_factory=list)
    backward: list[str] = field(default_factory=list)


RECORDERS: contextvars.ContextVar[tuple[RecordedGraphs, ...]] = contextvars.ContextVar("twinkle_fx_recorders", default=())


def active_recorders() -> tuple[RecordedGraphs, ...]:
    return RECORDERS.get()


def root_as_self(code: str) -> str:
    """Graph code with the compiled module's inputs named as when Dynamo enters its ``forward``
    directly (``l_self_...``). A forward wrapped by a decorator taking ``*args`` (transformers 5.24
    wraps ``*ForCausalLM.forward`` so) reaches Dynamo as ``args[0]``, and every lifted parameter is
    then named ``l_args_0_...``: the same graph, named after how it was entered.

    Examples:
        >>> root_as_self("linear(x, l_args_0_modules_proj_parameters_weight_)")
        'linear(x, l_self_modules_proj_parameters_weight_)'
    """
    return re.sub(r"\b([lL])_args_0_", r"\1_self_", code)


def normalize_gm(code: str) -> str:
    """``print_readable`` output without comments and trailing spaces (PyTorch's ``normalize_gm``),
    the compiled module's inputs named ``l_self_...`` however Dynamo entered it (:func:`root_as_self`).

    Comments carry file paths and line numbers, which differ between machines.
    """
    lines = []
    for line in root_as_self(code).splitlines():
        stripped = re.sub(r"\s*#.*$", "", line) if line.lstrip().startswith("#") or " # " in line else line
        stripped = stripped.rstrip()
        if stripped or (lines and lines[-1]):
            lines.append(stripped)
    return "\n".join(lines).strip("\n") + "\n"


def readable(gm: fx.GraphModule) -> str:
    """The graph as PyTorch's expect tests show it (``print_readable``, normalised)."""
    return normalize_gm(gm.print_readable(print_output=False))
