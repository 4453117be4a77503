"""``kernelize_model``: swap layer forwards of a model and patch registered functions."""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from ..core.caches import owns_cache
from ..core.devices import check_device_available, check_model_device, infer_device, parse_device
from ..core.errors import KernelSelectionError, check_flag
from ..core.modes import Mode, format_mode, parse_mode
from ..core.registry import KernelRegistry, get_registry
from ..core.settings import DISABLE_ENV, kernels_disabled
from ..core.swaps import (FunctionChange, LayerChange, LayerSwap, forget, install_forward, overwritten_forwards,
                          restore_function_targets, revert_changes, revert_patches, swapped_forward, uninstall_forward,
                          unpatch_all)
from .function_patches import _apply, function_verifications
from .cuda_graphs.layer_graphs import GraphSet, block_modules
from .cuda_graphs.model_graphs import ModelGraphs
from .layers import checked, install_graphs
from .plan import LayerPlan, plan_layers
from .verify import Verification, Verifier

logger = logging.getLogger(__name__)

__all__ = ["kernelize_model", "undo_kernelize", "Restored", "kernelized", "verification_report"]


def _check_model(model: Any, function: str) -> None:
    if model is not None and not isinstance(model, torch.nn.Module):
        raise TypeError(f"{function}: model must be a torch.nn.Module or None, got {type(model).__name__} {model!r:.60}.")


def _resolve_mode(model: torch.nn.Module | None, mode: Any) -> Mode:
    if mode is not None:
        return parse_mode(mode)
    training = model is not None and model.training and torch.is_grad_enabled() and any(
        p.requires_grad for p in model.parameters()
    )
    inferred = Mode.TRAINING if training else Mode.INFERENCE
    logger.info("mode not given; using %r (model.training=%s)", format_mode(inferred),
                None if model is None else model.training)
    return inferred


def _resolve_device(model: torch.nn.Module | None, device: Any) -> str:
    if device is None:
        device_type = infer_device(model) if model is not None else ("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device_type = parse_device(device)
        if model is not None:
            check_model_device(model, device_type)
    check_device_available(device_type)
    return device_type


# (model class, its layer classes without a kernel) already logged: said once
_REPORTED_UNCOVERED: set[tuple[str, tuple[str, ...]]] = set()
# registry -> layer kernel names already warned about (weak: a scope that ends takes its names along)
_WARNED_UNBOUND: "weakref.WeakKeyDictionary[KernelRegistry, set[str]]" = weakref.WeakKeyDictionary()


def _reset() -> None:
    _REPORTED_UNCOVERED.clear()
    _WARNED_UNBOUND.clear()


owns_cache(__name__, _reset)


def kept_summary(candidates: int, fallbacks: dict[tuple[type, str], list[str]], functions_patched: int = 0,
                 functions_kept: list[tuple[str, str]] = ()) -> str:
    """The sentence that adds up: N swapped + M kept = candidates, each kept group with its count
    and reason; the same for functions (grouped by reason: the rotary kernel's many copies read as one).

    Examples:
        >>> print(kept_summary(3, {(nn.GELU, "no kernel for device 'cpu'"): ["1", "3"]}, 1, [("m.f", "m.f [cpu, any] from impl g: broken")]))
        swapped 1 of 3 candidate module(s) and kept 2: 2 GELU (no kernel for device 'cpu'); patched 1 of 2 function(s) and kept 1: m.f ([cpu, any] from impl g: broken)
    """
    kept = sum(len(paths) for paths in fallbacks.values())
    text = f"swapped {candidates - kept} of {candidates} candidate module(s)"
    if kept:
        text += f" and kept {kept}: " + "; ".join(f"{len(paths)} {cls.__qualname__} ({reason})"
                                                 for (cls, reason), paths in fallbacks.items())
    if functions_kept:
        text += "; " + _functions_kept(functions_patched, functions_kept)
    return text


def _functions_kept(patched: int, kept: list[tuple[str, str]]) -> str:
    groups: dict[str, list[str]] = {}
    for target, reason in kept:
        # a reason names its registration, which starts with the target: group on the rest
        groups.setdefault(reason[len(target):].lstrip() if reason.startswith(target) else reason, []).append(target)
    return (f"patched {patched} of {patched + len(kept)} function(s) and kept {len(kept)}: "
            + "; ".join(f"{_listed(tuple(targets), 3)} ({reason})" for reason, targets in groups.items()))


def _report(model: torch.nn.Module, plan: LayerPlan, installed: list[LayerSwap], device: str, mode: Mode,
            registry: KernelRegistry, functions_kept: list[tuple[str, str]], functions_patched: int) -> None:
    """INFO per class, DEBUG per module (in install_forward), and one WARNING when nothing of N
    candidates was swapped or some fell back."""
    model_name = type(model).__qualname__
    per_class = Counter((type(s.module).__qualname__, str(s.choice)) for s in installed)
    for (cls_name, kernel), count in per_class.items():
        logger.info("swapped %d %s module(s) -> %s", count, cls_name, kernel)
    for (cls, reason), paths in plan.fallbacks.items():
        logger.info("fallback: kept the original forward of %d %s module(s) (%s%s): %s", len(paths),
                    cls.__qualname__, ", ".join(paths[:3]), ", ..." if len(paths) > 3 else "", reason)
    for where, _, why in plan.stale:
        logger.debug("restored the original forward of %s: %s", where, why)
    if plan.stale:
        logger.info("restored the original forward of %d module(s) whose earlier kernel does not apply now",
                    len(plan.stale))

    warned = _WARNED_UNBOUND.setdefault(registry, set())
    for name in plan.unbound:
        if name not in warned:
            warned.add(name)
            logger.warning("layer kernel %r is registered, but no class is bound to it and no class of %s carries "
                           "kernel_layer_name=%r, so it swaps nothing;\nbind the layer class it replaces, e.g. "
                           "register_external_layer(nn.Linear, %r)", name, model_name, name, name)
    if plan.uncovered:
        key = (type(model).__qualname__, tuple(plan.uncovered))
        if key not in _REPORTED_UNCOVERED:
            _REPORTED_UNCOVERED.add(key)
            logger.info("layer classes of %s without a kernel: %s", model_name, ", ".join(plan.uncovered))

    if plan.fallbacks or functions_kept:
        logger.warning("kernelize_model(%s, %s, %s) %s", model_name, format_mode(mode), device,
                       kept_summary(plan.candidates, plan.fallbacks, functions_patched, functions_kept))
    elif plan.candidates == 0 and registry.layer_kernel_names():
        no_kernel = f"; its layer classes without a kernel: {', '.join(plan.uncovered)}" if plan.uncovered else ""
        logger.warning("kernelize_model(%s, %s, %s) swapped nothing: no module of it is bound to a registered "
                       "layer kernel (%s)%s", model_name, format_mode(mode), device,
                       ", ".join(registry.layer_kernel_names()), no_kernel)


@dataclass
class _Changes:
    """Everything one call changed, for :func:`kernelized` to put back."""

    layers: list[LayerChange] = field(default_factory=list)
    functions: list[FunctionChange] = field(default_factory=list)


def _check_graphs_option(model: torch.nn.Module | None, mode: Mode, verify: bool, cuda_graphs: bool,
                         function: str) -> None:
    check_flag("cuda_graphs", cuda_graphs)
    if not cuda_graphs:
        return
    if model is None:
        raise ValueError(f"{function}: cuda_graphs=True needs a model (its decoder layers are graphed).")
    if Mode.TORCH_COMPILE in mode:
        raise ValueError(f"{function}: cuda_graphs=True is for eager models; under torch.compile use "
                         f'mode="reduce-overhead" (got mode {format_mode(mode)!r}).')
    if verify:
        raise ValueError(f"{function}: cuda_graphs=True and verify=True do not combine: verify mode compares "
                         "every new signature with the original forward; verify first, then graph.")


def _install_graphs(model: torch.nn.Module, device: str, changes: _Changes) -> None:
    """Run the model's decoder layers through CUDA graphs (see :mod:`twinkle_fx.eager.cuda_graphs`)."""
    if device != "cuda":
        logger.warning("kernelize_model(cuda_graphs=True): CUDA graphs need a CUDA device; %s is on %s, so its "
                       "layers run without them", type(model).__qualname__, device)
        return
    blocks, reason = block_modules(model)
    if reason is not None:
        logger.warning("kernelize_model(cuda_graphs=True): %s; nothing is graphed", reason)
        return
    graphs = GraphSet([m for _, m in blocks], torch.device(device))
    for path, module in blocks:
        changes.layers.append(install_graphs(path, module, graphs))
    if all(module is not model for _, module in blocks):  # decode steps with a StaticCache: one graph each
        changes.layers.append(install_graphs("", model, graphs, ModelGraphs(model, graphs)))
    logger.info("CUDA graphs for %d %s module(s) (recorded on the second pass of each input signature)",
                len(blocks), type(blocks[0][1]).__qualname__)


def _kernelize(model: torch.nn.Module | None, mode: Mode, device: str, use_fallback: bool,
               verify: bool = False, cuda_graphs: bool = False) -> _Changes:
    """Plan and apply; returns what changed, so a scoped undo restores exactly that."""
    registry = get_registry()
    changes = _Changes()
    plan = plan_layers(model, device, mode) if model is not None else None
    if plan is not None and plan.errors and not use_fallback:
        # nothing new is installed; a kernel an earlier call installed that does not serve this
        # call must not keep running either
        for _, module, _ in plan.stale:
            uninstall_forward(module)
        removed = f"; removed the kernel an earlier call installed on {len(plan.stale)} module(s)" if plan.stale else ""
        raise KernelSelectionError(f"{plan.errors[0]} (use_fallback=False; nothing was swapped{removed})")
    functions_kept: list[tuple[str, str]] = []
    functions_patched = 0
    if registry.function_targets():
        # functions next, still before any layer is touched: a function error leaves nothing half-applied
        patched = _apply(None, device, mode, use_fallback, False, verify)
        changes.functions, functions_kept, functions_patched = patched._changes, patched._kept, len(patched)
    if plan is None:
        if functions_kept:
            logger.warning("kernelize_model(None, %s, %s) %s", format_mode(mode), device,
                           _functions_kept(functions_patched, functions_kept))
        return changes
    for _, module, _ in plan.stale:
        change = uninstall_forward(module)
        if change is not None:
            changes.layers.append(change)
    installed = []
    for swap in plan.swaps:
        verifier = None
        if verify:
            target = f"{swap.path or '<model>'} ({type(swap.module).__qualname__})"
            verifier = Verifier(target, swap.choice.name, use_fallback=use_fallback)
        change = install_forward(swap, verifier, run=checked(swap.choice.call, verifier))
        if change is not None:
            changes.layers.append(change)
        installed.append(swap)
    _report(model, plan, installed, device, mode, registry, functions_kept, functions_patched)
    if cuda_graphs:
        _install_graphs(model, device, changes)
    return changes


def kernelize_model(
    model: torch.nn.Module | None = None,
    mode: Any = None,
    device: str | torch.device | None = None,
    use_fallback: bool = True,
    *,
    verify: bool = False,
    cuda_graphs: bool = False,
) -> torch.nn.Module | None:
    """Swap registered kernels into ``model`` and patch registered functions.

    Each module whose class is bound to a kernel name gets that kernel's forward (on this instance
    only; the class and the state_dict keys are unchanged); then every registered function target
    is patched (see :func:`apply_function_kernel`). Everything is planned before anything changes.
    Kernelizing twice is a no-op; kernelizing again in another mode or after the registrations
    changed leaves exactly what this call selects (a kernel an earlier call installed that does not
    serve this one is removed, as ``kernels.kernelize`` does); :func:`undo_kernelize` restores
    everything. With ``TWINKLE_FX_DISABLE_KERNELS=1`` a call selects no kernel, so it removes the
    ones earlier calls installed (and restores patched functions).

    A WARNING says when the call swapped nothing of its candidates or kept some originals (with the
    reasons), and once when a registered layer kernel has no class bound to it; INFO lines sum up
    per class, DEBUG lines name each module.

    Args:
        model (`nn.Module`, *optional*): `None` patches functions only.
        mode (*optional*): "train", "inference", "compile", "train+compile" (or a `Mode`). Defaults to
            "train" when the model is in training mode with grad enabled, else "inference".
        device (*optional*): defaults to the device of the model's parameters ("cuda" if available
            when there is no model). It must be the device the weights are on.
        use_fallback (`bool`, defaults to `True`): keep the original forward/function (logged, with the
            reason) when no kernel fits or it cannot be loaded; `False` raises, swaps nothing new and
            removes the kernels an earlier call installed that do not fit.
        verify (`bool`, defaults to `False`): on the first call of each swapped layer and function per
            input signature, also run the original and compare outputs (and gradients when training)
            with dtype-aware tolerances; a mismatch is logged with its max error and the original is
            used from then on (``use_fallback=False``: raises KernelVerificationError). Verified
            forwards run outside ``torch.compile`` graphs, so the checks run there too. See
            :func:`verification_report`.
        cuda_graphs (`bool`, defaults to `False`): also run each decoder layer (the classes
            ``model._no_split_modules`` names) through CUDA graphs, forward and backward, recorded on
            the second forward of each input signature and replayed after; for eager training and
            inference of static shapes, where the host is the bottleneck; decode steps too, with a
            transformers ``StaticCache`` (taken by identity, updated in place by the graphs). A
            call the graphs cannot serve (new shapes beyond the recorded ones, a ``DynamicCache``,
            hooks inside the layer, autocast, dropout while training, a forward before the
            previous backward) runs the
            layer's ordinary forward, counted with its reason in
            :func:`~twinkle_fx.eager.cuda_graphs.graph_status`. A layer's outputs are overwritten when it
            runs again. On the CPU it logs why nothing is graphed. See :mod:`twinkle_fx.eager.cuda_graphs`.

    Returns:
        The same ``model`` (or None).

    Raises:
        TypeError: ``model`` is no nn.Module, or a flag is not a bool.
        ValueError: unknown mode or device, a device the weights are not on, a GPU device without a GPU,
            or ``cuda_graphs=True`` with a compile mode, with ``verify=True`` or without a model.
        KernelSelectionError: no usable kernel and ``use_fallback=False``.

    Examples:
        >>> from twinkle_fx import register_external_layer, register_layer_kernel
        >>> class TanhGelu(nn.Module):   # a kernel: a layer class whose forward replaces the original's
        ...     def forward(self, input):
        ...         return nn.functional.gelu(input, approximate="tanh")
        >>> _ = register_layer_kernel(kernel_name="FastGelu", layer=TanhGelu, device="cpu")
        >>> register_external_layer(nn.GELU, "FastGelu")
        >>> model = kernelize_model(nn.Sequential(nn.GELU()), mode="inference", device="cpu", use_fallback=True)
        >>> model(torch.tensor([1.0]))   # the tanh approximation: erf GELU(1) is 0.8413
        tensor([0.8412])
        >>> undo_kernelize(model)
        Restored(layers=['0 (GELU): FastGelu'], functions=[])
        >>> model(torch.tensor([1.0]))
        tensor([0.8413])
    """
    _checked_kernelize("kernelize_model", model, mode, device, use_fallback, verify, cuda_graphs)
    return model


def _checked_kernelize(function: str, model: torch.nn.Module | None, mode: Any, device: str | torch.device | None,
                       use_fallback: bool, verify: bool, cuda_graphs: bool) -> _Changes:
    """Check the arguments, settle the mode and device, then kernelize (or, with kernels disabled,
    remove what earlier calls installed); ``function`` is the public entry named in messages.
    Returns what changed, which :func:`kernelized` puts back on exit."""
    _check_model(model, function)
    check_flag("use_fallback", use_fallback)
    check_flag("verify", verify)
    wanted = _resolve_mode(model, mode)
    _check_graphs_option(model, wanted, verify, cuda_graphs, function)
    device_type = _resolve_device(model, device)
    if kernels_disabled():
        return _remove_kernels(model, function)
    return _kernelize(model, wanted, device_type, use_fallback, verify, cuda_graphs)


def _remove_kernels(model: torch.nn.Module | None, function: str) -> _Changes:
    """With kernels disabled a call selects no kernel, so (as for any kernel that does not serve a
    call) the ones earlier calls installed go: an inference-only kernel left in place would break
    the training that follows. Returns what changed, for :func:`kernelized` to put back."""
    changes = _Changes()
    if model is not None:
        changes.layers = [c for c in (uninstall_forward(m) for m in model.modules()) if c is not None]
    changes.functions = unpatch_all()
    removed = len(changes.layers) + len(changes.functions)
    logger.info("%s is set: %s runs no kernel%s", DISABLE_ENV, function,
                f"; removed the {removed} kernel(s) earlier calls installed" if removed else "")
    return changes


def verification_report(model: torch.nn.Module | None = None) -> list[Verification]:
    """Every check made by verify mode: the layers of ``model`` and all patched functions.

    Examples:
        >>> from twinkle_fx import register_external_layer, register_layer_kernel
        >>> class TanhGelu(nn.Module):   # close to nn.GELU, but not within fp32's tolerance
        ...     def forward(self, input):
        ...         return nn.functional.gelu(input, approximate="tanh")
        >>> _ = register_layer_kernel(kernel_name="FastGelu", layer=TanhGelu, device="cpu")
        >>> register_external_layer(nn.GELU, "FastGelu")
        >>> model = kernelize_model(nn.Sequential(nn.GELU()), mode="inference", device="cpu", verify=True)
        >>> with torch.no_grad():
        ...     _ = model(torch.ones(2, 3))
        >>> for v in verification_report(model): print(v)
        0 (GELU) -> FastGelu [float32[2, 3]@cpu] output: max error 0.000153 MISMATCH (leaf 0: max abs difference ...)
    """
    _check_model(model, "verification_report")
    results: list[Verification] = []
    if model is not None:
        for module in model.modules():
            forward = swapped_forward(module)
            if forward is not None and forward.verifier is not None:
                results.extend(forward.verifier.results)
    return results + function_verifications()


@dataclass(frozen=True)
class Restored:
    """What :func:`undo_kernelize` put back: each module (its path in the model, its class and the
    kernel it ran) and each function, plus the modules it left to another tool.

    Examples:
        >>> Restored(layers=("1 (Gelu): FastGelu",), functions=("my_pkg.math_ops.add",))
        Restored(layers=['1 (Gelu): FastGelu'], functions=['my_pkg.math_ops.add'])
        >>> print(Restored())
        restored nothing (no kernel was installed)
    """

    layers: tuple[str, ...] = ()
    functions: tuple[str, ...] = ()
    left: tuple[str, ...] = ()  # modules whose twinkle_fx kernel another tool replaced since

    def __len__(self) -> int:
        return len(self.layers) + len(self.functions)

    def __repr__(self) -> str:
        left = f", left={list(self.left)}" if self.left else ""
        return f"Restored(layers={list(self.layers)}, functions={list(self.functions)}{left})"

    def __str__(self) -> str:
        parts = []
        if self.layers:
            parts.append(f"{len(self.layers)} layer forward(s): {_listed(self.layers)}")
        if self.functions:
            parts.append(f"{len(self.functions)} function(s): {_listed(self.functions)}")
        text = "restored " + ("; ".join(parts) if parts else "nothing (no kernel was installed)")
        if self.left:
            text += f"; left {len(self.left)} module(s) another tool changed: {_listed(self.left)}"
        return text


def _listed(items: tuple[str, ...], shown: int = 5) -> str:
    return ", ".join(items[:shown]) + (f", ... ({len(items) - shown} more)" if len(items) > shown else "")


def undo_kernelize(model: torch.nn.Module | None = None) -> Restored:
    """Restore the original forward of every swapped module in ``model`` and every patched function.

    Function patches are process-wide (they change module attributes), so their undo is too. A
    forward that another tool installed over a twinkle_fx kernel afterwards (``kernels.kernelize``,
    say) is left to that tool: a WARNING names the modules.

    Returns:
        :class:`Restored`: what was put back (also logged at INFO), and what was left to another tool.

    Examples:
        >>> from twinkle_fx import register_external_layer, register_layer_kernel
        >>> class TanhGelu(nn.Module):
        ...     def forward(self, input):
        ...         return nn.functional.gelu(input, approximate="tanh")
        >>> _ = register_layer_kernel(kernel_name="FastGelu", layer=TanhGelu, device="cpu")
        >>> register_external_layer(nn.GELU, "FastGelu")
        >>> model = kernelize_model(nn.Sequential(nn.Linear(4, 4), nn.GELU()), mode="inference", device="cpu")
        >>> undo_kernelize(model)
        Restored(layers=['1 (GELU): FastGelu'], functions=[])
    """
    _check_model(model, "undo_kernelize")
    layers: list[str] = []
    left: list[str] = []
    if model is not None:
        named = {id(m): path or "<model>" for path, m in model.named_modules()}
        foreign = overwritten_forwards(m for m in model.modules())
        for module in model.modules():
            change = uninstall_forward(module)
            if change is not None:
                layers.append(f"{named[id(module)]} ({type(module).__qualname__}): {change.before.kernel_name}")
        if foreign:
            left = [f"{named[id(m)]} ({type(m).__qualname__})" for m, _ in foreign]
            logger.warning(
                "undo_kernelize(%s): %d module(s) run a forward twinkle_fx did not install (%s%s: %r); \nsomething "
                "replaced its kernel after kernelize_model (kernels.kernelize?). Left as it is: undo it with that "
                "tool, or reload the model; restored the %d twinkle_fx forward(s) still in place",
                type(model).__qualname__, len(foreign), ", ".join(left[:3]), ", ..." if len(foreign) > 3 else "",
                foreign[0][1], len(layers))
            for module, _ in foreign:
                forget(module)
    restored = Restored(tuple(layers), tuple(restore_function_targets()), tuple(left))
    logger.info("undo_kernelize(%s): %s", "None" if model is None else type(model).__qualname__, restored)
    return restored


@contextlib.contextmanager
def kernelized(
    model: torch.nn.Module | None = None,
    mode: Any = None,
    device: str | torch.device | None = None,
    use_fallback: bool = True,
    *,
    verify: bool = False,
    cuda_graphs: bool = False,
) -> Iterator[torch.nn.Module | None]:
    """``kernelize_model`` for the duration of a block; on exit (also on error) exactly what it
    changed is put back: a kernel an outer :func:`kernelize_model` or ``kernelized`` installed stays.

    Examples:
        >>> from twinkle_fx import register_external_layer, register_layer_kernel
        >>> class TanhGelu(nn.Module):
        ...     def forward(self, input):
        ...         return nn.functional.gelu(input, approximate="tanh")
        >>> _ = register_layer_kernel(kernel_name="FastGelu", layer=TanhGelu, device="cpu")
        >>> register_external_layer(nn.GELU, "FastGelu")
        >>> model = nn.Sequential(nn.GELU())
        >>> with kernelized(model, mode="inference", device="cpu") as fast:
        ...     fast(torch.tensor([1.0]))
        tensor([0.8412])
        >>> model(torch.tensor([1.0]))
        tensor([0.8413])
    """
    changes = _checked_kernelize("kernelized", model, mode, device, use_fallback, verify, cuda_graphs)
    try:
        yield model
    finally:
        revert_changes(changes.layers)
        revert_patches(changes.functions)
