"""Opaque wrappers for kernels that cannot be traced (``can_torch_compile=False``, e.g. a Hub layer
launching raw Triton on real pointers).

The kernel call becomes a fresh ``twinkle_opaque::<name>_<n>`` custom op over the region's tensor
inputs. Its fake implementation replays the *reference region* on the fake inputs, so AOTAutograd
and Inductor get exact output metadata without running the kernel; the real implementation checks
the kernel against that metadata once per input shape. In training its backward is a second custom
op that re-runs the kernel under autograd and differentiates it (one extra kernel forward per step:
the price of a kernel the compiler cannot see into).
"""

from __future__ import annotations

import itertools
import threading
import weakref
from typing import Any

import torch
import torch.fx as fx

from ...core.caches import owns_cache
from ...core.torch_internals import autograd_inside_custom_op, fake_tensor_mode
from ..dynamo_internals import example_value
from .kernel_call import KernelCall
from ..reasons import KeepRegion, ReasonKind

__all__ = ["opaque_call", "OpaqueCall", "registered_opaque_ops"]

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
