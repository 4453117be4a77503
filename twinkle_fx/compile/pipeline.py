"""The pass interface: a pass is ``run(state) -> list[Outcome]``; :func:`run_passes` runs a list of them.

Every pass reads and writes one :class:`PassState` (the graph and the facts about it, in named
fields) and answers one :class:`Swapped` or :class:`Kept` per candidate region it looked at.
Rewriting passes live in :mod:`twinkle_fx.compile.rewrites`, passes that only report in
:mod:`twinkle_fx.compile.analyses`. The runner times each pass (logged at DEBUG under the pass's
own logger) and, with ``TWINKLE_FX_DUMP_GRAPHS=<dir>`` or ``options={"dump_graphs": <dir>}``, writes
the graph before and after each pass::

    <dir>/graph_000/01_layer_regions.before.py
    <dir>/graph_000/01_layer_regions.after.py

A pass keeps a region by raising :class:`~twinkle_fx.compile.reasons.KeepRegion` anywhere below
its loop over regions (see :func:`region_outcome`); any other error on one region keeps that
region with the error as the reason, and the pass goes on with the next.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import torch.fx as fx

from ..modes import Mode
from ..registry import KernelRegistry
from .dynamo_internals import GraphBreak, ModuleLookup, real_input
from .reasons import KeepRegion, Reason, ReasonKind

__all__ = ["Swapped", "Kept", "Outcome", "PassState", "Pass", "run_passes", "region_outcome", "DUMP_ENV"]

logger = logging.getLogger(__name__)

DUMP_ENV = "TWINKLE_FX_DUMP_GRAPHS"


@dataclass(frozen=True)
class Swapped:
    """A candidate region now calls ``kernel`` (``how``: "custom op call" or an opaque wrapper)."""

    kind: str  # "layer" or "function"
    target: str  # "Qwen2RMSNorm -> RMSNorm", "my_pkg.math_ops.add"
    location: str  # module path or graph position
    kernel: str
    how: str
    match: str | None = None  # functions: "call", "copy" or "computation"


@dataclass(frozen=True)
class Kept:
    """A candidate region left as it is, and why."""

    kind: str
    target: str
    location: str
    reason: Reason
    kernel: str | None = None  # the kernel that was selected, when one was
    match: str | None = None


Outcome = Union[Swapped, Kept]


@dataclass
class PassState:
    """One graph under rewrite and everything the passes share, each in a field of its own."""

    gm: fx.GraphModule
    example_inputs: list[Any]
    registry: KernelRegistry
    device: str
    mode: Mode
    modules: ModuleLookup  # the one way to a module instance (see dynamo_internals)
    graph_break: GraphBreak | None = None  # why Dynamo ended this graph early, if it did
    compiled_code: types.CodeType | None = None  # the code of the frame this graph comes from
    counted_breaks: list[str] = field(default_factory=list)  # graph breaks Dynamo counted before this graph
    outcomes: list[Outcome] = field(default_factory=list)  # of the passes run so far (the runner appends)
    # nodes that a pattern match took (swapped or reported): the call analysis does not report them again
    pattern_nodes: set[fx.Node] = field(default_factory=set)
    # call nodes the rewrites inserted: no later pass looks into them
    kernel_calls: set[fx.Node] = field(default_factory=set)
    # region signature -> binding or the reason there is none: equal regions (24 layers) are bound once
    bindings: dict[tuple, Any] = field(default_factory=dict)
    # float module attributes Dynamo lifted to graph inputs that a swapped kernel was specialised to:
    # graph input position -> value (the compiled graph checks them on every call, see backend)
    baked_scalars: dict[int, float] = field(default_factory=dict)
    patterns: Any = None  # the registered functions' patterns (rewrites.function_patterns.registered_patterns)
    fuse_projections: Any = False  # the GEMM fusion decision: bool or rewrites.gemm_fusion.FusionLimits
    gqa_attention: bool | str = False  # which SDPA calls on repeated K/V to rewrite (rewrites.attention)
    causal_mask: bool = False  # SDPA with a constant causal mask -> is_causal=True (rewrites.attention)

    def __post_init__(self) -> None:
        placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        self.placeholder_values: dict[fx.Node, Any] = {
            n: real_input(n, value) for n, value in zip(placeholders, self.example_inputs)
        }


@dataclass(frozen=True)
class Pass:
    """A named pass; ``rewrites`` says whether it changes the graph (else it only reports)."""

    name: str
    run: Callable[[PassState], list[Outcome]]
    rewrites: bool


def region_outcome(swap: Callable[[], Swapped], kept: Callable[[Reason], Kept]) -> Outcome:
    """``swap()``, or ``kept(reason)`` when it raises: a :class:`KeepRegion` gives its reason, any
    other error keeps the region as PASS_FAILED (logged with its traceback at DEBUG) so one
    region's failure never stops the pass."""
    try:
        return swap()
    except KeepRegion as keep:
        return kept(keep.reason)
    except Exception as e:  # one region failed: keep it, say why, go on with the next region
        logger.debug("a pass failed on one region", exc_info=True)
        return kept(Reason(ReasonKind.PASS_FAILED, f"the pass failed on this region: {e!r}", e))


_GRAPH_COUNTER = itertools.count()
_COUNTER_LOCK = threading.Lock()


def _dump_dir(option: str | None) -> Path | None:
    directory = option or os.environ.get(DUMP_ENV)
    if not directory:
        return None
    with _COUNTER_LOCK:
        index = next(_GRAPH_COUNTER)
    path = Path(directory) / f"graph_{index:03d}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _dump(directory: Path | None, position: int, name: str, when: str, gm: fx.GraphModule) -> None:
    if directory is None:
        return
    from .recording import readable

    (directory / f"{position:02d}_{name}.{when}.py").write_text(readable(gm))


def run_passes(state: PassState, passes: tuple[Pass, ...], *, dump_graphs: str | None = None) -> dict[str, float]:
    """Run ``passes`` in order on ``state``; returns each pass's time in ms (outcomes land in ``state.outcomes``)."""
    timings: dict[str, float] = {}
    directory = _dump_dir(dump_graphs)
    if directory is not None:
        logger.info("writing the graph before and after each pass to %s", directory)
    for position, graph_pass in enumerate(passes, 1):
        _dump(directory, position, graph_pass.name, "before", state.gm)
        start = time.perf_counter()
        outcomes = graph_pass.run(state)
        timings[graph_pass.name] = elapsed = (time.perf_counter() - start) * 1e3
        state.outcomes.extend(outcomes)
        _dump(directory, position, graph_pass.name, "after", state.gm)
        logging.getLogger(graph_pass.run.__module__).debug(
            "%s: %d of %d candidate(s) swapped, %.1f ms", graph_pass.name,
            sum(isinstance(o, Swapped) for o in outcomes), len(outcomes), elapsed,
        )
    return timings
