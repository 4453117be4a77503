"""``check_kernels``: run the checklist for every registered kernel, item by item (one module each)."""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..core.modes import Mode
from ..core.registry import get_registry
from ..core.selection import signature_mismatch
from .correctness import check_correctness
from .fallback import check_fallback
from .inputs import NoInputs, sizes
from .profiler import check_profiler
from .report import CHECKLIST, FAIL, PASS, SKIP, WARN, CheckInputs, CheckReport, KernelCheck
from .runner import Runner, Target
from .speed import check_speed, since
from .targets import find_targets

logger = logging.getLogger(__name__)

__all__ = ["check_kernels"]

_DTYPE_NAMES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _check_one(target: Target, device: torch.device, dtypes: list[torch.dtype], tiny: bool, compiled: bool,
               warmup: int, iters: int, progress: Callable[[str], None]) -> KernelCheck:
    choice = target.choice
    check = KernelCheck(kernel=choice.name if target.kind == "layer" else getattr(choice.kernel, "__qualname__", choice.name),
                        target=target.name, kind=target.kind, source=choice.registration.source.describe(),
                        mode="train" if Mode.TRAINING in target.mode else "inference")
    runner = Runner(target, device, dtypes, tiny, compiled, warmup, iters)
    checked_sizes = sizes(tiny)
    started = time.perf_counter()
    if target.kind == "layer":
        mismatch = signature_mismatch(target.original.forward, choice.call)
        if mismatch is not None:
            check.verdicts["correctness"], check.notes["correctness"] = FAIL, f"kernelize refuses it: {mismatch}"
            return check
    try:
        check_correctness(check, runner, checked_sizes, dtypes)
    except NoInputs as e:
        for item in CHECKLIST:
            check.verdicts[item] = SKIP
        check.notes["correctness"] = f"not checked: {e}"
        return check
    progress(f"    correctness: {check.verdicts['correctness']} ({len(check.correctness)} cases, {since(started)})")
    check_speed(check, runner, checked_sizes, dtypes[0], progress, started)
    # the items that do not depend on the timings
    check.verdicts["fallback"], check.notes["fallback"] = check_fallback(runner)
    check_profiler(check, runner, *checked_sizes[-1], dtypes[0])
    check.verdicts["documented"], check.notes["documented"] = _documented(choice.kernel)
    return check


def _documented(kernel: Any) -> tuple[str, str]:
    """The documented item: the kernel (or its forward) carries a docstring."""
    doc = inspect.getdoc(kernel)
    if not doc and isinstance(kernel, type):
        doc = inspect.getdoc(getattr(kernel, "forward", None))
    return (PASS, "has a docstring") if doc and doc.strip() else (WARN, "no docstring on the kernel")


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

    Examples:
        >>> import twinkle_triton
        >>> from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm
        >>> from twinkle_fx import check_kernels, register_external_layer, register_layer_kernel
        >>> _ = register_layer_kernel(kernel_name="RMSNorm", layer=twinkle_triton.layers.RMSNorm, device="cpu")
        >>> register_external_layer(Qwen2RMSNorm, "RMSNorm")
        >>> # not run by the doctest test: it times every size and dtype (tests/docs/test_check.py runs it)
        >>> report = check_kernels(device="cpu", tiny=True)                                    # doctest: +SKIP
        >>> print(report)                                                                      # doctest: +SKIP
    """
    from ..core.devices import parse_device

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
    targets = find_targets(get_registry(), device.type, dict(inputs or {}), tiny, kernels, unchecked)
    checks = []
    for index, target in enumerate(targets, 1):
        progress(f"[{index}/{len(targets)}] {target.choice.name} vs {target.name}")
        started = time.perf_counter()
        check = _check_one(target, device, resolved, tiny, compiled, warmup, iters, progress)
        checks.append(check)
        progress(f"    done in {since(started)}: " + ", ".join(f"{item} {check.verdicts.get(item, '-')}" for item in CHECKLIST))
    from ..measure.environment import describe_environment

    return CheckReport(device=str(device), tiny=tiny, dtypes=[str(d).removeprefix("torch.") for d in resolved],
                       checks=checks + unchecked, environment=describe_environment(device))
