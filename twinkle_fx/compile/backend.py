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
import sys
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx
from torch._dynamo.exc import ShortenTraceback

from ..modes import Mode, format_mode
from ..registry import KernelRegistry, get_registry
from ..settings import DISABLE_ENV, kernels_disabled
from . import verify as verification
from .compiled_root import report_compiled_root
from .function_patterns import swap_function_patterns
from .foreign_forwards import report_foreign_forwards
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
    ("foreign_forwards", report_foreign_forwards),
)


def twinkle_backend(
    gm: fx.GraphModule, example_inputs: list[Any], *, options: dict[str, Any] | None = None, mode: str | None = None
) -> Callable[..., Any]:
    """Rewrite ``gm`` (registered layers and functions -> kernels) and compile it.

    Args:
        options (`dict`, *optional*): see :class:`~twinkle_fx.compile.options.BackendOptions`.
        mode (`str`, *optional*): torch.compile's own ``mode`` ("max-autotune", ...), passed to Inductor.
    """
    opts = _parse(options)
    ctx = GraphContext(
        gm, list(example_inputs), get_registry(), _device(example_inputs), opts.mode or _default_mode(example_inputs),
        ModuleIndex(module_roots()), getattr(gm, "compile_subgraph_reason", None),
    )
    report = GraphReport(0, ctx.device, format_mode(ctx.mode), opts.compiler, code_before=gm.code)
    recorders = active_recorders()
    for recorder in recorders:
        recorder.before.append(readable(gm))
    reference = verification.snapshot(gm) if opts.verify or _has_lifted_scalars(ctx) else None
    if kernels_disabled():
        logger.info("%s is set: graph left unchanged", DISABLE_ENV)
    else:
        _warn_if_nothing_registered(ctx.registry)
        # measured per-op decisions (swap_policy.py) compare with Inductor's generated code: they
        # apply when Inductor is the inner compiler, and every region is swapped otherwise
        with active_policy(opts.swap_policy if opts.compiler == "inductor" else "always"):
            _run_passes(ctx, report)
        _fuse_projections(ctx, opts, report)  # horizontal GEMM fusion (last: sees unswapped linears)
    gm.graph.lint()
    gm.recompile()
    if opts.verify and reference is not None and gm.code != report.code_before:
        mismatch = verification.compare(reference, gm, ctx.example_inputs)
        if mismatch is not None and mismatch.startswith("not checked"):
            logger.warning("verify=True but the rewrite was %s", mismatch)
        elif mismatch is not None:
            logger.warning("verify failed (%s); compiling the original graph", mismatch)
            for region in report.regions:
                if region.swapped:
                    region.reason = f"verify failed for the rewritten graph: {mismatch}"
            gm = reference
    report.code_after = gm.code
    for recorder in recorders:
        recorder.after.append(readable(gm))
    compiled = _inner_compile(gm, ctx.example_inputs, opts, mode, recorders)
    if ctx.baked_scalars and reference is not None and gm is not reference:
        original = _inner_compile(reference, ctx.example_inputs, opts, mode, ())
        compiled = _check_scalars(compiled, original, dict(ctx.baked_scalars), report)
    _publish(report, opts)  # only now: the report describes what runs
    return _follow_registry(compiled, ctx.registry, report)


def _has_lifted_scalars(ctx: GraphContext) -> bool:
    """Whether Dynamo made a float attribute of a module a graph input (a 0-d tensor or a SymFloat)."""
    for node, value in ctx.placeholder_values.items():
        source = getattr(getattr(node.meta.get("grapharg"), "source", None), "name", None)
        source = source() if callable(source) else source
        if (isinstance(source, str) and "._modules[" in source and "._parameters[" not in source
                and "._buffers[" not in source and isinstance(value, (torch.Tensor, torch.SymFloat, float))
                and getattr(value, "ndim", 0) == 0):
            return True
    return False


def _check_scalars(
    compiled: Callable[..., Any], original: Callable[..., Any], baked: dict[int, float], report: GraphReport,
) -> Callable[..., Any]:
    """``compiled`` while the lifted float inputs hold the values its kernels were specialised to,
    else ``original`` (the graph without swaps) for that call.

    Dynamo lifts a float attribute (an ``eps``) to a graph input once two instances of a class
    differ in it, and then serves every instance with one graph without guarding on the value. A
    kernel swapped in reads the value from the graph at compile time, so a call with another
    value runs the unswapped graph (said once at INFO) instead of a kernel with the wrong constant.
    """
    noted = False

    def value(x: Any) -> float:
        return x.item() if isinstance(x, torch.Tensor) else float(x)

    def run(*args: Any) -> Any:
        nonlocal noted
        inputs = args[0] if boxed else args
        if all(value(inputs[i]) == v for i, v in baked.items()):
            return compiled(*args)
        if not noted:
            noted = True
            logger.info("%s: a lifted float attribute differs from the value its kernels were compiled "
                        "for (%s); such calls run the graph without swaps", report.summary().splitlines()[0], baked)
        return _call(original, list(inputs))

    boxed = getattr(compiled, "_boxed_call", False)
    run._boxed_call = boxed  # type: ignore[attr-defined]
    return run


def _call(fn: Callable[..., Any], inputs: list[Any]) -> Any:
    return fn(inputs) if getattr(fn, "_boxed_call", False) else fn(*inputs)


def _follow_registry(compiled: Callable[..., Any], registry: KernelRegistry, report: GraphReport) -> Callable[..., Any]:
    """``compiled``, warning (once) when it runs after the registrations it was built from changed.

    A compiled graph holds the kernels chosen when it was compiled. Dynamo recompiles when the
    model's code or eager swaps change, but it knows nothing of the registry: a kernel registered
    later, a ``scoped_registry`` that has exited, a registration replaced. Checking costs two
    attribute reads per call.
    """
    generation = registry.generation
    warned = False

    def run(*args: Any) -> Any:
        nonlocal warned
        if not warned:
            current = get_registry()
            if current is not registry or current.generation != generation:
                warned = True
                what = ("the scoped_registry it was compiled in has exited or another one is active"
                        if current is not registry else "kernels were registered or replaced since")
                logger.warning(
                    "twinkle_fx: a graph compiled by backend='twinkle' (%s) runs with the kernels chosen at "
                    "compile time, but %s. Call torch.compiler.reset() and call the model again to "
                    "recompile it with the current registrations.", report.summary().splitlines()[0], what,
                )
        return compiled(*args)

    run._boxed_call = getattr(compiled, "_boxed_call", False)  # type: ignore[attr-defined]
    return run


class BackendOptionsError(ValueError, ShortenTraceback):
    """A bad ``options=`` entry. A ShortenTraceback, so Dynamo passes it to the caller as it is,
    rather than wrapped in BackendCompilerFailed under frames of its own."""

    def __init__(self, message: str) -> None:
        ValueError.__init__(self, message)
        self.first_useful_frame = None  # keep the traceback as it is


def _parse(options: dict[str, Any] | None) -> BackendOptions:
    try:
        return parse_options(options)
    except ValueError as e:
        raise BackendOptionsError(str(e)) from None


def _warn_if_nothing_registered(registry: KernelRegistry) -> None:
    """One WARNING per registry state when backend='twinkle' runs with nothing registered at all."""
    if registry.layer_kernel_names() or registry.function_targets() or registry.bindings():
        return
    if _WARNED_EMPTY.get(registry) == registry.generation:
        return
    _WARNED_EMPTY[registry] = registry.generation
    logger.warning("backend='twinkle' found no registered kernels, so it compiles the model unchanged; "
                   "register kernels first (twinkle_fx.builtin.use_builtin_kernels() for transformers models).")


# registry -> generation already warned about (weak: a scoped registry that is gone takes its entry)
_WARNED_EMPTY: weakref.WeakKeyDictionary[KernelRegistry, int] = weakref.WeakKeyDictionary()


def _run_passes(ctx: GraphContext, report: GraphReport) -> None:
    for name, run in PASSES:
        start = time.perf_counter()
        before = len(report.regions)
        result = run(ctx, report.regions)
        if name == "graph_breaks":
            result, report.graph_break = result
        elapsed = (time.perf_counter() - start) * 1e3
        report.pass_ms[name] = elapsed
        found = report.regions[before:]
        logging.getLogger(run.__module__).info(
            "twinkle_fx %s: %d of %d candidate(s) swapped, %.1f ms", name, sum(r.swapped for r in found), len(found), elapsed
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
        # asked for explicitly: shown whether or not the program configured logging
        print(f"twinkle_fx report:\n{report}", file=sys.stderr, flush=True)
    _warn_if_nothing_swapped(report)


def _warn_if_nothing_swapped(report: GraphReport) -> None:
    """One WARNING when a graph had candidates and swapped none of them, with the reasons (short)."""
    if not report.regions or any(r.swapped for r in report.regions):
        return
    reasons: dict[str, int] = {}
    for region in report.regions:
        reason = (region.reason or "?").split(";")[0]
        reasons[reason[:120]] = reasons.get(reason[:120], 0) + 1
    shown = "; ".join(f"{n} x {reason}" for reason, n in reasons.items())
    logger.warning("backend='twinkle' swapped none of the %d candidate region(s) of a graph: %s",
                   len(report.regions), shown)


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
