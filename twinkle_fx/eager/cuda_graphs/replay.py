"""The recorded block calls of :mod:`twinkle_fx.eager.cuda_graphs.layer_graphs` and their replay.

A :class:`Sequence` is the block calls of one pass signature in capture order, each a :class:`Step`
with its graphs and static tensors; a :class:`Pass` is one forward through the blocks (and its
backward); a training step's replay is one autograd node (:class:`Replay`) whose backward replays the
step's backward graph, or recomputes the forward when the backward runs out of the recorded order.
The :class:`~twinkle_fx.eager.cuda_graphs.layer_graphs.GraphSet` that owns them records, checks and counts.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from .capture import data_ptr, fixed_ptrs, rebuild_call, spec_of

__all__ = ["Step", "Sequence", "Token", "Pass", "Replay", "copy_inputs", "recompute"]


class Step:
    """One block call of a recorded sequence: its graphs and static tensors."""

    def __init__(self, fn: Callable[..., Any], module: torch.nn.Module, signature: tuple, in_spec: tuple,
                 training: bool) -> None:
        self.fn = fn
        self.module = module
        self.signature = signature
        self.in_spec = in_spec
        self.training = training
        self.submodules = [m for m in module.modules() if m is not module]
        self.all_modules = [module, *self.submodules]
        self.fixed_ptrs = fixed_ptrs(self.all_modules)  # the graphs read parameters and buffers in place
        self.grad_params = [p for p in module.parameters() if p.requires_grad] if training else []
        self.static_in: list[torch.Tensor] = []
        self.owned_in: list[bool] = []  # False: the static input is another step's tensor (read only)
        self.grad_mask: list[bool] = []
        self.static_out: list[torch.Tensor] = []
        self.out_spec: Any = None
        self.fwd: torch.cuda.CUDAGraph | None = None
        self.bwd: torch.cuda.CUDAGraph | None = None
        self.capture_in: list[torch.Tensor] = []   # leaves the forward was captured on (until the backward capture)
        self.capture_out: list[torch.Tensor] = []  # outputs with the captured autograd graph (idem)
        self.static_grad_out: list[torch.Tensor | None] = []
        self.static_grads: tuple = ()
        self.first_sources: list | None = None  # set by the recording call, which copied the inputs in already


class Sequence:
    """The block calls of one pass signature, in capture order."""

    def __init__(self, training: bool) -> None:
        self.training = training
        self.steps: list[Step] = []
        self.recording = True
        self.failed: str | None = None
        # static outputs and gradient buffers (held, so an address names one tensor): a later step whose
        # input is one of them reads it in place
        self.statics: dict[int, torch.Tensor] = {}
        # id(source tensor) -> (weak source, static copy): a later step given the same tensor (the rotary
        # cos/sin every layer gets) reads the earlier step's copy
        self.sources: dict[int, tuple[weakref.ref, torch.Tensor]] = {}
        # id(KV cache) -> (weak cache, data pointers of its tensors when recorded): the graphs write into
        # those tensors, so a replay needs the same object with the same memory
        self.caches: dict[int, tuple[weakref.ref, tuple[int, ...]]] = {}

    def cache_gone(self) -> bool:
        return any(ref() is None for ref, _ in self.caches.values())


class Token:
    """Lives as long as one replayed step's autograd node (weakly referenced by its pass)."""

    __slots__ = ("done", "__weakref__")

    def __init__(self) -> None:
        self.done = False


class Pass:
    """One forward through the blocks (and, when training, its backward)."""

    def __init__(self, graphs: Any) -> None:  # graphs: the owning GraphSet
        self.graphs = graphs
        self.seq: Sequence | None = None
        self.cursor = 0
        self.eager = False
        self.stack: list[tuple[int, weakref.ref]] = []  # replayed training steps awaiting their backward
        self.copied: dict[int, tuple[weakref.ref, int]] = {}  # id(static input) -> (source, version) copied in
        # id(KV cache) -> (weak cache, data pointers): each cache of the pass is inspected once, at its first block
        self.caches: dict[int, tuple[weakref.ref, tuple[int, ...]]] = {}
        self.verified: set[int] = set()  # ids of the caches compared with the replayed sequence's

    def pending(self) -> bool:
        return any((token := ref()) is not None and not token.done for _, ref in self.stack)


def copy_inputs(p: Pass, step: Step, tensors: list[torch.Tensor]) -> None:
    first = step.first_sources
    if first is not None:  # the recording call copied them in before the capture
        step.first_sources = None
        for s, owned, source in zip(step.static_in, step.owned_in, first):
            if owned:
                p.copied[id(s)] = source
        return
    for t, s, owned in zip(tensors, step.static_in, step.owned_in):
        if not owned:
            continue
        ptr = data_ptr(t)
        if ptr != data_ptr(s):
            copied = p.copied.get(id(s))
            if copied is None or copied[0]() is not t or copied[1] != t._version:
                s.copy_(t)
        p.copied[id(s)] = (weakref.ref(t), t._version)


class Replay(torch.autograd.Function):
    """A training step's replay as one autograd node: the forward graph now, the backward graph
    (captured on the first backward of a recording pass) when autograd reaches it."""

    @staticmethod
    def forward(ctx, graphs: Any, p: Pass, step: Step, token: Token, n_inputs: int, *tensors):
        copy_inputs(p, step, list(tensors[:n_inputs]))
        step.fwd.replay()
        ctx.graphs, ctx.p, ctx.step, ctx.token, ctx.n_inputs = graphs, p, step, token, n_inputs
        ctx.index = p.stack[-1][0]
        return tuple(o.detach() for o in step.static_out)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads):
        graphs, p, step, token = ctx.graphs, ctx.p, ctx.step, ctx.token
        none = (None,) * 5
        n_inputs = ctx.n_inputs
        in_order = not token.done and p.stack and p.stack[-1][0] == ctx.index
        seq = p.seq
        if in_order:
            p.stack.pop()
            if step.bwd is None:
                if seq.recording and seq.failed is None:
                    try:
                        graphs._capture_backward(seq, step, grads)
                    except Exception as e:  # noqa: BLE001 - logged with the error, recomputed eagerly
                        graphs._fail(seq, f"capturing the backward of {type(step.module).__name__} raised {e!r}")
                else:
                    in_order = False
            if in_order and step.bwd is not None:
                for g, s in zip(grads, step.static_grad_out):
                    if s is not None and data_ptr(g) != data_ptr(s):
                        s.copy_(g)
                step.bwd.replay()
                token.done = True
                while p.stack and ((t := p.stack[-1][1]()) is None or t.done):  # recomputed or dropped steps
                    p.stack.pop()
                graphs.status.replays["backward"] += 1
                if seq.recording and not p.stack and seq.failed is None:
                    graphs._seal(seq)
                # fresh aliases: autograd may then keep a parameter's gradient buffer as its .grad (no copy)
                it = iter([None if g is None else g.detach() for g in step.static_grads])
                dyn = tuple(next(it) if rg else None for rg in step.grad_mask)
                dyn += (None,) * (n_inputs - len(dyn))
                return none + dyn + tuple(it)
        # out of order (or a second backward): recompute the forward from the static inputs
        if seq is not None and seq.recording and seq.failed is None:
            graphs._fail(seq, "a block's backward ran out of the recorded order")
        token.done = True
        graphs.status.replays["recompute"] += 1
        return none + recompute(step, grads, n_inputs)


def recompute(step: Step, grads: tuple, n_inputs: int) -> tuple:
    with torch.enable_grad():
        inputs = [s.detach().requires_grad_(rg) for s, rg in zip(step.static_in, step.grad_mask)]
        args, kwargs = rebuild_call(step.in_spec, inputs)
        outs: list[torch.Tensor] = []
        spec_of(step.fn(step.module, *args, **kwargs), outs)
        pairs = [(o, g) for o, g in zip(outs, grads) if o.requires_grad]
        targets = [i for i, rg in zip(inputs, step.grad_mask) if rg] + step.grad_params
        result = torch.autograd.grad([o for o, _ in pairs], targets, [g for _, g in pairs], allow_unused=True)
    it = iter(result)
    dyn = tuple(next(it) if rg else None for rg in step.grad_mask)
    dyn += (None,) * (n_inputs - len(dyn))
    return dyn + tuple(it)
