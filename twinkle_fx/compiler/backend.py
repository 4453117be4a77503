"""The ``twinkle`` backend: a short list of graph passes, then the inner compiler.

>>> compiled = torch.compile(model, backend="twinkle",
...                          options={"compiler": "aot_eager", "mode": "train"})   # doctest: +SKIP

The eleven passes, in order (:data:`PASSES`; each ``run(state) -> list[Outcome]``, see
:mod:`.pipeline`; one file each in :mod:`.passes`, the region machinery they share in :mod:`.regions`):

1. ``graph_breaks`` (analysis): a graph break inside a registered layer or function is reported;
2. ``layer_regions`` (rewrite): regions of registered nn.Module classes become one kernel call each;
3. ``function_patterns`` (rewrite): the patterns of registered functions become one kernel call each;
4. ``function_calls`` (analysis): calls of registered functions left unswapped are reported, with the reason;
5. ``compiled_root`` (analysis): a kernel bound to the compiled module itself is reported (no region);
6. ``foreign_forwards`` (analysis): layers whose forward another tool replaced are reported;
7. ``attention`` (rewrite): SDPA with a constant causal mask becomes ``is_causal=True`` (flash
   attention, grouped heads), and SDPA on repeated K/V (``repeat_kv``) with a short query (decode)
   one grouped-query attention kernel call;
8. ``decode_gemv`` (rewrite): linears on a few rows (decode) become GEMV kernel calls, with the SwiGLU
   product and the residual add fused;
9. ``residual_norm`` (rewrite): a residual add read by a swapped RMSNorm joins the norm's kernel;
10. ``decode_cache`` (rewrite): the rotary kernel and a static KV cache's two writes become one kernel call;
11. ``gemm_fusion`` (rewrite): linears reading one input become one GEMM, where options ask for it.

The graphs AOTAutograd traces after these passes (forward and backward, ATen ops) get four rewrites of their own
(:mod:`.inner.post_grad`): ``embedding_grad`` (:mod:`.inner.embedding_grad`), an embedding's weight gradient from
the looked-up rows' sums instead of a dense table; ``scaled_gradient`` (:mod:`.inner.scaled_gradient`), a saved
gradient the backward returns times the loss's gradient, scaled in place (no pass when that is 1);
``matmul_sums`` (:mod:`.inner.matmul_sums`), a sum of matrix products (a layer input's gradient from q, k and v)
as GEMMs that accumulate, with no add kernel; and ``topk`` (:mod:`.inner.topk`), a router's top-k in one kernel.

All but ``graph_breaks`` and ``compiled_root`` also run inside the bodies of activation-checkpoint
calls (gradient checkpointing in transformers puts each decoder layer there); the calls stay, so
the layers are still recomputed in backward (see :mod:`.pipeline`).

Each pass is timed (DEBUG log of its module, and ``GraphReport.pass_ms``);
``TWINKLE_FX_DUMP_GRAPHS=<dir>`` or ``options={"dump_graphs": <dir>}`` writes the graph before and
after each pass. The report of a graph is published when the compiled graph first runs: a graph
the inner compiler rejects, or that Dynamo discards, is in no report.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx

from ..core.caches import owns_cache
from ..core.modes import Mode, format_mode
from ..core.plugins import layer_mappings
from ..core.reasons import Reason, ReasonKind
from ..core.registry import KernelRegistry, get_registry
from ..core.settings import DISABLE_ENV, kernels_disabled
from ..core.torch_internals import aot_eager, boxed_nop, shorten_traceback_base
from .graph.dynamo import input_source, module_lookup, parse_source
from .graph.recording import RecordedGraphs, active_recorders, readable
from .graph.structure import checkpoint_bodies, compiled_code, detach_checkpoint_bodies, graph_break, graph_breaks_counted
from .inner import verify as verification
from .inner import embedding_grad, matmul_sums, scaled_gradient, topk
from .inner.inductor_options import compile_with_inductor, inductor_config_patches
from .inner.post_grad import PostGradRewrite, run_rewrites
from .options import BackendOptions, parse_options
from .passes import compiled_root, foreign_forwards, function_calls, graph_breaks
from .pipeline import Pass, PassState, run_passes
from .report import CompileReport, GraphReport, RegionReport, active_reports
from .passes import attention, decode_cache, decode_gemv, function_patterns, gemm_fusion, layer_regions, residual_norms

logger = logging.getLogger(__name__)

__all__ = ["twinkle_backend", "PASSES"]

PASSES: tuple[Pass, ...] = (
    Pass("graph_breaks", graph_breaks.run, rewrites=False, outer_only=True),
    Pass("layer_regions", layer_regions.run, rewrites=True),
    Pass("function_patterns", function_patterns.run, rewrites=True),
    Pass("function_calls", function_calls.run, rewrites=False),
    Pass("compiled_root", compiled_root.run, rewrites=False, outer_only=True),
    Pass("foreign_forwards", foreign_forwards.run, rewrites=False),
    Pass("attention", attention.run, rewrites=True),
    Pass("decode_gemv", decode_gemv.run, rewrites=True),
    Pass("residual_norm", residual_norms.run, rewrites=True),  # after decode_gemv: norms in GEMV prologues stay there
    Pass("decode_cache", decode_cache.run, rewrites=True),
    Pass("gemm_fusion", gemm_fusion.run, rewrites=True),  # last: sees the linears no kernel took
)


def twinkle_backend(
    gm: fx.GraphModule, example_inputs: list[Any], *, options: dict[str, Any] | None = None, mode: str | None = None
) -> Callable[..., Any]:
    """Rewrite ``gm`` (registered layers and functions -> kernels) and compile it.

    Args:
        options (`dict`, *optional*): see :class:`~twinkle_fx.compiler.options.BackendOptions`.
        mode (`str`, *optional*): torch.compile's own ``mode`` ("max-autotune", ...), passed to Inductor.
    """
    opts = _parse(options)
    counted = graph_breaks_counted()
    state = PassState(
        gm, list(example_inputs), get_registry(), _device(example_inputs), opts.mode or _default_mode(example_inputs),
        module_lookup(), opts, graph_break=graph_break(gm, counted), compiled_code=compiled_code(),
        counted_breaks=tuple(counted),
    )
    report = GraphReport(0, state.device, format_mode(state.mode), opts.compiler, code_before=_code(gm),
                         graph_break=None if state.graph_break is None else str(state.graph_break))
    recorders = active_recorders()
    for recorder in recorders:
        recorder.before.append(readable(gm))
    reference = verification.snapshot(gm) if opts.verify or _has_lifted_scalars(state) else None
    if kernels_disabled():
        logger.info("%s is set: graph left unchanged", DISABLE_ENV)
    else:
        detach_checkpoint_bodies(gm)  # rewritten in place, the bodies would change in the reference too
        _warn_if_nothing_registered(state.registry)
        report.pass_ms = run_passes(state, PASSES, dump_graphs=opts.dump_graphs)
        logger.debug("module instances looked up with %d heap scan(s) in this compile so far", state.modules.heap_scans)
        report.regions = [RegionReport.from_outcome(o) for o in state.scratch.outcomes]
    gm.graph.lint()
    gm.recompile()
    if opts.verify and reference is not None and _code(gm) != report.code_before:
        mismatch = verification.compare(reference, gm, state.example_inputs)
        if mismatch is None:
            report.verified = "the example shapes"
            mismatch, checked = verification.compare_at_other_sizes(reference, gm, state.example_inputs)
            if checked is not None:
                report.verified = checked
                if checked.startswith("only the example shapes"):
                    logger.warning("verify=True on a graph with dynamic shapes: %s; sizes beyond them run the "
                                   "kernels unchecked", checked)
        if mismatch is not None and mismatch.startswith("not checked"):
            report.verified = mismatch
            logger.warning("verify=True but the rewrite was %s", mismatch)
        elif mismatch is not None:
            logger.warning("verify failed (%s); compiling the original graph", mismatch)
            for region in report.regions:
                if region.swapped:
                    region.reason = Reason(ReasonKind.VERIFY_FAILED, f"verify failed for the rewritten graph: {mismatch}")
            gm = reference
    report.code_after = _code(gm)
    for recorder in recorders:
        recorder.after.append(readable(gm))
    inference = Mode.TRAINING not in state.mode
    rewrites = _post_grad_rewrites(opts, state.registry)
    compiled = _inner_compile(gm, state.example_inputs, opts, mode, recorders, inference, rewrites)
    if state.scratch.baked_scalars and reference is not None and gm is not reference:
        original = _inner_compile(reference, state.example_inputs, opts, mode, (), inference, ())
        compiled = _check_scalars(compiled, original, dict(state.scratch.baked_scalars), report)
    return _follow_registry(compiled, state.registry, report, opts, active_reports())


def _code(gm: fx.GraphModule) -> str:
    """``gm``'s code and, below it, the code of each activation-checkpoint body it calls (where the
    rewrites of a checkpointed decoder layer are)."""
    return gm.code + "".join(f"\n# {found.attribute}{_code(found.body)}" for found in checkpoint_bodies(gm))


def _has_lifted_scalars(state: PassState) -> bool:
    """Whether Dynamo made a float attribute of a submodule a graph input (a 0-d tensor or a SymFloat)."""
    for node, value in state.placeholder_values.items():
        ref = parse_source(input_source(node))
        if (ref is not None and ref.member is None and len(ref.modules) >= 2
                and isinstance(value, (torch.Tensor, torch.SymFloat, float)) and getattr(value, "ndim", 0) == 0):
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
        # the inputs as a list (boxed) or one by one: aot_module_simplified's function carries
        # _boxed_call=True from the one it wraps but takes them one by one (checkpointed layers
        # compiled per layer reach it so); no graph input is a list, so the call itself tells
        inputs = args[0] if len(args) == 1 and isinstance(args[0], list) else args
        if all(value(inputs[i]) == v for i, v in baked.items()):
            return compiled(*args)
        if not noted:
            noted = True
            logger.info("%s: a lifted float attribute differs from the value its kernels were compiled "
                        "for (%s); such calls run the graph without swaps", report.summary().splitlines()[0], baked)
        return original(*args)  # compiled as ``compiled`` was: called the same way

    boxed = getattr(compiled, "_boxed_call", False)
    run._boxed_call = boxed  # type: ignore[attr-defined]
    return run


def _follow_registry(
    compiled: Callable[..., Any], registry: KernelRegistry, report: GraphReport, opts: BackendOptions,
    collectors: tuple[CompileReport, ...],
) -> Callable[..., Any]:
    """``compiled``, publishing ``report`` when it first runs and warning (once) when it runs after
    the registrations it was built from changed.

    Published at the first run, not at compile time, so a report describes what runs: Dynamo
    discards a graph whose inner compile fails (and DDP's split graphs compile before any runs).
    A compiled graph holds the kernels chosen when it was compiled. Dynamo recompiles when the
    model's code or eager swaps change, but it knows nothing of the registry: a kernel registered
    later, a ``scoped_registry`` that has exited, a registration replaced. Checking costs two
    attribute reads per call.
    """
    generation = registry.generation
    warned = published = False

    def run(*args: Any) -> Any:
        nonlocal warned, published
        if not published:
            published = True
            _publish(report, opts, collectors)
        if not warned:
            current = get_registry()
            if current is not registry or current.generation != generation:
                warned = True
                what = ("the scoped_registry it was compiled in has exited or another one is active"
                        if current is not registry else "kernels were registered or replaced since")
                logger.warning(
                    "a graph compiled by backend='twinkle' (%s) runs with the kernels chosen at "
                    "compile time, but %s. Call torch.compiler.reset() and call the model again to "
                    "recompile it with the current registrations.", report.summary().splitlines()[0], what,
                )
        return compiled(*args)

    run._boxed_call = getattr(compiled, "_boxed_call", False)  # type: ignore[attr-defined]
    return run


class BackendOptionsError(ValueError, shorten_traceback_base()):
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
    if registry.layer_kernel_names() or registry.function_targets() or registry.bindings() \
            or any(mapping.layer_names() for mapping in layer_mappings()):
        return  # a plugged layer mapping (the kernels package's use_kernel_mapping) serves layers too
    if _WARNED_EMPTY.get(registry) == registry.generation:
        return
    _WARNED_EMPTY[registry] = registry.generation
    logger.warning("backend='twinkle' found no registered kernels, so it swaps no layer or function (only "
                   "the graph rewrites of its options run: causal_mask, gqa_attention, fuse_projections);\nregister kernels first (twinkle_fx.builtin.use_builtin_kernels() for transformers models).")


# registry -> generation already warned about (weak: a scoped registry that is gone takes its entry)
_WARNED_EMPTY: weakref.WeakKeyDictionary[KernelRegistry, int] = weakref.WeakKeyDictionary()
owns_cache(__name__, _WARNED_EMPTY.clear)


def _device(example_inputs: list[Any]) -> str:
    for value in example_inputs:
        if isinstance(value, torch.Tensor):
            return value.device.type
    return "cpu"


def _default_mode(example_inputs: list[Any]) -> Mode:
    training = torch.is_grad_enabled() and any(isinstance(v, torch.Tensor) and v.requires_grad for v in example_inputs)
    return (Mode.TRAINING if training else Mode.INFERENCE) | Mode.TORCH_COMPILE


def _publish(report: GraphReport, opts: BackendOptions, collectors: tuple[CompileReport, ...]) -> None:
    for collector in collectors:
        report.index = len(collector.graphs)
        collector.graphs.append(report)
    if opts.report:
        _log_report(report)
    _warn_if_nothing_swapped(report)


_REPORT_UNSEEN_WARNED = False


def _log_report(report: GraphReport) -> None:
    """``options={"report": True}``: the graph's summary (what was swapped or kept, and why) at INFO,
    the diff of its FX code at DEBUG. Where INFO is not emitted (logging left unconfigured), one
    WARNING per process says how to see it: the caller asked for a report it would otherwise never see."""
    global _REPORT_UNSEEN_WARNED
    logger.info("twinkle_fx report: %s", report.summary(pass_times=False))
    if not (logger.isEnabledFor(logging.INFO) and logger.hasHandlers()) and not _REPORT_UNSEEN_WARNED:
        _REPORT_UNSEEN_WARNED = True
        logger.warning("options={'report': True} logs each graph's report at INFO (the FX code diffs at DEBUG) on the "
                       "logger %r, and logging is not set up to show INFO here:\ncall "
                       "logging.basicConfig(level=logging.INFO) first to see it", logger.name)
    if logger.isEnabledFor(logging.DEBUG):
        diff = report.diff()
        logger.debug("twinkle_fx report, graph %d's FX code before and after the rewrite:\n%s", report.index,
                     diff or "(graph unchanged)")


def _warn_if_nothing_swapped(report: GraphReport) -> None:
    """One WARNING when a graph had candidates and swapped none of them, with the reasons (short)."""
    if not report.regions or any(r.swapped for r in report.regions):
        return
    reasons: dict[str, int] = {}
    for region in report.regions:
        reason = str(region.reason or "?").split(";")[0]
        reasons[reason[:120]] = reasons.get(reason[:120], 0) + 1
    shown = "; ".join(f"{n} x {reason}" for reason, n in reasons.items())
    logger.warning("backend='twinkle' swapped none of the %d candidate region(s) of a graph: %s",
                   len(report.regions), shown)


def _post_grad_rewrites(opts: BackendOptions, registry: KernelRegistry) -> tuple[PostGradRewrite, ...]:
    """The rewrites of the graphs AOTAutograd traces that the options and the registry leave on (none while
    kernels are disabled)."""
    if kernels_disabled():
        return ()
    chosen = ((embedding_grad.REWRITE, opts.embedding_grad), (scaled_gradient.REWRITE, opts.scaled_gradient),
              (matmul_sums.REWRITE, opts.matmul_sums), (topk.REWRITE, opts.topk))
    return tuple(rewrite for rewrite, on in chosen if on and registry.has_graph_rewrite(rewrite.name))


def _inner_compile(
    gm: fx.GraphModule, example_inputs: list[Any], opts: BackendOptions, mode: str | None,
    recorders: tuple[RecordedGraphs, ...], inference: bool, rewrites: tuple[PostGradRewrite, ...],
) -> Callable[..., Any]:
    """``gm`` compiled by the inner compiler; ``rewrites``: those of the graphs AOTAutograd traces."""
    if opts.compiler == "eager":
        return gm.forward
    if opts.compiler == "aot_eager":
        def recording(kind: str) -> Callable[..., Any]:
            def compiler(graph: fx.GraphModule, inputs: list[Any]) -> Callable[..., Any]:
                if run_rewrites(graph.graph, rewrites):
                    graph.recompile()
                for recorder in recorders:
                    getattr(recorder, kind).append(readable(graph))
                return boxed_nop(graph, inputs)

            return compiler

        if not recorders and not rewrites:
            return aot_eager(gm, example_inputs)
        return aot_eager(gm, example_inputs, fw_compiler=recording("forward"), bw_compiler=recording("backward"))
    # torch.compile's mode, options["cudagraphs"], options["inductor"]; CUDA-graph status recorded. Inference graphs
    # on CUDA (decode steps) launch Inductor's kernels as programmatic dependents, as the decode kernels are.
    patches = inductor_config_patches(mode, opts.cudagraphs, opts.inductor,
                                      dependent_launch=inference and _device(example_inputs) == "cuda")
    return compile_with_inductor(gm, example_inputs, patches, rewrites=rewrites)
