"""Horizontal GEMM fusion: linears that read the same input become one GEMM on concatenated weights.

In a transformer layer q_proj, k_proj and v_proj read the same normed hidden states, and so do
gate_proj and up_proj. Before::

    q = linear(x, wq, bq); k = linear(x, wk, bk); v = linear(x, wv, bv)

after::

    qkv = linear(x, cat([wq, wk, wv]), cat([bq, bk, bv]))
    q, k, v = split(qkv, [dq, dk, dv], dim=-1)

The pass runs on Dynamo's graph, where parameters are graph inputs, so AOTAutograd differentiates
the ``cat`` and the gradients of ``wq``, ``wk``, ``wv`` reach the real parameters; the module and
its ``state_dict`` are untouched. In the backward the three weight gradients become one GEMM and
the three input-gradient GEMMs plus their sum become one.

Cost: the ``cat`` copies the weights on every call (the parameters may change between calls).
At decode (a few tokens) the GEMMs are weight-read bound and the copy triples the projections'
traffic, yet at the Qwen2-0.5B shape one GEMM instead of three still won (see
:data:`AUTO_INFERENCE_MAX_ROWS`): those weights are ~2 MB a layer and the GEMMs latency-bound.
Inductor's ``freezing`` (``options={"inductor": {"freezing": True}}``) folds parameters into
constants and its own concat-linear pattern fuses the projections with no per-call copy, but its
compile of the reference decode graph did not finish in 126 s on an H100. Under
``fuse_projections="auto"`` the pass fuses where it was measured to pay: in inference under Inductor,
groups whose input has at most :data:`AUTO_INFERENCE_MAX_ROWS` rows (decode steps, where three
small GEMMs cost more in latency than the copy of ~2 MB of weights); in training, where the input
width is at least :data:`AUTO_MIN_IN_FEATURES` (never, so far).

The registry's graph rewrite ``fused_projections`` (see :data:`~twinkle_fx.core.registry.GRAPH_REWRITES`)
turns the pass off wherever that registry is in effect, ``options={"fuse_projections": False}`` for one compile.

Regions swapped by other passes are opaque calls by now (the pass runs last), so a swapped MLP
keeps its own two GEMMs; the measured policy (:mod:`..swap_policy`) decides whether that swap is made.
"""

from __future__ import annotations

import logging
import operator
from dataclasses import dataclass, field

import torch
import torch.fx as fx

from ...core.modes import Mode
from ...core.torch_internals import nn_linear
from ..graph.dynamo import common_provenance, example_value, set_example_value
from ..pipeline import Outcome, PassState

logger = logging.getLogger(__name__)

FUSED_PROJECTIONS = "fused_projections"  # its name in the registry

__all__ = ["fuse_projections", "FusedGroup", "FusionLimits", "should_fuse", "AUTO_MIN_IN_FEATURES",
           "AUTO_INFERENCE_MAX_ROWS", "run", "linear_args", "rows_at_most"]

LINEAR_TARGETS = (nn_linear(), torch.nn.functional.linear)

# fuse_projections="auto": in training, fuse where the input width is at least this; None: never.
# Measured through the harness on one H100 80GB (torch 2.11, triton 3.6), training step batch 4 x 1024
# bf16: Qwen2-0.5B shape (hidden 896) Inductor 36.6 ms/step,
# twinkle 37.6, twinkle + fused projections 46.2 ms (0.79x): it loses, so "auto" leaves it off. The
# Llama-3.2-1B shape (hidden 2048, workload "llama1b"):
# Inductor 62.1 ms, twinkle 56.3, twinkle + fused projections 57.3 (0.98x twinkle's) at 1.5 GiB more peak
# memory (the concatenated weights saved for the backward): off there too. Under CUDA graphs (one H200,
# Qwen2-0.5B shape, docs/performance.md "Qwen2-0.5B after the norm backward's pipelining"): 28.51 ms against
# 28.41-28.67 unfused, at 1.5 GiB more peak memory: no gain, still off.
AUTO_MIN_IN_FEATURES: int | None = None

# fuse_projections="auto" in inference under Inductor: fuse where the input has at most this many rows
# (tokens). Measured through the harness (`bench --inference`, twinkle+cudagraphs with and without
# fuse_projections, one H100 80GB, torch 2.11, triton 3.6, Qwen2-0.5B shape, bf16):
# decode 32 x 1 with a 1024-token static cache 1.776 ms against 1.884 (1.06x); prefill 1 x 2048 4.702 ms
# against 4.757 (1.01x, within run-to-run noise: left unfused).
AUTO_INFERENCE_MAX_ROWS = 64


@dataclass(frozen=True)
class FusionLimits:
    """The groups the pass fuses: input width at least ``min_in_features``, and input rows (its
    numel over its last dimension; a symbolic count never qualifies) at most ``max_rows`` (None: any)."""

    min_in_features: int = 0
    max_rows: int | None = None


@dataclass
class FusedGroup:
    """One fused group: the linears replaced (their names) and the output widths."""

    input: str
    linears: list[str] = field(default_factory=list)
    widths: list[int] = field(default_factory=list)

    def __str__(self) -> str:
        return f"{' + '.join(self.linears)} on {self.input} -> one GEMM of width {sum(self.widths)}"


def should_fuse(setting: bool | str, mode: Mode, compiler: str) -> bool | FusionLimits:
    """Whether to run the pass: ``setting`` True/False wins; "auto" answers the measured limits
    (see the module docstring) or False.

    Examples:
        >>> should_fuse("auto", Mode.INFERENCE, "inductor")
        FusionLimits(min_in_features=0, max_rows=64)
        >>> should_fuse("auto", Mode.TRAINING, "inductor")
        False
    """
    if setting is True or setting is False:
        return setting
    if Mode.TRAINING in mode:
        return False if AUTO_MIN_IN_FEATURES is None else FusionLimits(min_in_features=AUTO_MIN_IN_FEATURES)
    if compiler == "inductor":
        return FusionLimits(max_rows=AUTO_INFERENCE_MAX_ROWS)
    return False


def run(state: PassState) -> list[Outcome]:
    """The pass: fuse when :func:`should_fuse` says so for ``state.options.fuse_projections`` in ``state.mode``,
    unless the registry's graph rewrite ``fused_projections`` was removed.

    Fusing swaps no registered region, so it answers no outcomes; the groups are logged at INFO.
    """
    if not state.registry.has_graph_rewrite(FUSED_PROJECTIONS):
        return []
    decision = should_fuse(state.options.fuse_projections, state.mode, state.options.compiler)
    if decision is False:
        return []
    limits = FusionLimits() if decision is True else decision
    groups = fuse_projections(state.gm, min_in_features=limits.min_in_features, max_rows=limits.max_rows)
    if groups:
        logger.info("fused %d group(s) of projections: %s", len(groups), "; ".join(map(str, groups)))
    return []


def linear_args(node: fx.Node) -> tuple[fx.Node, object, object] | None:
    """``(input, weight, bias)`` of a linear call (bias None when it has none); None for any other node."""
    if node.op != "call_function" or node.target not in LINEAR_TARGETS:
        return None
    args = list(node.args) + [None] * (3 - len(node.args))
    x, weight, bias = args[0], node.kwargs.get("weight", args[1]), node.kwargs.get("bias", args[2])
    return x, weight, bias


def _value(node: object) -> torch.Tensor | None:
    value = example_value(node) if isinstance(node, fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


def fuse_projections(gm: fx.GraphModule, *, min_in_features: int = 0, max_rows: int | None = None) -> list[FusedGroup]:
    """Fuse every group of two or more linears that read the same input; returns the groups.

    A group is the linears of one input whose weights are 2D tensors of one dtype and device with
    the same input width (at least ``min_in_features``) and that all have a bias or all have none;
    every weight and bias must be defined before the group's first linear. With ``max_rows``, only
    inputs with at most that many rows (a static count) are fused.

    Examples:
        >>> groups = fuse_projections(gm)                                           # doctest: +SKIP
        >>> print(groups[0])                                                         # doctest: +SKIP
        linear (q_proj) + linear_1 (k_proj) + linear_2 (v_proj) on x -> one GEMM of width 1152
    """
    graph = gm.graph
    order = {n: i for i, n in enumerate(graph.nodes)}
    by_input: dict[fx.Node, list[fx.Node]] = {}
    for node in graph.nodes:
        parsed = linear_args(node)
        if parsed is not None and isinstance(parsed[0], fx.Node) and isinstance(parsed[1], fx.Node):
            by_input.setdefault(parsed[0], []).append(node)
    groups = []
    for x, linears in by_input.items():
        if max_rows is not None and not rows_at_most(x, max_rows):
            continue
        # one GEMM per kind: same dtype, device and input width, all with or all without a bias
        kinds: dict[tuple, list[fx.Node]] = {}
        for node in linears:
            if _eligible(node, min_in_features):
                _, weight, bias = linear_args(node)
                value = _value(weight)
                kinds.setdefault((value.dtype, value.device, value.shape[1], bias is None), []).append(node)
        for same in kinds.values():
            weights = [linear_args(n)[1] for n in same]
            biases = [linear_args(n)[2] for n in same]
            first = min(same, key=order.__getitem__)
            defined = weights + [b for b in biases if b is not None]
            if len(same) >= 2 and all(order[d] < order[first] for d in defined):
                groups.append(_fuse(graph, x, same, weights, biases, first))
    if groups:
        graph.lint()
        gm.recompile()
    return groups


def rows_at_most(x: fx.Node, max_rows: int) -> bool:
    """Whether ``x`` has at most ``max_rows`` rows (its numel over its last dimension), all its sizes static."""
    value = _value(x)
    if value is None or value.dim() == 0 or not all(isinstance(d, int) for d in value.shape):
        return False  # a symbolic size: reading it would add a guard
    return value.numel() // max(value.shape[-1], 1) <= max_rows


def _eligible(node: fx.Node, min_in_features: int) -> bool:
    _, weight, bias = linear_args(node)
    value = _value(weight)
    if value is None or value.dim() != 2 or value.shape[1] < min_in_features:
        return False
    return bias is None or (isinstance(bias, fx.Node) and _value(bias) is not None and _value(bias).dim() == 1)


def _fuse(graph: fx.Graph, x: fx.Node, linears: list[fx.Node], weights: list[fx.Node], biases: list,
          first: fx.Node) -> FusedGroup:
    weight_values = [_value(w) for w in weights]
    bias_values = [_value(b) for b in biases] if biases[0] is not None else []
    widths = [int(v.shape[0]) for v in weight_values]
    has_bias = biases[0] is not None
    meta = common_provenance([first] + [n for n in linears if n is not first])
    x_value = _value(x)
    # The example values of the new nodes are made in the input's fake mode. Parameters can carry
    # another mode's fake tensors; their shapes are static, so a same-shaped stand-in is exact.
    fake_mode = getattr(x_value, "fake_mode", None)

    def fake(fn, *args, **kwargs):
        if fake_mode is None:
            return None
        with fake_mode:
            return fn(*args, **kwargs)

    def stand_in(value):
        return fake(torch.empty_strided, tuple(value.shape), tuple(value.stride()), dtype=value.dtype,
                    device=value.device)

    weight_values = [stand_in(v) for v in weight_values]
    bias_values = [stand_in(v) for v in bias_values]
    with graph.inserting_before(first):
        cat_w = graph.call_function(torch.cat, (list(weights),), {"dim": 0})
        cat_w.meta.update(meta)
        set_example_value(cat_w, fake(torch.cat, weight_values, dim=0))
        cat_b = None
        if has_bias:
            cat_b = graph.call_function(torch.cat, (list(biases),), {"dim": 0})
            cat_b.meta.update(meta)
            set_example_value(cat_b, fake(torch.cat, bias_values, dim=0))
        fused = graph.call_function(nn_linear(), (x, cat_w, cat_b))
        fused.meta.update(meta)
        set_example_value(fused, fake(nn_linear(), x_value, example_value(cat_w),
                                      None if cat_b is None else example_value(cat_b)))
        parts = graph.call_function(torch.split, (fused, widths), {"dim": -1})
        parts.meta.update(meta)
        set_example_value(parts, fake(torch.split, example_value(fused), widths, dim=-1))
        pieces = [graph.call_function(operator.getitem, (parts, i)) for i in range(len(linears))]
    for piece, linear in zip(pieces, linears):
        piece.meta.update(linear.meta)
        linear.replace_all_uses_with(piece)
    names = [linear.name for linear in linears]
    for linear in linears:
        graph.erase_node(linear)
    return FusedGroup(x.name, names, widths)
