"""``twinkle-fx check`` / :func:`check_kernels`: the kernel author's checklist, run for every
registered kernel against the original it replaces.

For each target (a layer class bound to a kernel name, or a registered function), on one device:

===============  ==========================================================================================
correctness      outputs and gradients (inputs and parameters) of the kernel vs the original, for several
                 sizes (odd ones included) and dtypes against an fp64 run of the original: the kernel's
                 error norm within PyTorch's own (same dtype) plus the tolerances of
                 :mod:`twinkle_fx.tolerances`; an inference-only kernel is checked forward only
speed-up         median time of the original / the kernel (forward + backward when the kernel has one),
                 eager at every size, and both under ``torch.compile`` (Inductor) where the kernel can
                 compile; the guide's bar is 1.2x. Under the Triton interpreter (CPU) times say nothing
                 about speed: N/A
sizes            the kernel is not slower than the original at any size checked
memory           (GPU) peak memory of one call above what was allocated before it, kernel vs original
fallback         the swap keeps the original: after undo, the layer's forward / the module's function is
                 the original object again and gives bit-identical outputs
profiler         the top rows of ``torch.profiler`` for the kernel's call (device time on a GPU)
documented       the kernel carries a docstring
===============  ==========================================================================================

Inputs: the built-in targets (transformers RMSNorm / MLP / ForCausalLM classes of a model family,
their ``apply_rotary_pos_emb``) are built from a small config of their family; other modules are
built with no arguments (``torch.nn.Linear`` / ``LayerNorm`` with the width) and get one
``(rows, width)`` tensor; other functions get one such tensor per required parameter. Anything
else takes ``inputs={target: make}`` (see :class:`CheckInputs`); a target whose inputs cannot be
made is reported as not checked, with the reason.
"""

from __future__ import annotations

import argparse
import copy
import functools
import importlib
import inspect
import json
import logging
import math
import runpy
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from .bench.timing import DeviceClock
from .modes import Mode
from .registry import KernelRegistry, get_registry
from .selection import KernelChoice, select_function_kernel, select_layer_kernel, signature_mismatch
from .tolerances import tolerance

logger = logging.getLogger(__name__)

__all__ = ["CheckInputs", "CorrectnessCase", "SpeedCase", "KernelCheck", "CheckReport", "check_kernels",
           "add_parser", "run"]

SPEEDUP_BAR = 1.2  # the guide's "clear speed-up over the PyTorch implementation"
PASS, FAIL, WARN, NA, SKIP = "PASS", "FAIL", "WARN", "N/A", "SKIP"
CHECKLIST = ("correctness", "speed-up", "sizes", "memory", "fallback", "profiler", "documented")

_DTYPE_NAMES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class CheckInputs:
    """What one check call runs: ``module`` (layers; None for functions) called with ``args`` / ``kwargs``.

    A maker passed in ``inputs=`` is ``make(rows, dtype, device) -> CheckInputs``; ``rows`` is the
    size being checked (tokens), e.g.::

        check_kernels(inputs={MyLayer: lambda rows, dtype, device: CheckInputs(
            (torch.randn(rows, 96, dtype=dtype, device=device),), module=MyLayer(96).to(device, dtype))})
    """

    args: tuple
    kwargs: dict = field(default_factory=dict)
    module: torch.nn.Module | None = None
    # positions in ``args`` that take no gradient (e.g. rotary cos/sin); other float tensors do in training
    no_grad_args: tuple[int, ...] = ()


@dataclass(frozen=True)
class CorrectnessCase:
    """One size x dtype: the worst error relative to the tolerance (``<= 1`` passes)."""

    shape: str
    dtype: str
    forward_error: float  # max |kernel - original| of the outputs
    backward_error: float | None  # of the gradients; None when checked forward only
    passed: bool
    error: str | None = None  # the kernel (or the original) raised


@dataclass(frozen=True)
class SpeedCase:
    shape: str
    dtype: str
    what: str  # "eager fwd+bwd", "compiled fwd", ...
    original_ms: float
    kernel_ms: float
    original_peak_mib: float | None = None  # GPU only
    kernel_peak_mib: float | None = None

    @property
    def speedup(self) -> float:
        return self.original_ms / self.kernel_ms if self.kernel_ms > 0 else math.inf


@dataclass
class KernelCheck:
    """The checklist for one kernel against one original."""

    kernel: str  # kernel name (layers) or the replacement (functions)
    target: str  # the original: "Qwen2MLP" or "module.func"
    kind: str  # "layer" or "function"
    source: str = ""  # where the kernel comes from
    mode: str = ""  # "train" (forward + backward) or "inference"
    verdicts: dict[str, str] = field(default_factory=dict)  # checklist item -> PASS/FAIL/WARN/N/A/SKIP
    notes: dict[str, str] = field(default_factory=dict)  # checklist item -> why / numbers
    correctness: list[CorrectnessCase] = field(default_factory=list)
    speed: list[SpeedCase] = field(default_factory=list)
    profile: list[dict[str, Any]] = field(default_factory=list)  # top profiler rows

    @property
    def failed(self) -> bool:
        return self.verdicts.get("correctness") == FAIL


@dataclass
class CheckReport:
    device: str
    tiny: bool
    dtypes: list[str]
    checks: list[KernelCheck]
    environment: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        """A correctness failure (what makes ``twinkle-fx check`` exit with status 1)."""
        return any(c.failed for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for check, raw in zip(self.checks, data["checks"]):
            for case, row in zip(check.speed, raw["speed"]):
                row["speedup"] = case.speedup
        return data

    def __str__(self) -> str:
        header = ["kernel", "original", *CHECKLIST]
        rows = [header] + [[c.kernel, c.target, *(c.verdicts.get(item, "-") for item in CHECKLIST)] for c in self.checks]
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        lines = [f"twinkle-fx check on {self.device}{' (--tiny, Triton interpreter)' if self.tiny else ''}, "
                 f"dtypes {', '.join(self.dtypes)}", ""]
        for index, row in enumerate(rows):
            lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
            if index == 0:
                lines.append("  ".join("-" * w for w in widths))
        for check in self.checks:
            lines.append("")
            lines.append(f"{check.kernel} vs {check.target} [{check.mode}] from {check.source}")
            for item in CHECKLIST:
                if item in check.notes:
                    lines.append(f"  {item}: {check.notes[item]}")
            for row in check.profile[:5]:
                lines.append(f"    {row['name'][:60]:60s} {row['calls']:>5d} calls  {row['time_ms']:9.3f} ms {row['clock']}")
        if not self.checks:
            lines.append("(nothing registered to check)")
        return "\n".join(lines)


# -- inputs -----------------------------------------------------------------------------------------


def _sizes(tiny: bool) -> list[tuple[int, int]]:
    """(rows, width) per size: odd row counts and widths that are no power of two."""
    # GPU: up to 4093 tokens (the fused-loss check holds 4093 x 151936 logits in fp32 and fp64)
    return [(1, 8), (7, 34), (33, 130)] if tiny else [(1, 1024), (1023, 4098), (4093, 8192)]


def _transformers_config(cls: type, tiny: bool):
    """A small config of the transformers model family ``cls`` belongs to, or None."""
    module = sys.modules.get(cls.__module__)
    if module is None or not cls.__module__.startswith("transformers.models."):
        return None
    from transformers import PretrainedConfig

    configs = [v for v in vars(module).values() if isinstance(v, type) and issubclass(v, PretrainedConfig)
               and v is not PretrainedConfig]
    if not configs:
        return None
    sizes = (dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
             if tiny else  # Qwen2-0.5B's widths and vocabulary, one layer
             dict(hidden_size=896, intermediate_size=4864, num_attention_heads=14, num_key_value_heads=2,
                  vocab_size=151936))
    config = configs[0](num_hidden_layers=1, max_position_embeddings=max(r for r, _ in _sizes(tiny)) + 1,
                        tie_word_embeddings=True, **sizes)
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"  # what a bare config leaves unset (from_config would pick one)
    return config


def _randomize(module: torch.nn.Module) -> torch.nn.Module:
    # weights at their init (RMSNorm weights are all ones) would hide a kernel that ignores them
    with torch.no_grad():
        for p in module.parameters():
            if p.is_floating_point():
                p.add_(torch.randn_like(p) * 0.1 * (p.detach().float().std().nan_to_num(0).item() + 0.1))
    return module


def _layer_inputs(cls: type, rows: int, width: int, dtype: torch.dtype, device: torch.device, tiny: bool) -> CheckInputs:
    config = _transformers_config(cls, tiny)
    params = list(inspect.signature(cls.__init__).parameters)[1:]
    if config is not None and params[:1] == ["config"]:
        module = cls(config)
        forward = list(inspect.signature(cls.forward).parameters)[1:]
        if "input_ids" in forward:
            ids = torch.randint(0, config.vocab_size, (1, rows), device=device)
            kwargs = {"input_ids": ids, "labels": ids} if "labels" in forward else {"input_ids": ids}
            return CheckInputs((), kwargs, _randomize(module).to(device=device, dtype=dtype))
        if "top_k_index" in forward:  # MoE *Experts(hidden_states, top_k_index, top_k_weights): routed tokens
            k = min(2, module.num_experts)
            index = torch.rand(rows, module.num_experts).argsort(-1)[:, :k].to(device)
            weights = torch.rand(rows, k, device=device).softmax(-1).to(dtype)
            x = torch.randn(rows, config.hidden_size, device=device, dtype=dtype)
            with torch.no_grad():  # 3-D expert weights come from torch.empty: only the model's init fills them
                for p in module.parameters():
                    p.normal_(0.0, 0.1)
            return CheckInputs((x, index, weights), {}, module.to(device=device, dtype=dtype))
        x = torch.randn(1, rows, config.hidden_size, device=device, dtype=dtype)
        return CheckInputs((x,), {}, _randomize(module).to(device=device, dtype=dtype))
    if config is not None and params[:1] == ["hidden_size"]:  # RMSNorm(hidden_size, eps)
        module = cls(config.hidden_size)
        x = torch.randn(1, rows, config.hidden_size, device=device, dtype=dtype)
        return CheckInputs((x,), {}, _randomize(module).to(device=device, dtype=dtype))
    if cls in (torch.nn.Linear, torch.nn.LayerNorm) or (params[:1] in (["in_features"], ["normalized_shape"])):
        module = cls(width, width) if "in_features" in params else cls(width)
    else:
        try:
            module = cls()
        except TypeError as e:
            raise _NoInputs(f"cannot build {cls.__qualname__} without arguments ({e}); pass inputs={{{cls.__qualname__}: make}}") from e
    return CheckInputs((torch.randn(rows, width, device=device, dtype=dtype),), {},
                       _randomize(module).to(device=device, dtype=dtype))


def _function_inputs(name: str, function: Callable, rows: int, width: int, dtype: torch.dtype, device: torch.device,
                     tiny: bool) -> CheckInputs:
    # transformers' (q, k, cos, sin), DeepSeek-V3's interleaved variant too; wrapped by kernels' hub decorator
    if name in ("apply_rotary_pos_emb", "apply_rotary_pos_emb_interleave"):
        heads, kv_heads, head_dim = (4, 2, 16) if tiny else (14, 2, 64)
        q = torch.randn(1, heads, rows, head_dim, device=device, dtype=dtype)
        k = torch.randn(1, kv_heads, rows, head_dim, device=device, dtype=dtype)
        inv_freq = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
        freqs = torch.arange(rows, device=device, dtype=torch.float32)[:, None] * inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)[None]
        return CheckInputs((q, k, emb.cos().to(dtype), emb.sin().to(dtype)), no_grad_args=(2, 3))
    try:
        params = inspect.signature(function).parameters.values()
    except (TypeError, ValueError) as e:
        raise _NoInputs(f"cannot read the signature of {name or function!r}; pass inputs=") from e
    required = [p for p in params if p.default is inspect.Parameter.empty
                and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return CheckInputs(tuple(torch.randn(rows, width, device=device, dtype=dtype) for _ in required))


class _NoInputs(Exception):
    """The check cannot make inputs for a target (the message says what to pass)."""


# -- running --------------------------------------------------------------------------------------


def _tensors(out: Any, prefix: str = "out") -> dict[str, torch.Tensor]:
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
        found.update(_tensors(value, f"{prefix}.{key}"))
    return found


def _objective(outputs: dict[str, torch.Tensor], keys: list[str], seed: int) -> torch.Tensor | None:
    """A scalar whose gradient is a fixed random weighting of the compared outputs (multiples of 1/4
    in [-1, 1]: exact in every dtype, so the fp64 truth gets the same weights)."""
    total = None
    generator = torch.Generator().manual_seed(seed)
    for key in keys:
        out = outputs[key]
        if not out.is_floating_point() or not out.requires_grad:
            continue
        weight = (torch.randint(-4, 5, out.shape, generator=generator) / 4).to(device=out.device, dtype=out.dtype)
        term = (out * weight).double().sum()
        total = term if total is None else total + term
    return total


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
        raise _NoInputs("the call returns no floating-point output that requires grad")
    return total


def _error(ours: torch.Tensor, original: torch.Tensor, truth: torch.Tensor) -> float:
    """How far the kernel is from the truth (the original on fp64 copies), in units of what is allowed
    (<= 1 passes): the L2 norm of its error over the dtype's tolerance (``atol`` per element plus
    ``rtol`` of the truth's norm) plus the original's own error norm. A kernel may round differently
    from PyTorch, but may not be less accurate than PyTorch in the same dtype by more than one
    tolerance. Norms, not the worst element: over a gradient summed across thousands of rows, two
    different but equally accurate roundings each have elements where the other happens to be exact
    (on an H100 the worst-element ratio of the built-in norm and MLP reached 1.3-2.8 in bf16/fp16
    while their error norms matched PyTorch's)."""
    if ours.shape != truth.shape:
        return math.inf
    tol = tolerance(original.dtype)
    a, o, t = ours.detach().double(), original.detach().double(), truth.detach().double()
    if not t.numel():
        return 0.0
    # NaN where the original is NaN too (a loss over no label) is agreement, not an error
    both_nan = a.isnan() & t.isnan()
    if (a.isnan() & ~both_nan).any() or (a.isinf() & ~(a == t)).any():
        return math.inf
    a, o, t = (v.masked_fill(both_nan, 0.0).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0) for v in (a, o, t))
    allowed = tol.atol * math.sqrt(t.numel()) + tol.rtol * float(t.norm()) + float((o - t).norm())
    return float((a - t).norm()) / allowed


def _as_double(inputs: "CheckInputs") -> "CheckInputs":
    """fp64 copies of the module and the float arguments: the original run on them is the truth."""
    def convert(value: Any) -> Any:
        return value.detach().double() if isinstance(value, torch.Tensor) and value.is_floating_point() else value

    module = None if inputs.module is None else copy.deepcopy(inputs.module).double()
    return CheckInputs(tuple(convert(a) for a in inputs.args), {k: convert(v) for k, v in inputs.kwargs.items()},
                       module, inputs.no_grad_args)


@dataclass
class _Target:
    kind: str
    name: str  # the original's display name
    choice: KernelChoice
    mode: Mode
    original: Any  # the class (layers) or the function
    make: Callable[[int, int, torch.dtype, torch.device], CheckInputs]


class _Runner:
    """Runs one target's checks: correctness per size x dtype, speed, memory, fallback, profile."""

    def __init__(self, target: _Target, device: torch.device, dtypes: list[torch.dtype], tiny: bool,
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

    def _outputs(self, call: Callable[[], Any]) -> dict[str, torch.Tensor]:
        with torch.set_grad_enabled(self.train):
            return _tensors(call())

    def _grads(self, outputs: dict[str, torch.Tensor], keys: list[str], wrt: list[torch.Tensor], seed: int
               ) -> list[torch.Tensor | None]:
        objective = _objective(outputs, keys, seed) if self.train and wrt else None
        return [] if objective is None else list(torch.autograd.grad(objective, wrt, allow_unused=True))

    def correctness(self, rows: int, width: int, dtype: torch.dtype) -> CorrectnessCase:
        dname = str(dtype).removeprefix("torch.")
        inputs = self.inputs(rows, width, dtype)
        truth_inputs = _as_double(inputs)
        wrt, truth_wrt = self.wrt(inputs), self.wrt(truth_inputs)
        original, kernel = self.calls(inputs)
        truth_call = self.calls(truth_inputs)[0]
        shape = ", ".join(f"{tuple(a.shape)}" for a in (*inputs.args, *inputs.kwargs.values()) if isinstance(a, torch.Tensor))
        try:
            expected = self._outputs(original)
            ours = self._outputs(kernel)
            keys = [k for k in expected if k in ours and expected[k].is_floating_point()]
            if not keys:
                return CorrectnessCase(shape, dname, math.inf, None, False,
                                       f"no output to compare (original: {list(expected)}, kernel: {list(ours)})")
            truth = self._outputs(truth_call)
            grads_ref = self._grads(expected, keys, wrt, rows)
            grads = self._grads(ours, keys, wrt, rows)
            grads_truth = self._grads(truth, keys, truth_wrt, rows)
        except Exception as e:  # noqa: BLE001 - a raising kernel is a failed case, the check goes on
            return CorrectnessCase(shape, dname, math.inf, None, False, f"{type(e).__name__}: {e}")
        forward = max(_error(ours[k], expected[k], truth[k]) for k in keys)
        backward = None
        if grads_ref:
            backward = max((math.inf if (a is None) != (b is None) else 0.0 if a is None else _error(a, b, t)
                            for a, b, t in zip(grads, grads_ref, grads_truth)), default=0.0)
        passed = forward <= 1 and (backward is None or backward <= 1)
        return CorrectnessCase(shape, dname, forward, backward, passed)

    def _step(self, fn: Callable[[], Any], wrt: list[torch.Tensor]) -> Callable[[], None]:
        if not self.train:
            def forward_only() -> None:
                with torch.no_grad():
                    fn()
            return forward_only

        weights: dict[str, torch.Tensor] = {}

        def forward_backward() -> None:
            outputs = _tensors(fn())
            torch.autograd.grad(_timing_objective(outputs, weights), wrt, allow_unused=True)
        return forward_backward

    def _peak_mib(self, step: Callable[[], None]) -> float | None:
        if not self.clock.cuda:
            return None
        before = self.clock.allocated()
        self.clock.reset_peak()
        step()
        return max(self.clock.peak() - before, 0) / 2**20

    def speed(self, rows: int, width: int, dtype: torch.dtype, compiled: bool) -> SpeedCase:
        inputs = self.inputs(rows, width, dtype)
        wrt = self.wrt(inputs)
        original, kernel = self.calls(inputs)
        if compiled:
            original, kernel = torch.compile(original), torch.compile(kernel)
        steps = [self._step(fn, wrt) for fn in (original, kernel)]
        timings = []
        for step in steps:  # on the checked device's clock (benchmark_kernel picks it from tensor arguments)
            for _ in range(max(self.warmup, 1) if compiled else self.warmup):  # compiling is no timed call
                step()
            timings.append(statistics.median(self.clock.each_ms(step, self.iters)))
        peaks = [self._peak_mib(step) for step in steps]
        shape = ", ".join(f"{tuple(a.shape)}" for a in (*inputs.args, *inputs.kwargs.values()) if isinstance(a, torch.Tensor))
        what = f"{'compiled' if compiled else 'eager'} {'fwd+bwd' if self.train else 'fwd'}"
        return SpeedCase(shape, str(dtype).removeprefix("torch."), what, timings[0], timings[1], peaks[0], peaks[1])

    def profile(self, rows: int, width: int, dtype: torch.dtype) -> list[dict[str, Any]]:
        from torch.profiler import ProfilerActivity, profile

        inputs = self.inputs(rows, width, dtype)
        step = self._step(self.calls(inputs)[1], self.wrt(inputs))
        calls = 1 if self.tiny else 3  # the interpreter's calls are slow and its rows all alike
        if not self.tiny:
            step()  # out of the profile: first-call work (autotuning, caches)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.clock.cuda else [])
        with profile(activities=activities) as prof:
            for _ in range(calls):
                step()
            self.clock.synchronize()
        rows_out = []
        from .bench.profile import device_us

        for event in prof.key_averages():
            us, clock = (device_us(event), "device") if self.clock.cuda else (event.self_cpu_time_total, "self CPU")
            if us > 0:
                rows_out.append({"name": event.key, "calls": event.count, "time_ms": us / 1e3, "clock": clock})
        return sorted(rows_out, key=lambda r: -r["time_ms"])[:10]

    def fallback(self) -> tuple[str, str]:
        """Swap through twinkle_fx, undo, and check the original is back exactly."""
        from .eager import kernelize_model, undo_kernelize
        from .eager.function_patches import apply_function_kernel

        rows, width = _sizes(self.tiny)[0]
        inputs = self.inputs(rows, width, self.dtypes[0])
        original, _ = self.calls(inputs)
        with torch.no_grad():
            before = _tensors(original())
        if self.t.kind == "layer":
            module = inputs.module
            scope = get_registry().binding_scope(type(module))
            root = module if scope is None else _under_parent(module, scope[0])
            kernelize_model(root, mode=self.t.mode, device=self.device.type, use_fallback=True)
            swapped = "forward" in vars(module)
            undo_kernelize(module)
            restored = "forward" not in vars(module)
            with torch.no_grad():
                after = _tensors(module(*inputs.args, **inputs.kwargs))
        else:
            module_name, func = self.t.name.rsplit(".", 1)
            target_module = importlib.import_module(module_name)
            patched = apply_function_kernel(target_module=module_name, device=self.device.type, mode=self.t.mode,
                                            use_fallback=True)
            swapped = getattr(target_module, func) is not self.t.original
            patched.restore()
            restored = getattr(target_module, func) is self.t.original
            with torch.no_grad():
                after = _tensors(getattr(target_module, func)(*inputs.args, **inputs.kwargs))
        identical = before.keys() == after.keys() and all(
            torch.allclose(before[k], after[k], rtol=0, atol=0, equal_nan=True) for k in before)
        if not swapped:
            return FAIL, "kernelize did not swap the kernel in, so its fallback could not be exercised"
        if restored and identical:
            return PASS, "undo restores the original, bit-identical outputs; elsewhere the original runs (use_fallback)"
        return FAIL, f"after undo: original restored {restored}, bit-identical outputs {identical}"


def _under_parent(module: torch.nn.Module, parent_cls: type) -> torch.nn.Module:
    """``module`` as the child of a bare ``parent_cls`` (its own ``__init__`` not run: it needs a
    config), so that a binding limited to that parent (``register_external_layer(within=...)``) serves it."""
    parent = parent_cls.__new__(parent_cls)
    torch.nn.Module.__init__(parent)
    parent.child = module
    return parent


def _documented(kernel: Any) -> tuple[str, str]:
    doc = inspect.getdoc(kernel)
    if not doc and isinstance(kernel, type):
        doc = inspect.getdoc(getattr(kernel, "forward", None))
    return (PASS, "has a docstring") if doc and doc.strip() else (WARN, "no docstring on the kernel")


def _check_one(target: _Target, device: torch.device, dtypes: list[torch.dtype], tiny: bool, compiled: bool,
               warmup: int, iters: int, progress: Callable[[str], None]) -> KernelCheck:
    choice = target.choice
    check = KernelCheck(kernel=choice.name if target.kind == "layer" else getattr(choice.kernel, "__qualname__", choice.name),
                        target=target.name, kind=target.kind, source=choice.registration.source.describe(),
                        mode="train" if Mode.TRAINING in target.mode else "inference")
    runner = _Runner(target, device, dtypes, tiny, compiled, warmup, iters)
    sizes = _sizes(tiny)
    started = time.perf_counter()
    if target.kind == "layer":
        mismatch = signature_mismatch(target.original.forward, choice.call)
        if mismatch is not None:
            check.verdicts["correctness"], check.notes["correctness"] = FAIL, f"kernelize refuses it: {mismatch}"
            return check
    try:
        for dtype in dtypes:
            for rows, width in sizes:
                check.correctness.append(runner.correctness(rows, width, dtype))
    except _NoInputs as e:
        for item in CHECKLIST:
            check.verdicts[item] = SKIP
        check.notes["correctness"] = f"not checked: {e}"
        return check
    bad = [c for c in check.correctness if not c.passed]
    worst = max((max(c.forward_error, c.backward_error or 0.0) for c in check.correctness), default=0.0)
    check.verdicts["correctness"] = FAIL if bad else PASS
    what = "outputs and gradients" if runner.train else "outputs (inference-only kernel)"
    check.notes["correctness"] = (
        f"{what}, {len(check.correctness)} cases ({len(sizes)} sizes x {', '.join(str(d).removeprefix('torch.') for d in dtypes)}), "
        f"worst error {worst:.3g} of the tolerance" +
        "".join(f"; FAILED {c.dtype} {c.shape}: {c.error or f'fwd {c.forward_error:.3g}, bwd {c.backward_error}'}" for c in bad[:3]))
    progress(f"    correctness: {check.verdicts['correctness']} ({len(check.correctness)} cases, {_since(started)})")

    interpreted = device.type == "cpu"
    timed_sizes = sizes[-1:] if interpreted else sizes
    try:
        for rows, width in timed_sizes:
            check.speed.append(runner.speed(rows, width, dtypes[0], compiled=False))
            progress(f"    eager timing {check.speed[-1].shape}: {check.speed[-1].original_ms:.3f} -> "
                     f"{check.speed[-1].kernel_ms:.3f} ms ({_since(started)})")
    except Exception as e:  # noqa: BLE001 - e.g. out of memory at the largest size: a verdict, not a crash
        for item in ("speed-up", "sizes", "memory"):
            check.verdicts[item], check.notes[item] = FAIL, f"timing raised {type(e).__name__}: {e}"
        check.speed.clear()
    progress(f"    eager timing: {len(check.speed)} size(s) ({_since(started)})")
    can_compile = compiled and choice.can_torch_compile and check.speed
    compile_error = None
    if can_compile:
        rows, width = sizes[-1]
        # Dynamo caches compiled frames per code object, and every check times the same lambdas:
        # without a reset, later targets would hit the recompile limit and silently run eagerly
        torch._dynamo.reset()
        try:
            check.speed.append(runner.speed(rows, width, dtypes[0], compiled=True))
        except Exception as e:  # noqa: BLE001 - a kernel that breaks torch.compile is a finding
            compile_error = f"compiled timing raised {type(e).__name__}: {e}"
        torch._dynamo.reset()
        progress(f"    compiled timing: {'failed' if compile_error else 'done'} ({_since(started)})")
    if not check.speed:
        return _finish(check, runner, choice, sizes, dtypes, tiny)
    eager = [s for s in check.speed if s.what.startswith("eager")]
    largest = eager[-1]
    speedups = "; ".join(f"{s.what} {s.shape}: {s.original_ms:.3f} -> {s.kernel_ms:.3f} ms = {s.speedup:.2f}x"
                         for s in check.speed)
    if interpreted:
        check.verdicts["speed-up"] = check.verdicts["sizes"] = NA
        check.notes["speed-up"] = f"Triton interpreter on the CPU: times are not speed ({speedups})"
    else:
        best = max(s.speedup for s in check.speed if s.shape == largest.shape)
        check.verdicts["speed-up"] = PASS if best >= SPEEDUP_BAR else WARN
        check.notes["speed-up"] = (speedups + ("" if can_compile else "; compiled: not timed" +
                                               ("" if compiled else " (compiled=False)") +
                                               ("" if choice.can_torch_compile else " (can_torch_compile=False)")))
        if compile_error is not None:
            check.verdicts["speed-up"] = WARN
            check.notes["speed-up"] += f"; {compile_error}"
        slower = [s for s in eager if s.speedup < 1.0]
        check.verdicts["sizes"] = WARN if slower else PASS
        check.notes["sizes"] = (f"slower than the original at {', '.join(s.shape for s in slower)}" if slower
                                else f"not slower at any of {len(eager)} sizes")
    if largest.kernel_peak_mib is None:
        check.verdicts["memory"], check.notes["memory"] = NA, "no allocator statistics on the CPU"
    else:
        ok = largest.kernel_peak_mib <= 1.1 * largest.original_peak_mib + 1
        check.verdicts["memory"] = PASS if ok else WARN
        check.notes["memory"] = (f"peak above inputs {largest.original_peak_mib:.1f} MiB (original) -> "
                                 f"{largest.kernel_peak_mib:.1f} MiB (kernel) at {largest.shape}")
    return _finish(check, runner, choice, sizes, dtypes, tiny)


def _since(started: float) -> str:
    return f"{time.perf_counter() - started:.0f} s"


def _finish(check: KernelCheck, runner: "_Runner", choice: KernelChoice, sizes, dtypes, tiny: bool) -> KernelCheck:
    """The items that do not depend on the timings: fallback, profiler, documented."""
    check.verdicts["fallback"], check.notes["fallback"] = runner.fallback()
    with warnings.catch_warnings():  # "Profiler clears events at the end of each cycle": one cycle here, nothing lost
        warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
        check.profile = runner.profile(*sizes[-1], dtypes[0])
    check.verdicts["profiler"] = PASS if check.profile else WARN
    check.notes["profiler"] = (f"top rows by {'device' if runner.clock.cuda else 'self CPU'} time of "
                               f"{1 if tiny else 3} call(s):")
    check.verdicts["documented"], check.notes["documented"] = _documented(choice.kernel)
    return check


def _targets(registry: KernelRegistry, device: str, inputs: dict, tiny: bool, kernels: Sequence[str] | None,
             unchecked: list[KernelCheck]) -> list[_Target]:
    """Every bound layer class and every registered function, with the kernel the device gets."""
    found: list[_Target] = []

    def wanted(*names: str) -> bool:
        return not kernels or any(n in kernels for n in names)

    def select(selector, *args) -> tuple[Mode, Any]:
        selection = selector(registry, *args, device, Mode.TRAINING)
        if selection is None or selection.ok:
            return Mode.TRAINING, selection
        return Mode.INFERENCE, selector(registry, *args, device, Mode.INFERENCE)

    bound_names = set()
    for cls, kernel_name in registry.bindings().items():
        bound_names.add(kernel_name)
        if not wanted(kernel_name, cls.__qualname__):
            continue
        scope = registry.binding_scope(cls)  # a binding limited to parents: checked as under the first
        mode, selection = select(select_layer_kernel if scope is None else
                                 functools.partial(select_layer_kernel, parent=scope[0]), cls)
        if selection is None or not selection.ok:
            unchecked.append(_unchecked(kernel_name, cls.__qualname__, "layer",
                                        selection.reason if selection else "no registrations"))
            continue
        make = inputs.get(cls)
        found.append(_Target("layer", cls.__qualname__, selection.choice, mode, cls,
                             (lambda rows, width, dtype, dev, make=make: make(rows, dtype, dev)) if make else
                             (lambda rows, width, dtype, dev, cls=cls: _layer_inputs(cls, rows, width, dtype, dev, tiny))))
    for kernel_name in registry.layer_kernel_names():
        if kernel_name not in bound_names and wanted(kernel_name):
            unchecked.append(_unchecked(kernel_name, "-", "layer", "no class is bound to it (register_external_layer), "
                                        "so there is no original to check it against"))
    for target in registry.function_targets():
        if not wanted(target, target.rsplit(".", 1)[1]):
            continue
        module_name, func = target.rsplit(".", 1)
        try:
            original = getattr(importlib.import_module(module_name), func)
        except (ImportError, AttributeError) as e:
            unchecked.append(_unchecked(target, target, "function", f"the original cannot be found: {e!r}"))
            continue
        mode, selection = select(select_function_kernel, target)
        if not selection.ok:
            unchecked.append(_unchecked(target, target, "function", selection.reason))
            continue
        make = inputs.get(target) or inputs.get(original)
        found.append(_Target("function", target, selection.choice, mode, original,
                             (lambda rows, width, dtype, dev, make=make: make(rows, dtype, dev)) if make else
                             (lambda rows, width, dtype, dev, fn=original, func=func: _function_inputs(func, fn, rows, width, dtype, dev, tiny))))
    return found


def _unchecked(kernel: str, target: str, kind: str, reason: str) -> KernelCheck:
    check = KernelCheck(kernel=kernel, target=target, kind=kind, verdicts=dict.fromkeys(CHECKLIST, SKIP))
    check.notes["correctness"] = f"not checked: {reason}"
    return check


def check_kernels(
    *,
    device: str | torch.device | None = None,
    tiny: bool = False,
    dtypes: Sequence[str | torch.dtype] | None = None,
    kernels: Sequence[str] | None = None,
    inputs: dict[Any, Callable[[int, torch.dtype, torch.device], CheckInputs]] | None = None,
    compiled: bool | None = None,
    warmup: int | None = None,
    iters: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> CheckReport:
    """Run the kernel author's checklist for every kernel in the active registry against the original
    it replaces (see the module docstring for each item).

    Args:
        device (*optional*): where to check; defaults to CUDA when available, else the CPU (where the
            Triton kernels run through the interpreter: set ``TRITON_INTERPRET=1`` before importing them).
        tiny (`bool`, defaults to `False`): small sizes and few timed calls (CPU, CI).
        dtypes (*optional*): "fp32", "bf16", "fp16" or torch dtypes; default fp32 + bf16 (+ fp16 on a GPU).
        kernels (*optional*): only these kernel names, classes or targets ("Qwen2MLP", "add", ...).
        inputs (*optional*): ``{class or "module.func": make(rows, dtype, device) -> CheckInputs}`` for
            targets the check cannot build itself.
        compiled (*optional*): also time both under ``torch.compile``; default: on a GPU and not tiny.
        warmup, iters (*optional*): untimed and timed calls per timing (default 10 / 50; tiny 0 / 2).
        progress (*optional*): called with a line per step (the CLI prints them to stderr).

    Returns:
        [`CheckReport`]: ``str(report)`` is the table; ``report.failed`` is a correctness failure.

    Raises:
        ValueError: an unknown dtype, or a negative warmup / iters below 1.

    Example:
        >>> import twinkle_triton
        >>> from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm
        >>> from twinkle_fx import check_kernels, register_external_layer, register_layer_kernel
        >>> _ = register_layer_kernel(kernel_name="RMSNorm", layer=twinkle_triton.layers.RMSNorm, device="cpu")
        >>> register_external_layer(Qwen2RMSNorm, "RMSNorm")
        >>> # not run by the doctest test: it times every size and dtype (tests/docs/test_check.py runs it)
        >>> report = check_kernels(device="cpu", tiny=True)                                    # doctest: +SKIP
        >>> print(report)                                                                      # doctest: +SKIP
    """
    from .devices import parse_device

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    parse_device(device)
    cuda = device.type == "cuda"
    names = list(dtypes) if dtypes else (["fp32", "bf16", "fp16"] if cuda else ["fp32", "bf16"])
    resolved = []
    for name in names:
        if isinstance(name, torch.dtype):
            resolved.append(name)
        elif name in _DTYPE_NAMES:
            resolved.append(_DTYPE_NAMES[name])
        else:
            raise ValueError(f"check_kernels: unknown dtype {name!r}; valid: {', '.join(_DTYPE_NAMES)}.")
    if cuda and not tiny and resolved[0] == torch.float32 and torch.bfloat16 in resolved:
        resolved.remove(torch.bfloat16)
        resolved.insert(0, torch.bfloat16)  # timings and memory on the first dtype: bf16 is what a GPU trains in
    warmup = (0 if tiny else 10) if warmup is None else warmup  # tiny: the correctness runs warmed it up
    iters = (2 if tiny else 50) if iters is None else iters
    if warmup < 0 or iters < 1:
        raise ValueError(f"check_kernels: warmup must be >= 0 and iters >= 1 (got {warmup}, {iters}).")
    compiled = (cuda and not tiny) if compiled is None else compiled
    progress = progress or (lambda line: logger.info("%s", line))

    unchecked: list[KernelCheck] = []
    targets = _targets(get_registry(), device.type, dict(inputs or {}), tiny, kernels, unchecked)
    checks = []
    for index, target in enumerate(targets, 1):
        progress(f"[{index}/{len(targets)}] {target.choice.name} vs {target.name}")
        started = time.perf_counter()
        check = _check_one(target, device, resolved, tiny, compiled, warmup, iters, progress)
        checks.append(check)
        progress(f"    done in {_since(started)}: " + ", ".join(f"{item} {check.verdicts.get(item, '-')}" for item in CHECKLIST))
    from .bench.environment import describe_environment

    return CheckReport(device=str(device), tiny=tiny, dtypes=[str(d).removeprefix("torch.") for d in resolved],
                       checks=checks + unchecked, environment=describe_environment(device))


# -- command line -----------------------------------------------------------------------------------


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``check`` subcommand to the ``twinkle-fx`` parser."""
    parser = subparsers.add_parser(
        "check", help="the kernel author's checklist for every registered kernel",
        description="Check every registered kernel against the original it replaces: correctness forward and "
                    "backward over several sizes and dtypes, speed-up (eager and compiled), peak memory, "
                    "fallback, profiler rows, docstring. Exit status 1 on a correctness failure.",
        epilog="examples:\n  twinkle-fx check                       # the built-in kernels on the GPU\n"
               "  twinkle-fx check --tiny                # the same on the CPU, small sizes (CI)\n"
               "  twinkle-fx check --no-builtin --setup my_kernels_setup.py --out check.json",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="small sizes, few timed calls, the CPU by default")
    parser.add_argument("--device", help="default cuda when available (--tiny: cpu)")
    parser.add_argument("--dtypes", help="comma-separated fp32,bf16,fp16 (default fp32,bf16; GPU adds fp16)")
    parser.add_argument("--kernels", help="comma-separated kernel names, classes or functions to check (default all)")
    parser.add_argument("--setup", action="append", default=[], metavar="FILE_OR_MODULE",
                        help="a Python file or module that registers your kernels (run before checking; repeatable)")
    parser.add_argument("--no-builtin", action="store_true", help="do not register the built-in kernels")
    parser.add_argument("--models", default="qwen2",
                        help="built-in model families whose layers the built-in kernels are checked against "
                             "(comma-separated, or 'all'; default qwen2)")
    parser.add_argument("--compile", dest="compiled", action=argparse.BooleanOptionalAction, default=None,
                        help="also time under torch.compile (default: on a GPU without --tiny)")
    parser.add_argument("--out", type=Path, help="write the report as JSON to this file")
    parser.set_defaults(run=run)
    return parser


def _run_setup(spec: str) -> None:
    path = Path(spec)
    if path.suffix == ".py" or path.is_file():
        if not path.is_file():
            raise SystemExit(f"twinkle-fx check: --setup {spec}: no such file")
        sys.path.insert(0, str(path.resolve().parent))
        runpy.run_path(str(path), run_name="__twinkle_check_setup__")
    else:
        importlib.import_module(spec)


def run(args: argparse.Namespace) -> int:
    """Run ``twinkle-fx check`` with parsed ``args``; returns the exit status (1: a correctness failure)."""
    from .bench.environment import resolve_device
    from .builtin import BUILTIN_MODELS, use_builtin_kernels
    from .registry import scoped_registry
    from .settings import use_triton_interpreter

    device = resolve_device(args.device, tiny=args.tiny)
    if device.type == "cpu":
        use_triton_interpreter(command="twinkle-fx check")
        torch.set_num_threads(1)  # tiny ops: intra-op threads only add barriers (see bench --tiny)
    models = list(BUILTIN_MODELS) if args.models == "all" else [m.strip() for m in args.models.split(",") if m.strip()]

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    with scoped_registry():
        try:
            if not args.no_builtin:
                use_builtin_kernels(devices=(device.type,), models=models)
            for spec in args.setup:
                _run_setup(spec)
            report = check_kernels(
                device=device, tiny=args.tiny, compiled=args.compiled, progress=progress,
                dtypes=[d.strip() for d in args.dtypes.split(",")] if args.dtypes else None,
                kernels=[k.strip() for k in args.kernels.split(",")] if args.kernels else None,
            )
        except ValueError as e:
            raise SystemExit(f"twinkle-fx check: {e}") from None
    print(report)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report.to_json(), indent=2, default=str) + "\n")
        print(f"\nwrote {args.out}")
    return 1 if report.failed else 0
