"""The pass interface: a pass is ``run(state) -> list[Outcome]``; :func:`run_passes` runs a list of them.

Every pass reads one :class:`PassState` (the graph and the facts about it, in named fields, and
the backend's :class:`~twinkle_fx.compiler.options.BackendOptions`), writes what later passes need
in its :class:`PassScratch`, and answers one :class:`Swapped` or :class:`Kept` per candidate
region it looked at. The passes, those that rewrite and those that only report, live in
:mod:`twinkle_fx.compiler.passes`. The runner times each pass (logged at DEBUG under the pass's
own logger) and, with ``TWINKLE_FX_DUMP_GRAPHS=<dir>`` or ``options={"dump_graphs": <dir>}``, writes
the graph before and after each pass::

    <dir>/graph_000/01_layer_regions.before.py
    <dir>/graph_000/01_layer_regions.after.py

Code under ``torch.utils.checkpoint`` (transformers checkpoints each decoder layer once gradient
checkpointing is on) reaches the backend as a subgraph, the body of a ``tag_activation_checkpoint``
call: every pass not marked ``outer_only`` runs on each such body too, right after the outer
graph, with a :class:`PassState` of its own (:func:`checkpoint_states`). The rewritten body stays
in the call, so the checkpointing (recompute in backward) is kept.

A pass keeps a region by raising :class:`~twinkle_fx.compiler.regions.region.KeepRegion` anywhere below
its loop over regions (see :func:`~twinkle_fx.compiler.regions.region.region_outcome`); any other error
on one region keeps that region with the error as the reason, and the pass goes on with the next.
"""

from __future__ import annotations

import dataclasses
import functools
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

from ..core.modes import Mode
from ..core.reasons import Reason
from ..core.registry import KernelRegistry
from .graph.dynamo import ModuleLookup, example_value, input_source, real_input
from .graph.structure import GraphBreak, checkpoint_bodies
from .options import BackendOptions
from .regions.pattern_tracing import RegisteredPatterns
from .regions.region import Binding

__all__ = ["Swapped", "Kept", "Outcome", "GraphInput", "PassState", "PassScratch", "Pass", "run_passes", "checkpoint_states",
           "DUMP_ENV"]

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


@dataclass(frozen=True)
class GraphInput:
    """An input of the graph Dynamo handed the backend: its position among the example inputs, and
    where Dynamo read it (:func:`~.graph.dynamo.input_source`)."""

    position: int
    source: str | None


@dataclass
class PassScratch:
    """What the passes leave for the later ones while one graph is rewritten (shared by the graph and
    its checkpoint bodies)."""

    outcomes: list[Outcome] = field(default_factory=list)  # of the passes run so far (the runner appends)
    # nodes that a pattern match took (swapped or reported): the call analysis does not report them again
    pattern_nodes: set[fx.Node] = field(default_factory=set)
    # call nodes the rewrites inserted: no later pass looks into them
    kernel_calls: set[fx.Node] = field(default_factory=set)
    # region signature -> binding or the reason there is none: equal regions (24 layers) are bound once
    bindings: dict[tuple, Binding | Reason] = field(default_factory=dict)
    # float module attributes Dynamo lifted to graph inputs that a swapped kernel was specialised to:
    # graph input position -> value (the compiled graph checks them on every call, see backend)
    baked_scalars: dict[int, float] = field(default_factory=dict)
    # the registered functions' patterns, traced by the first pass that needs them
    patterns: RegisteredPatterns | None = None


@dataclass(frozen=True)
class PassState:
    """One graph under rewrite: the facts about it in fields of their own, the backend's options, and
    the :class:`PassScratch` the passes pass on to each other."""

    gm: fx.GraphModule
    example_inputs: list[Any]
    registry: KernelRegistry
    device: str
    mode: Mode
    modules: ModuleLookup  # the one way to a module instance (see dynamo_internals)
    options: BackendOptions = field(default_factory=BackendOptions)
    graph_break: GraphBreak | None = None  # why Dynamo ended this graph early, if it did
    compiled_code: types.CodeType | None = None  # the code of the frame this graph comes from
    counted_breaks: tuple[str, ...] = ()  # graph breaks Dynamo counted before this graph
    scratch: PassScratch = field(default_factory=PassScratch)
    # in a checkpoint body: the state of the graph that calls it, and the node of that graph passed
    # to each of the body's placeholders (see checkpoint_states)
    outer: PassState | None = None
    outer_inputs: dict[fx.Node, Any] = field(default_factory=dict)

    @functools.cached_property
    def placeholder_values(self) -> dict[fx.Node, Any]:
        """Each placeholder of ``gm`` and the example value it holds (the real tensor where Dynamo has one)."""
        placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        return {n: real_input(n, value) for n, value in zip(placeholders, self.example_inputs)}

    @property
    def root(self) -> PassState:
        """The state of the graph Dynamo handed the backend (``self`` outside checkpoint bodies)."""
        return self if self.outer is None else self.outer.root

    @functools.cached_property
    def graph_inputs(self) -> dict[fx.Node, GraphInput]:
        """The input of the graph Dynamo handed the backend that each placeholder of ``gm`` is: each of
        that graph's placeholders itself, the graph input passed to a checkpoint body's placeholder;
        a body placeholder fed by a value computed in the outer graph is none."""
        placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        if self.outer is None:
            return {n: GraphInput(position, input_source(n)) for position, n in enumerate(placeholders)}
        outer = self.outer.graph_inputs
        passed = {n: self.outer_inputs.get(n) for n in placeholders}
        return {n: outer[p] for n, p in passed.items() if isinstance(p, fx.Node) and p in outer}


@dataclass(frozen=True)
class Pass:
    """A named pass; ``rewrites`` says whether it changes the graph (else it only reports);
    ``outer_only``: it answers for the graph as a whole (its inputs, where it ends), so it does not
    run again on checkpoint bodies."""

    name: str
    run: Callable[[PassState], list[Outcome]]
    rewrites: bool
    outer_only: bool = False


def checkpoint_states(state: PassState) -> list[PassState]:
    """A state for each activation-checkpoint body in ``state``'s graph, nested ones included (outer first).

    A body's state shares everything with ``state`` (registry, module lookup, options, scratch) but its graph: each body placeholder holds what the outer graph passes to it, the
    real tensor where that is a graph input (a parameter is then recognised as the module's own).
    """
    states = []
    for found in checkpoint_bodies(state.gm):
        inputs = found.inputs
        values = [state.placeholder_values[v] if isinstance(v, fx.Node) and v in state.placeholder_values
                  else example_value(v) if isinstance(v, fx.Node) else v for v in inputs.values()]
        body = dataclasses.replace(state, gm=found.body, example_inputs=values, outer=state, outer_inputs=inputs)
        states.append(body)
        states.extend(checkpoint_states(body))
    return states


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
    from .graph.recording import readable

    (directory / f"{position:02d}_{name}.{when}.py").write_text(readable(gm))


def run_passes(state: PassState, passes: tuple[Pass, ...], *, dump_graphs: str | None = None) -> dict[str, float]:
    """Run ``passes`` in order on ``state``; returns each pass's time in ms (outcomes land in ``state.scratch.outcomes``)."""
    timings: dict[str, float] = {}
    directory = _dump_dir(dump_graphs)
    if directory is not None:
        logger.info("writing the graph before and after each pass to %s", directory)
    for position, graph_pass in enumerate(passes, 1):
        _dump(directory, position, graph_pass.name, "before", state.gm)
        start = time.perf_counter()
        outcomes = graph_pass.run(state)
        state.scratch.outcomes.extend(outcomes)  # before the bodies: a pass skips what it already reported
        if not graph_pass.outer_only:
            for body in checkpoint_states(state):
                found = graph_pass.run(body)
                state.scratch.outcomes.extend(found)
                outcomes = outcomes + found
                body.gm.graph.lint()
                body.gm.recompile()
        timings[graph_pass.name] = elapsed = (time.perf_counter() - start) * 1e3
        _dump(directory, position, graph_pass.name, "after", state.gm)
        logging.getLogger(graph_pass.run.__module__).debug(
            "%s: %d of %d candidate(s) swapped, %.1f ms", graph_pass.name,
            sum(isinstance(o, Swapped) for o in outcomes), len(outcomes), elapsed,
        )
    return timings
