"""Graph recorders the backend feeds (public face: :mod:`twinkle_fx.testing`)."""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field

import torch.fx as fx

__all__ = ["RecordedGraphs", "active_recorders", "RECORDERS"]


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


def readable(gm: fx.GraphModule) -> str:
    """The graph as PyTorch's expect tests show it (``print_readable``, normalised)."""
    from ..testing import normalize_gm

    return normalize_gm(gm.print_readable(print_output=False))
