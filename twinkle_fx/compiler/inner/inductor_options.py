"""Inductor under the ``twinkle`` backend: its options, CUDA graphs, and whether each graph was captured.

The rewritten graph goes to Inductor with the configuration the user asked for, combined in this
order (later wins):

1. torch.compile's own ``mode=`` ("reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"),
   expanded by ``torch._inductor.list_mode_options`` exactly as ``backend="inductor"`` does;
2. ``options={"cudagraphs": True}`` (the same as ``mode="reduce-overhead"``, for callers that also
   pass other twinkle options: torch.compile refuses ``mode`` and ``options`` together);
3. ``options={"inductor": {...}}``: any ``torch._inductor.config`` key ("max_autotune",
   "freezing", "triton.cudagraphs", "coordinate_descent_tuning", ...), checked against the
   installed Inductor by :func:`~twinkle_fx.compiler.options.parse_options`, so a typo is an error,
   not a silent no-op.

Every graph Inductor compiles (forward, backward, inference) is recorded as a
:class:`CudaGraphStatus`: CUDA graphs requested or not, used or not, and Inductor's own reason when
it skipped them ("mutated inputs", "cpu device", "non-static input pointers", ...).

Examples:
    >>> with collect_cudagraph_status() as cudagraphs:                        # doctest: +SKIP
    ...     torch.compile(model, backend="twinkle", mode="reduce-overhead")(input_ids)
    >>> print(cudagraphs.summary())                                            # doctest: +SKIP
    CUDA graphs used by 1 of 1 compiled graph(s)
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch.fx as fx

from ...core.torch_internals import (POST_GRAD_PRE_PASS, clear_static_input, cudagraph_tree_manager,
                                    cudagraphs_logger, dynamo_source, inductor_compile, inductor_config_patch,
                                    inductor_config_values, inductor_cudagraphs_requested, inductor_inner_compiler,
                                    inductor_mode_options, inductor_post_grad_pre_pass, is_static_input)
from . import ttir_memo
from .post_grad import PostGradRewrite, with_rewrites

logger = logging.getLogger(__name__)

__all__ = [
    "CudaGraphStatus", "CudaGraphReport", "collect_cudagraph_status", "inductor_config_patches",
    "compile_with_inductor", "cudagraph_tree_summary", "unpin_fsdp_parameters",
]


def inductor_config_patches(mode: str | None, cudagraphs: bool, inductor: Mapping[str, Any],
                            dependent_launch: bool = False) -> dict[str, Any]:
    """Inductor config patches for torch.compile's ``mode``, the ``cudagraphs`` option and the
    ``inductor`` options, in that order of precedence (see the module docstring). ``dependent_launch``:
    Inductor's kernels launch as programmatic dependents (``triton.enable_pdl``) unless ``inductor`` says
    otherwise, where this Inductor has the option and the current CUDA device takes them (compute
    capability 9.0 and later).

    Examples:
        >>> inductor_config_patches("max-autotune-no-cudagraphs", True, {"coordinate_descent_tuning": False})
        ... # doctest: +NORMALIZE_WHITESPACE
        {'max_autotune': True, 'coordinate_descent_tuning': False, 'triton.cudagraphs': True}
    """
    patches: dict[str, Any] = inductor_mode_options(mode) if mode else {}
    if dependent_launch and _takes_dependent_launch():
        patches[DEPENDENT_LAUNCH] = True
    if cudagraphs:
        patches["triton.cudagraphs"] = True
    patches.update(inductor)
    return patches


# Inductor's option for programmatic dependent launch (torch 2.10 and later). A decode step is a chain of small
# kernels: the Triton kernels of its graph rewrites launch this way (twinkle_triton._dependent_launch), and an
# Inductor kernel between two of them that does not (the positions and masks of a step, the cache length's update)
# makes the next one wait for its full launch and drain. Its kernels then wait (griddepcontrol.wait) before
# reading what the kernel before wrote, as ours do.
DEPENDENT_LAUNCH = "triton.enable_pdl"


def _takes_dependent_launch() -> bool:
    import torch

    return (DEPENDENT_LAUNCH in inductor_config_values() and torch.cuda.is_available()
            and torch.cuda.get_device_capability()[0] >= 9)


@dataclass
class CudaGraphStatus:
    """What happened to CUDA graphs for one graph Inductor compiled.

    ``kind`` is "forward", "backward" or "inference"; ``graph`` numbers the Dynamo graphs the
    backend handed to Inductor in this process (a forward and its backward share it); ``used`` whether Inductor wraps the graph in a
    CUDA graph (recorded on its first runs, replayed after); ``reason`` Inductor's own words when
    it did not.
    """

    graph: int
    kind: str
    requested: bool
    used: bool
    reason: str | None = None

    def __str__(self) -> str:
        head = f"{self.kind} graph {self.graph}: "
        if not self.requested:
            return head + "CUDA graphs not requested"
        return head + ("CUDA graphs used" if self.used else f"CUDA graphs skipped: {self.reason or 'no reason given'}")


@dataclass
class CudaGraphReport:
    """CUDA graphs in one block: ``graphs`` has a :class:`CudaGraphStatus` for each graph Inductor
    compiled in it (none for a graph loaded whole from AOTAutograd's cache); ``skips`` has every
    "skipping cudagraphs due to ..." Inductor logged, at compile time or at run time, cached or not.
    """

    graphs: list[CudaGraphStatus] = field(default_factory=list)
    skips: list[str] = field(default_factory=list)

    def summary(self) -> str:
        requested = [g for g in self.graphs if g.requested]
        used = sum(g.used for g in requested)
        if requested:
            text = f"CUDA graphs used by {used} of {len(requested)} compiled graph(s)"
        else:  # backend="inductor" itself, or every graph loaded from a cache: only Inductor's log speaks
            text = "no graph compiled through the twinkle backend; Inductor logged " + (
                "these CUDA-graph skips" if self.skips else "no CUDA-graph skip")
        if self.skips:
            reasons = Counter(self.skips)
            text += "; skipped: " + "; ".join(f"{n} x {why}" for why, n in reasons.items())
        return text


class _SkipRecorder(logging.Filter):
    """Observes Inductor's cudagraph skip messages (passes every record through unchanged)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for report in _collectors:
            report.skips.append(record.getMessage())
        return True


_collectors: list[CudaGraphReport] = []
_graph_counter = [0]


@contextlib.contextmanager
def collect_cudagraph_status() -> Iterator[CudaGraphReport]:
    """Collect what happened to CUDA graphs for every graph the twinkle backend hands to Inductor
    while the block runs (backward graphs are compiled at the first backward; CUDA graphs are
    recorded on the first runs), as a :class:`CudaGraphReport`."""
    cudagraphs_log = cudagraphs_logger()
    report = CudaGraphReport()
    recorder = _SkipRecorder()
    _collectors.append(report)
    cudagraphs_log.addFilter(recorder)
    try:
        yield report
    finally:
        cudagraphs_log.removeFilter(recorder)
        _collectors.remove(report)


def _recording_inner_compile(graph_index: int, requested: bool) -> Callable[..., Any]:
    compile_fx_inner = inductor_inner_compiler()

    def inner_compile(gm: fx.GraphModule, example_inputs: Any, *args: Any, **kwargs: Any) -> Any:
        # the backward graph is compiled here at the first backward, outside compile_with_inductor
        with ttir_memo.memoized_ttir():
            compiled = compile_fx_inner(gm, example_inputs, *args, **kwargs)
        kind = "backward" if kwargs.get("is_backward") else "inference" if kwargs.get("is_inference") else "forward"
        boxed = kwargs.get("cudagraphs")
        used = bool(requested and boxed is not None and bool(boxed))
        reason = None
        if requested and not used:
            reason = getattr(compiled, "disabled_cudagraphs_reason", None)
            info = getattr(compiled, "cudagraph_info", None)
            if reason is None and info is not None and info.cudagraph_fail_reasons:
                reason = "; ".join(info.cudagraph_fail_reasons)
        status = CudaGraphStatus(graph_index, kind, requested, used, reason)
        logger.info("%s", status)
        for report in _collectors:
            report.graphs.append(status)
        return compiled

    return inner_compile


def unpin_fsdp_parameters(gm: fx.GraphModule) -> int:
    """Let CUDA graphs copy FSDP-managed parameters in at each replay instead of reading them where they
    were recorded; returns how many of ``gm``'s inputs that concerns.

    Dynamo marks every ``nn.Parameter`` a static input: a CUDA graph reads it at the address it was
    recorded with, and Inductor's CUDA-graph trees record the graph again when the address changes.
    FSDP2 frees a layer's gathered parameters after its backward (by default after its forward too) and
    gathers them into fresh memory. Measured on an H100 (the reference model under FSDP2 in a
    world of one, its 24 layers compiled regionally, 20 steps): 192 to 240 graphs recorded instead of 48,
    with re-recording steps of 1.7 s; with ``reshard_after_forward=False`` 866 graphs and a median step
    of 1.6 s. Unmarked, such a parameter is an ordinary input, copied into the graph's own buffer at each
    replay (30 MB a layer of that model): 48 graphs, no re-recording, median steps of 95 ms (72 ms with
    ``reshard_after_forward=False``) against 125 ms without CUDA graphs, 15 steps each. Only the graph's
    metadata changes (Dynamo's copy of the tensor's attributes), not the parameter. The twinkle backend
    calls it for every graph it compiles with CUDA graphs; ``backend="inductor"`` does not.
    """
    unpinned = 0
    for node in gm.graph.find_nodes(op="placeholder"):
        if is_static_input(node) and _from_fsdp_module(dynamo_source(node)):
            clear_static_input(node)
            unpinned += 1
    return unpinned


def _from_fsdp_module(source: Any) -> bool:
    try:
        return source is not None and source.guard_source.is_fsdp_module()
    except NotImplementedError:  # a Source kind without a guard source (the base class's): not a module's
        return False


def compile_with_inductor(gm: fx.GraphModule, example_inputs: list[Any], patches: dict[str, Any], *,
                          rewrites: Sequence[PostGradRewrite] = ()) -> Callable[..., Any]:
    """``compile_fx`` with ``patches`` applied, recording each compiled graph's CUDA-graph status;
    ``rewrites``: the backend's rewrites of the graphs AOTAutograd hands Inductor (:mod:`.post_grad`), a
    post-grad pass run before any the user set."""
    if rewrites:
        with inductor_config_patch(patches):
            existing = inductor_post_grad_pre_pass()
        patches = {**patches, POST_GRAD_PRE_PASS: with_rewrites(existing, rewrites)}
    with inductor_config_patch(patches):
        requested = inductor_cudagraphs_requested()
    if requested and (copied := unpin_fsdp_parameters(gm)):
        logger.info("CUDA graphs: %d FSDP-managed parameter(s) copied into the graph at each replay", copied)
    graph_index = _graph_counter[0]
    _graph_counter[0] += 1
    with ttir_memo.memoized_ttir():  # AOTAutograd's traces analyse every triton_op launch (see ttir_memo)
        return inductor_compile(gm, example_inputs, inner_compile=_recording_inner_compile(graph_index, requested),
                                config_patches=patches or None)


def cudagraph_tree_summary(device_index: int | None = None) -> str:
    """What Inductor's CUDA-graph trees hold on one GPU right now: how many CUDA graphs were
    recorded, of which kind (forward, backward, inference), how many compiled functions ran but
    were never recorded (they run eagerly: Inductor logged why, see :class:`CudaGraphReport`), and
    how many times a graph was re-recorded. Works for ``backend="inductor"`` too, whose graphs
    :func:`collect_cudagraph_status` does not see. Call it before ``torch._dynamo.reset()``, which
    drops the trees.

    Examples:
        >>> compiled = torch.compile(model, mode="reduce-overhead")             # doctest: +SKIP
        >>> for _ in range(3):                                                   # doctest: +SKIP
        ...     model.zero_grad(set_to_none=True); compiled(input_ids=ids, labels=ids).loss.backward()
        >>> cudagraph_tree_summary()                                             # doctest: +SKIP
        'cuda:0: 2 CUDA graph(s) recorded (1 forward, 1 backward); every compiled function recorded; 0 re-recording(s)'
    """
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device: no CUDA graphs"
    index = torch.cuda.current_device() if device_index is None else device_index
    manager = cudagraph_tree_manager(index)
    if manager is None:
        return f"cuda:{index}: no CUDA-graph tree (nothing ran with CUDA graphs)"
    nodes, stack = [], [n for roots in manager.roots.values() for n in roots]
    while stack:
        node = stack.pop()
        nodes.append(node)
        stack.extend(n for children in node.children.values() for n in children)
    kinds = Counter(manager.id_to_mode[n.wrapped_function.id].name.lower() for n in nodes)
    recorded = {n.wrapped_function.id for n in nodes}
    never = [f for f in manager.ids_to_funcs if f not in recorded]
    rerecords = sum(sum(per_node.values()) for per_node in getattr(manager, "num_rerecord", {}).values())
    text = f"cuda:{index}: {len(nodes)} CUDA graph(s) recorded"
    if kinds:
        text += " (" + ", ".join(f"{kinds[kind]} {kind}" for kind in ("forward", "backward", "inference") if kinds[kind]) + ")"
    text += "; " + (f"{len(never)} of {len(manager.ids_to_funcs)} compiled function(s) never recorded (run eagerly)"
                    if never else "every compiled function recorded")
    return text + f"; {rerecords} re-recording(s)"
