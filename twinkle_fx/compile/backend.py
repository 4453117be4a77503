"""The ``twinkle`` backend: a short list of graph passes, then the inner compiler.

>>> compiled = torch.compile(model, backend="twinkle",
...                          options={"compiler": "aot_eager", "mode": "train"})   # doctest: +SKIP

Passes, in order (each in the file named after what it matches; each logs its count and time):

1. ``graph_breaks``: a graph break inside a registered layer or function is reported;
2. ``layer_regions``: regions of registered nn.Module classes become one kernel call each;
3. ``function_patterns``: the patterns of registered functions become one kernel call each;
4. ``function_regions``: calls of registered functions (by stack trace) left unswapped are
   reported with the reason.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx

from ..modes import Mode, format_mode
from ..registry import get_registry
from ..settings import DISABLE_ENV, kernels_disabled
from . import verify as verification
from .compiled_root import report_compiled_root
from .function_patterns import swap_function_patterns
from .function_regions import report_function_regions
from .gemm_fusion import fuse_projections, should_fuse
from .graph_breaks import note_graph_break
from .inductor_options import compile_with_inductor, inductor_config_patches
from .layer_regions import swap_layer_regions
from .options import BackendOptions, parse_options
from .recording import RecordedGraphs, active_recorders, readable
from .regions import GraphContext, ModuleIndex, module_roots
from .report import GraphReport, RegionReport, active_reports
from .swap_policy import active_policy

logger = logging.getLogger(__name__)

__all__ = ["twinkle_backend"]

Pass = Callable[[GraphContext, list[RegionReport]], Any]
PASSES: tuple[tuple[str, Pass], ...] = (
    ("graph_breaks", note_graph_break),
    ("layer_regions", swap_layer_regions),
    ("function_patterns", swap_function_patterns),
    ("function_regions", report_function_regions),
    ("compiled_root", report_compiled_root),
)


def twinkle_backend(
    gm: fx.GraphModule, example_inputs: list[Any], *, options: dict[str, Any] | None = None, mode: str | None = None
) -> Callable[..., Any]:
    """Rewrite ``gm`` (registered layers and functions -> kernels) and compile it.

    Args:
        options (`dict`, *optional*): see :class:`~twinkle_fx.compile.options.BackendOptions`.
        mode (`str`, *optional*): torch.compile's own ``mode`` ("max-autotune", ...), passed to Inductor.
    """
    opts = parse_options(options)
    ctx = GraphContext(
        gm, list(example_inputs), get_registry(), _device(example_inputs), opts.mode or _default_mode(example_inputs),
        ModuleIndex(module_roots()), getattr(gm, "compile_subgraph_reason", None),
    )
    report = GraphReport(0, ctx.device, format_mode(ctx.mode), opts.compiler, code_before=gm.code)
    recorders = active_recorders()
    for recorder in recorders:
        recorder.before.append(readable(gm))
    reference = verification.snapshot(gm) if opts.verify else None
    if kernels_disabled():
        logger.info("twinkle_fx: %s is set: graph left unchanged", DISABLE_ENV)
    else:
        with active_policy(opts.swap_policy):  # compilespeed: measured per-op swap decisions
            _run_passes(ctx, report)
        _fuse_projections(ctx, opts, report)  # compilespeed: horizontal GEMM fusion (last: sees unswapped linears)
    gm.graph.lint()
    gm.recompile()
    if reference is not None and gm.code != report.code_before:
        mismatch = verification.compare(reference, gm, ctx.example_inputs)
        if mismatch is not None:
            logger.warning("twinkle_fx: verify failed (%s); compiling the original graph", mismatch)
            for region in report.regions:
                if region.swapped:
                    region.reason = f"verify failed for the rewritten graph: {mismatch}"
            gm = reference
    report.code_after = gm.code
    for recorder in recorders:
        recorder.after.append(readable(gm))
    _publish(report, opts)
    return _inner_compile(gm, ctx.example_inputs, opts, mode, recorders)


def _run_passes(ctx: GraphContext, report: GraphReport) -> None:
    for name, run in PASSES:
        start = time.perf_counter()
        before = len(report.regions)
        result = run(ctx, report.regions)
        if name == "graph_breaks":
            result, report.graph_break = result
        elapsed = (time.perf_counter() - start) * 1e3
        report.pass_ms[name] = elapsed
        logging.getLogger(run.__module__).info(
            "twinkle_fx %s: %s swapped/reported, %s candidate(s), %.1f ms", name, result, len(report.regions) - before, elapsed
        )


def _device(example_inputs: list[Any]) -> str:
    for value in example_inputs:
        if isinstance(value, torch.Tensor):
            return value.device.type
    return "cpu"


def _default_mode(example_inputs: list[Any]) -> Mode:
    training = torch.is_grad_enabled() and any(isinstance(v, torch.Tensor) and v.requires_grad for v in example_inputs)
    return (Mode.TRAINING if training else Mode.INFERENCE) | Mode.TORCH_COMPILE


def _publish(report: GraphReport, opts: BackendOptions) -> None:
    for collector in active_reports():
        report.index = len(collector.graphs)
        collector.graphs.append(report)
    if opts.report:
        logger.info("twinkle_fx report:\n%s", report)


def _inner_compile(
    gm: fx.GraphModule, example_inputs: list[Any], opts: BackendOptions, mode: str | None, recorders: tuple[RecordedGraphs, ...]
) -> Callable[..., Any]:
    if opts.compiler == "eager":
        return gm.forward
    if opts.compiler == "aot_eager":
        from torch._dynamo.backends.debugging import aot_eager, boxed_nop

        def recording(kind: str) -> Callable[..., Any]:
            def compiler(graph: fx.GraphModule, inputs: list[Any]) -> Callable[..., Any]:
                for recorder in recorders:
                    getattr(recorder, kind).append(readable(graph))
                return boxed_nop(graph, inputs)

            return compiler

        if not recorders:
            return aot_eager(gm, example_inputs)
        return aot_eager(gm, example_inputs, fw_compiler=recording("forward"), bw_compiler=recording("backward"))
    # compilespeed: torch.compile's mode, options["cudagraphs"], options["inductor"]; CUDA-graph status recorded
    patches = inductor_config_patches(mode, opts.cudagraphs, opts.inductor)
    return compile_with_inductor(gm, example_inputs, patches)


def _fuse_projections(ctx: GraphContext, opts: BackendOptions, report: GraphReport) -> None:
    """compilespeed: the horizontal GEMM fusion pass (see :mod:`.gemm_fusion`), when it applies."""
    decision = should_fuse(opts.fuse_projections, ctx.mode, opts.compiler)
    if decision is False:
        return
    start = time.perf_counter()
    groups = fuse_projections(ctx.gm, min_in_features=0 if decision is True else decision)
    report.pass_ms["gemm_fusion"] = elapsed = (time.perf_counter() - start) * 1e3
    logging.getLogger(fuse_projections.__module__).info(
        "twinkle_fx gemm_fusion: %s group(s) fused, %.1f ms", len(groups), elapsed)
