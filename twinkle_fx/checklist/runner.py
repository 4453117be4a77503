"""One target's calls, shared by every check: the original and the kernel on the same inputs, the
tensors that take gradients, and one step (forward, or forward and backward) as timed or profiled."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..measure.clock import DeviceClock
from ..core.modes import Mode
from ..core.selection import KernelChoice
from .inputs import NoInputs
from .report import CheckInputs

__all__ = ["Target", "Runner", "tensors", "shape_of"]


def tensors(out: Any, prefix: str = "out") -> dict[str, torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return {prefix: out}
    if hasattr(out, "items") and callable(out.items):  # dict, transformers ModelOutput
        items = out.items()
    elif isinstance(out, (tuple, list)):
        items = ((str(i), v) for i, v in enumerate(out))
    else:
        return {}
    found: dict[str, torch.Tensor] = {}
    for key, value in items:
        found.update(tensors(value, f"{prefix}.{key}"))
    return found


def _timing_objective(outputs: dict[str, torch.Tensor], weights: dict[str, torch.Tensor]) -> torch.Tensor:
    """What a timed training step backpropagates: the loss when the target returns one (a training
    step's ``loss.backward()``; a fused-loss head computes no logits gradient), else the outputs
    weighted by random weights made once on the device. Not :func:`_objective`: its CPU weights and
    fp64 sum are made for the fp64 truth, and at 4093 x 151936 logits they cost seconds a call."""
    losses = [out for key, out in outputs.items() if key.rsplit(".", 1)[-1] == "loss" and out.requires_grad]
    if losses:
        return sum(losses)
    total = None
    for key, out in outputs.items():
        if not out.is_floating_point() or not out.requires_grad:
            continue
        weight = weights.get(key)
        if weight is None or weight.shape != out.shape:
            generator = torch.Generator(device=out.device).manual_seed(len(weights))
            weight = weights[key] = torch.rand(out.shape, generator=generator, device=out.device, dtype=out.dtype)
        term = (out * weight).sum(dtype=torch.float32)
        total = term if total is None else total + term
    if total is None:
        raise NoInputs("the call returns no floating-point output that requires grad")
    return total


@dataclass
class Target:
    kind: str
    name: str  # the original's display name
    choice: KernelChoice
    mode: Mode
    original: Any  # the class (layers) or the function
    make: Callable[[int, int, torch.dtype, torch.device], CheckInputs]



class Runner:
    """What every check of one target needs: its calls, its inputs, the device clock."""

    def __init__(self, target: Target, device: torch.device, dtypes: list[torch.dtype], tiny: bool,
                 compiled: bool, warmup: int, iters: int) -> None:
        self.t, self.device, self.dtypes, self.tiny = target, device, dtypes, tiny
        self.compiled, self.warmup, self.iters = compiled, warmup, iters
        self.train = Mode.TRAINING in target.mode
        self.clock = DeviceClock(device)

    def calls(self, inputs: CheckInputs) -> tuple[Callable[[], Any], Callable[[], Any]]:
        """(original call, kernel call) on the same module / the same arguments."""
        t, args, kwargs = self.t, inputs.args, inputs.kwargs
        if t.kind == "layer":
            module = inputs.module
            module.train(self.train)
            forward = type(module).forward
            return (lambda: forward(module, *args, **kwargs)), (lambda: t.choice.call(module, *args, **kwargs))
        return (lambda: t.original(*args, **kwargs)), (lambda: t.choice.call(*args, **kwargs))

    def wrt(self, inputs: CheckInputs) -> list[torch.Tensor]:
        args = [a for i, a in enumerate(inputs.args) if i not in inputs.no_grad_args]
        tensors = [a for a in (*args, *inputs.kwargs.values()) if isinstance(a, torch.Tensor) and a.is_floating_point()]
        for tensor in tensors:
            tensor.requires_grad_(self.train)
        params = [p for p in inputs.module.parameters() if p.requires_grad] if inputs.module is not None else []
        return tensors + (params if self.train else [])

    def inputs(self, rows: int, width: int, dtype: torch.dtype) -> CheckInputs:
        torch.manual_seed(rows * 31 + width)
        return self.t.make(rows, width, dtype, self.device)

    def outputs(self, call: Callable[[], Any]) -> dict[str, torch.Tensor]:
        with torch.set_grad_enabled(self.train):
            return tensors(call())

    def step(self, fn: Callable[[], Any], wrt: list[torch.Tensor]) -> Callable[[], None]:
        """One timed or profiled call: forward only (inference), else forward and backward."""
        if not self.train:
            def forward_only() -> None:
                with torch.no_grad():
                    fn()
            return forward_only

        weights: dict[str, torch.Tensor] = {}

        def forward_backward() -> None:
            outputs = tensors(fn())
            torch.autograd.grad(_timing_objective(outputs, weights), wrt, allow_unused=True)
        return forward_backward


def shape_of(inputs: CheckInputs) -> str:
    """The shapes of the call's tensor arguments, as the report shows them."""
    return ", ".join(f"{tuple(a.shape)}" for a in (*inputs.args, *inputs.kwargs.values()) if isinstance(a, torch.Tensor))
