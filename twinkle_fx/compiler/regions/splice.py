"""Splice a bound kernel into the graph: the swap policy, the shape guard, a traceable call or an opaque
wrapper, and the rewrite of the region into that one call (:func:`place_kernel`, which ends in
:func:`replace_region`).

The call goes right after the region's last node (its inputs are all defined by then), or, where
the graph reads an output before that, right after its last input; each output the rest of the
graph reads is re-pointed at the call's result; region nodes nothing reads
any more are erased, except nodes with side effects, which stay with whatever they depend on.

Opaque calls wrap kernels that cannot be traced (``can_torch_compile=False``, e.g. a Hub layer
launching raw Triton on real pointers).

The kernel call becomes a fresh ``twinkle_opaque::<name>_<n>`` custom op over the region's tensor
inputs. Its fake implementation replays the *reference region* on the fake inputs, so AOTAutograd
and Inductor get exact output metadata without running the kernel; the real implementation checks
the kernel against that metadata once per input shape. In training its backward is a second custom
op that re-runs the kernel under autograd and differentiates it (one extra kernel forward per step:
the price of a kernel the compiler cannot see into).

The swap policy keeps a swap only where it wins: a measured per-op, per-device decision table.

Inductor fuses the ops around a region (the residual add before an RMSNorm, the casts after it)
into the same kernel; a swapped region is a separate kernel that Inductor cannot fuse with. Where
the measurement below found the kernel slower than Inductor's own code for the same region at
that size, the backend keeps the region unswapped (``options={"swap_policy": "measured"}``) and the
report says why. The backend's default, ``swap_policy="always"``, swaps every region that can be;
``twinkle_fx.compile`` asks for ``"measured"`` in training, because swapping every region lost on a
whole training step (H100, torch 2.11, reference workload: 72.3 ms against Inductor's 40.1 on a
host-bound machine, 1,339 kernels a step to Inductor's 1,171; see
:func:`~twinkle_fx.compiler.entry.compile_model`). The "measured" step itself was not timed end to end yet.
Only under Inductor (the comparison is with its code): other inner compilers swap every region.

The size of a region is the number of rows of its first tensor argument (its numel over its last
dimension: tokens for a norm or an MLP; batch x heads x tokens for rotary's q).

How the table was measured: ``python -m twinkle_fx.bench.swap_table`` (committed), each op's
twinkle kernel against ``torch.compile`` of its ``<op>_reference`` at the rows of decode (32),
prefill (2048) and a training step (4096), both replayed from CUDA graphs so launch overhead is
out, forward for inference and forward + backward for training.
"""

from __future__ import annotations

import itertools
import operator
import threading
import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from ...core.caches import owns_cache
from ...core.modes import Mode
from ...core.reasons import ReasonKind
from ...core.selection import KernelChoice
from ...core.torch_internals import autograd_inside_custom_op, fake_tensor_mode, tree_leaves
from ..graph.dynamo import example_value, provenance, set_example_value
from .region import KeepRegion, KernelCall, Region, region_graph_module, static_inputs

__all__ = ["place_kernel", "replace_region", "has_side_effects", "opaque_call", "OpaqueCall", "registered_opaque_ops",
           "Decision", "DECISIONS", "keep_inductor_reason"]


def _describe(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}"
    return repr(value)


def _random_like(value: object) -> object:
    """A real tensor with ``value``'s metadata (normal for floats, small non-negative integers else)."""
    if not isinstance(value, torch.Tensor):
        return value
    if value.is_floating_point() or value.is_complex():
        # a private generator: compiling must not move the user's random stream
        generator = torch.Generator(device=value.device).manual_seed(0)
        return torch.randn(value.shape, dtype=value.dtype, device=value.device, generator=generator)
    return torch.zeros(value.shape, dtype=value.dtype, device=value.device)


def place_kernel(
    gm: fx.GraphModule, region: Region, call: KernelCall, choice: KernelChoice, *, device: str, mode: Mode,
    swap_policy: str,
) -> tuple[str, fx.Node, dict[fx.Node, fx.Node]]:
    """Rewrite ``region`` of ``gm`` to call ``call``; returns how (for the report), the call node, and
    what replaced each output. ``swap_policy``: ``BackendOptions.applied_swap_policy`` (see :mod:`..swap_policy`).

    A kernel declared ``can_torch_compile`` is run once on fake inputs: its outputs must have the
    region's shapes and dtypes (the shape guard), and it is then called directly so its custom
    ops enter the graph. Otherwise it is run once on random inputs of the region's shapes (it
    cannot see fake tensors) under the same guard, and wrapped in an opaque custom op (see
    :mod:`.opaque`). A kernel that fails either trial is never installed: the region is kept
    (:class:`KeepRegion`, with the error), so the compiled model never crashes where the original runs.
    """
    first = example_value(region.call_args[0]) if region.call_args else None
    kept = keep_inductor_reason(swap_policy, choice.name, device, mode, first)
    if kept is not None:
        raise KeepRegion(ReasonKind.SWAP_POLICY, kept)
    statics = static_inputs([example_value(n) for n in region.call_args] + [example_value(n) for n in region.outputs])
    inputs, expected = statics.values[: len(region.call_args)], statics.values[len(region.call_args):]
    if choice.can_torch_compile:
        trial = "fake tensors of the region's shapes"
        try:
            with statics.mode:
                result = call(*inputs)
        except Exception as e:  # the kernel's own error, shown in the report
            raise KeepRegion(ReasonKind.KERNEL_FAILED, f"the kernel fails on {trial}: {e!r}", e) from None
    else:
        if Mode.TRAINING in mode and not choice.has_backward:
            raise KeepRegion(ReasonKind.INFERENCE_ONLY, "inference-only kernel (has_backward=False) in training")
        trial = "random inputs of the region's shapes"
        try:
            with torch.no_grad():
                result = call(*[_random_like(v) for v in inputs])
        except Exception as e:  # the kernel's own error, shown in the report
            raise KeepRegion(ReasonKind.KERNEL_FAILED, f"the kernel fails on {trial}: {e!r}", e) from None
    got = tree_leaves(result)
    if [_describe(v) for v in got] != [_describe(v) for v in expected]:
        raise KeepRegion(ReasonKind.SHAPE_GUARD, (
            f"shape guard: on {trial} the kernel returns {', '.join(map(_describe, got))} where the region "
            f"produces {', '.join(map(_describe, expected))}"
        ))
    if choice.can_torch_compile:
        how = "custom op call"
    else:
        why_opaque = "can_torch_compile=False"
        reference = region_graph_module(gm, region.nodes, region.call_args, region.outputs, region.constant_inputs)
        wrapped = opaque_call(call, reference, training=Mode.TRAINING in mode)
        if isinstance(wrapped, str):
            raise KeepRegion(ReasonKind.NOT_WRAPPABLE, f"cannot compile ({why_opaque}) and cannot be wrapped: {wrapped}")
        how, call = f"opaque custom op, {why_opaque}", wrapped
    call_node, replaced = replace_region(gm, region, call)
    return how, call_node, replaced


def has_side_effects(node: fx.Node) -> bool:
    """Impure for FX, or an in-place method (``x.add_``) or ``setitem``, which FX does not flag."""
    if node.op == "call_method" and isinstance(node.target, str):
        if node.target.endswith("_") and not node.target.startswith("__"):
            return True
    if node.op == "call_function" and node.target is operator.setitem:
        return True
    try:
        return node.is_impure(impure_random=False)
    except TypeError:  # torch < 2.12 has no impure_random
        return node.is_impure()


def _read_before(region: Region, order: dict[fx.Node, int], inside: set[fx.Node], point: fx.Node) -> tuple | None:
    """``(output, user)`` when a node outside the region reads an output before ``point``, else None."""
    for out in region.outputs:
        for user in out.users:
            if user not in inside and order[user] < order[point]:
                return out, user
    return None


def _insertion_point(region: Region, order: dict[fx.Node, int], inside: set[fx.Node]) -> fx.Node:
    """Where the call goes: after the region's last node, or, when the graph reads an output before
    that (Phi3's rotary concatenates q before it rotates k), after the call's last argument."""
    last = max(region.nodes, key=order.__getitem__)
    early = _read_before(region, order, inside, last)
    if early is None:
        return last
    if region.call_args:
        first_possible = max(region.call_args, key=order.__getitem__)
        if _read_before(region, order, inside, first_possible) is None:
            return first_possible
    out, user = early
    raise KeepRegion(ReasonKind.INTERLEAVED, f"its output {out.name} is read by {user.name} before the region's "
                     "inputs are all computed (interleaved computation)")


def replace_region(gm: fx.GraphModule, region: Region, call: Any) -> tuple[fx.Node, dict[fx.Node, fx.Node]]:
    """Insert ``call(*region.call_args)`` and route ``region.outputs`` to it.

    Returns the call node and, for each output, the node now standing for it (a later match that
    read the output reads that instead). Raises :class:`KeepRegion` before touching the graph when
    the rewrite is impossible.
    """
    graph = gm.graph
    inside = set(region.nodes)
    order = {n: i for i, n in enumerate(graph.nodes)}
    last = _insertion_point(region, order, inside)
    with graph.inserting_after(last):
        call_node = graph.call_function(call, tuple(region.call_args))
    values = [example_value(n) for n in region.outputs]
    if len(region.outputs) == 1:
        set_example_value(call_node, values[0])
        results = [call_node]
    else:
        set_example_value(call_node, tuple(values))
        results = []
        anchor = call_node
        for i, value in enumerate(values):
            with graph.inserting_after(anchor):
                anchor = graph.call_function(operator.getitem, (call_node, i))
            set_example_value(anchor, value)
            results.append(anchor)
    replaced = {}
    for out, result in zip(region.outputs, results):
        out.replace_all_uses_with(result, delete_user_cb=lambda user: user not in inside)
        replaced[out] = result
    for node in sorted(region.nodes, key=order.__getitem__, reverse=True):
        if not node.users and not has_side_effects(node):
            graph.erase_node(node)
    # the call stands for the region's last output: it says where that came from (an erased node keeps its meta)
    call_node.meta.update(provenance(region.outputs[-1]))
    return call_node, replaced


# --- opaque calls: kernels the compiler cannot trace ----------------------------------------------


_COUNTER = itertools.count()
_LOCK = threading.Lock()
# (kernel call key, region code, training) -> the op; a key naming a module instance holds it weakly
_OPS: dict[tuple, tuple[Any, "OpaqueCall"]] = {}


def _forget_ops() -> None:
    """Forget which region has which op (the ops stay registered with torch.library, where graphs
    compiled earlier still call them; a region compiled later gets a new one)."""
    with _LOCK:
        _OPS.clear()


owns_cache(__name__, _forget_ops)


def registered_opaque_ops() -> int:
    """How many ``twinkle_opaque`` ops this process registered (each lives as long as the process)."""
    return len(_OPS)


class OpaqueCall(KernelCall):
    """Calls the opaque op with the region's tensors and returns what the region returned."""

    def __init__(self, name: str, op: Any, n_outputs: int) -> None:
        super().__init__(name, range(n_outputs), n_outputs == 1)
        self.op = op

    def __call__(self, *values: Any) -> Any:
        return self._pick(self.op(list(values)))


def _as_outputs(result: Any, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """The result as a list of contiguous tensors that alias no input (what a custom op must return).

    Contiguous because the fake has to promise the real layout, and the kernel's own layout is
    unknown until it runs.
    """
    leaves = list(result) if isinstance(result, (tuple, list)) else [result]
    return [t.clone(memory_format=torch.contiguous_format) if any(t is i for i in inputs) else t.contiguous() for t in leaves]


def opaque_call(call: KernelCall, reference: fx.GraphModule, *, training: bool) -> OpaqueCall:
    """Wrap ``call`` (the kernel) with ``reference`` (the original region) as its fake.

    Raises:
        KeepRegion: the region takes a non-tensor input (an opaque op takes tensors only).
    """
    for node in reference.graph.nodes:
        if node.op == "placeholder":
            value = example_value(node)
            if not isinstance(value, torch.Tensor):
                raise KeepRegion(ReasonKind.NOT_WRAPPABLE, f"cannot compile (can_torch_compile=False) and cannot be "
                                 f"wrapped: input {node.name} is a {type(value).__name__}; an opaque op takes tensors only")
    key, owner = call.cache_key()
    key = (key, reference.code, training)
    with _LOCK:
        cached = _OPS.get(key)
        if cached is not None and (cached[0] is None or cached[0]() is not None):
            return cached[1]
        wrapped = _new_opaque_call(call, reference, training=training)
        _OPS[key] = (None if owner is None else weakref.ref(owner), wrapped)
        return wrapped


def _new_opaque_call(call: KernelCall, reference: fx.GraphModule, *, training: bool) -> OpaqueCall:
    n_outputs = len(next(n for n in reference.graph.nodes if n.op == "output").args[0])
    name = f"{call.__name__}_{next(_COUNTER)}"
    checked: set[tuple] = set()

    def expected(inputs: list[torch.Tensor]) -> list[tuple[torch.Size, torch.dtype]]:
        with fake_tensor_mode() as mode:
            outs = reference(*[mode.from_tensor(t) for t in inputs])
        return [(t.shape, t.dtype) for t in outs]

    def impl(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        result = _as_outputs(call(*inputs), inputs)
        signature = tuple((t.shape, t.dtype) for t in inputs)
        if signature not in checked:  # the shape guard, once per input shape
            got, want = [(t.shape, t.dtype) for t in result], expected(inputs)
            if got != want:
                raise RuntimeError(f"twinkle: opaque kernel {call.__name__} returned {got}; the region it replaces returns {want}")
            checked.add(signature)
        return result

    def fake(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return [torch.empty_like(t, memory_format=torch.contiguous_format) for t in _as_outputs(reference(*inputs), inputs)]

    op = torch.library.custom_op(f"twinkle_opaque::{name}", impl, mutates_args=())
    op.register_fake(fake)
    if training:
        _register_recompute_backward(op, name, call)
    return OpaqueCall(f"opaque_{name}", op, n_outputs)


def _register_recompute_backward(op: Any, name: str, call: KernelCall) -> None:
    def backward_impl(inputs: list[torch.Tensor], grads: list[torch.Tensor], needs_grad: list[bool]) -> list[torch.Tensor]:
        # only the inputs that required grad in the forward (a kernel may refuse grad on others,
        # e.g. rotary on cos/sin)
        leaves = [t.detach().requires_grad_(need) for t, need in zip(inputs, needs_grad)]
        with autograd_inside_custom_op():
            outs = _as_outputs(call(*leaves), leaves)
            wanted = [t for t in leaves if t.requires_grad]
            found = iter(torch.autograd.grad(outs, wanted, grads, allow_unused=True)) if wanted else iter(())
        result = []
        for t in leaves:
            g = next(found) if t.requires_grad else None
            result.append(torch.zeros_like(t, memory_format=torch.contiguous_format) if g is None else g.contiguous())
        return result

    def backward_fake(inputs: list[torch.Tensor], grads: list[torch.Tensor], needs_grad: list[bool]) -> list[torch.Tensor]:
        return [torch.empty_like(t, memory_format=torch.contiguous_format) for t in inputs]

    backward_op = torch.library.custom_op(f"twinkle_opaque::{name}_backward", backward_impl, mutates_args=())
    backward_op.register_fake(backward_fake)

    def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
        ctx.save_for_backward(*inputs[0])
        ctx.needs_grad = [t.requires_grad and t.is_floating_point() for t in inputs[0]]

    def backward(ctx: Any, grads: list[torch.Tensor]) -> tuple:
        # custom ops materialise the gradients of unused outputs as zeros: no None here
        return (backward_op(list(ctx.saved_tensors), list(grads), ctx.needs_grad),)

    op.register_autograd(backward, setup_context=setup_context)


# --- the swap policy: keep Inductor's code where it was measured faster --------------------------


@dataclass(frozen=True)
class Decision:
    """Keep Inductor's code for ``kernel`` on ``device`` in ``phase`` when the region has at most
    ``max_rows`` rows (``None``: no upper bound) and at least ``min_rows``; ``measured`` says what
    the decision rests on."""

    kernel: str
    device: str
    phase: str  # "inference" or "training"
    max_rows: int | None
    measured: str
    min_rows: int = 0

    def applies(self, kernel: str, device: str, phase: str, rows: int) -> bool:
        # a function kernel is named by its target ("transformers....modeling_qwen2.apply_rotary_pos_emb")
        kernel = kernel.rsplit(".", 1)[-1]
        return (self.kernel, self.device, self.phase) == (kernel, device, phase) and (
            self.min_rows <= rows and (self.max_rows is None or rows <= self.max_rows)
        )

    def size(self) -> str:
        if self.max_rows is None:
            return "any size" if self.min_rows == 0 else f">= {self.min_rows} rows"
        return f"<= {self.max_rows} rows" if self.min_rows == 0 else f"{self.min_rows}-{self.max_rows} rows"


# Measured on one H100 80GB HBM3, torch 2.11, triton 3.6, bf16, Qwen2-0.5B shapes, by
# ``python -m twinkle_fx.bench.swap_table``; twinkle's speed-up
# over Inductor's code for the op's reference, both replayed from CUDA graphs. A swap is kept only where
# it wins by at least 2%; the row bounds sit between the measured sizes (32, 2048, 4096 tokens).
# apply_rotary_pos_emb wins everywhere (1.22-1.96x) and is always swapped.
DECISIONS: tuple[Decision, ...] = (
    Decision("RMSNorm", "cuda", "training", None, "fwd+bwd 0.86x at 2048 rows, 0.97x at 4096"),
    Decision("RMSNorm", "cuda", "inference", 512, "fwd 0.99x at 32 rows (1.04x at 2048, 1.01x at 4096)"),
    Decision("SwiGLUMLP", "cuda", "training", None, "silu_mul fwd+bwd 0.98x at 2048 rows, 0.97x at 4096"),
    Decision("SwiGLUMLP", "cuda", "inference", None, "silu_mul fwd 0.99x at 2048 rows, 0.97x at 4096 "
             "(1.18x at 32)", min_rows=512),
)

def _rows(value: object) -> int | None:
    if not isinstance(value, torch.Tensor) or value.dim() == 0:
        return None
    return value.numel() // max(int(value.shape[-1]), 1)


def keep_inductor_reason(policy: str, kernel: str, device: str, mode: Mode, first_arg: object,
                         table: tuple[Decision, ...] | None = None) -> str | None:
    """Why Inductor's code is kept for a region of ``kernel`` under ``policy`` (None: swap it).

    ``policy`` is the graph's ``BackendOptions.applied_swap_policy``: only "measured" keeps anything.

    Examples:
        >>> table = (Decision("RMSNorm", "cuda", "inference", 64, "0.8x at 32 rows"),)
        >>> keep_inductor_reason("measured", "RMSNorm", "cuda", Mode.INFERENCE, torch.empty(32, 896), table)
        "kept Inductor's code: RMSNorm was measured slower than Inductor at <= 64 rows on cuda in inference (0.8x at 32 rows); swap_policy='always' swaps it"
    """
    if policy != "measured":
        return None
    rows = _rows(first_arg)
    if rows is None:
        return None
    phase = "training" if Mode.TRAINING in mode else "inference"
    for decision in DECISIONS if table is None else table:
        if decision.applies(kernel, device, phase, rows):
            size = decision.size()
            return (f"kept Inductor's code: {kernel.rsplit('.', 1)[-1]} was measured slower than Inductor at {size} on {device} in "
                    f"{phase} ({decision.measured}); swap_policy='always' swaps it")
    return None
