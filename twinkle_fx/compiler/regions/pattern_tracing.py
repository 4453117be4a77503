"""Trace a registered function with Dynamo, giving a pattern in Dynamo's own spelling
(``x.pow(2)``, ``F.silu(x)``) that :mod:`..passes.function_patterns` can match in any graph.

Traced lazily, the first time the backend needs it (a nested Dynamo run on a fresh code object,
with a capturing backend; registering a kernel imports and runs nothing). The function is called on small
example tensors built from its signature (every parameter without a default is a tensor), in the
first of these shape plans it runs on (:func:`_shape_plans`): all tensors of one square shape at
rank 4, 3, 2; then the leading tensors at rank 4 and the others at rank 3 (a rotary's q, k
``[B, H, S, D]`` and cos, sin ``[B, S, D]``: Phi3's and GLM4's concatenate q with its
pass-through part, which fails on same-rank examples); then those with half-width trailing
tensors (GPT-OSS's half-angle cos and sin). A float parameter is passed a
sentinel value so the pattern records where the constant sits and a match reads the model's own
value (an ``eps``) from the graph. Shape literals get baked in by Dynamo, so matches ignore
literals and :mod:`.region` checks each one on the real shapes.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import threading
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx

from ...core.registry import KernelRegistry
from ...core.swaps import original_function
from ...core.torch_internals import quiet_fake_tensor_errors, same_compile_invocation, tree_leaves

logger = logging.getLogger(__name__)

__all__ = ["TracedPattern", "RegisteredPatterns", "trace_function", "pattern_for", "resolve_reference"]

_SENTINEL = 0.123456789  # a float no model uses as a constant
_SIZE = 8


@dataclass(frozen=True)
class TracedPattern:
    """A reference function as Dynamo writes it."""

    name: str
    reference: Callable[..., Any]
    signature: inspect.Signature
    graph: fx.Graph
    placeholder_params: tuple[str, ...]  # the function parameter each placeholder stands for
    scalar_slots: tuple[tuple[str, str, int], ...]  # (parameter, pattern node name, flat argument index)

    def __str__(self) -> str:
        return f"pattern {self.name}({', '.join(self.signature.parameters)})"

    @functools.cached_property
    def code(self) -> str:
        """The pattern as text: equal for equal patterns (each modeling file's rotary copy), so the graph is searched once for them."""
        code = fx.GraphModule(torch.nn.Module(), self.graph).code
        return f"{self.placeholder_params}{self.scalar_slots}{code}"


def _signature(fn: Callable[..., Any]) -> inspect.Signature:
    if isinstance(fn, torch.nn.Module):
        return inspect.signature(fn.forward)
    return inspect.signature(fn)


def _tensor_parameters(signature: inspect.Signature) -> list[str]:
    return [p.name for p in signature.parameters.values()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.default is p.empty
            and p.annotation not in (float, "float", int, bool, "int", "bool")]


def _shape_plans(n: int) -> list[tuple[str, list[tuple[int, ...]]]]:
    """``(description, shape of each tensor argument)``, in the order tried (see the module docstring)."""
    plans = [(f"rank {rank}", [(_SIZE,) * rank] * n) for rank in (4, 3, 2)]
    # the split nearest the middle first: (q, k | cos, sin)
    splits = sorted(range(1, n), key=lambda k: (abs(2 * k - n), -k))
    for width, what in ((_SIZE, ""), (_SIZE // 2, ", half width")):
        plans += [(f"first {k} at rank 4, the rest at rank 3{what}",
                   [(_SIZE,) * 4] * k + [(_SIZE,) * 2 + (width,)] * (n - k)) for k in splits]
    return plans


def _example_arguments(signature: inspect.Signature, shapes: list[tuple[int, ...]]) -> tuple[dict[str, Any], list[str]]:
    """Keyword arguments for one trace (tensor arguments of ``shapes``, in order) and the float
    parameters given the sentinel."""
    kwargs: dict[str, Any] = {}
    scalars = []
    tensor_shapes = iter(shapes)
    for p in signature.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.default is p.empty:
            if p.annotation in (float, "float"):
                kwargs[p.name] = _SENTINEL
                scalars.append(p.name)
            elif p.annotation in (int, bool, "int", "bool"):
                raise ValueError(f"parameter {p.name!r} ({p.annotation}) has no default to trace with")
            else:
                kwargs[p.name] = torch.randn(next(tensor_shapes))
        elif isinstance(p.default, float) and not isinstance(p.default, bool):
            kwargs[p.name] = _SENTINEL
            scalars.append(p.name)
    return kwargs, scalars


def _dynamo_graph(fn: Callable[..., Any], kwargs: dict[str, Any]) -> tuple[fx.GraphModule, list[Any]]:
    captured: list[tuple[fx.GraphModule, list[Any]]] = []

    def capture(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        captured.append((gm, list(example_inputs)))
        return gm.forward

    # A fresh code object per trace: Dynamo caches on code objects, and the reference function's
    # own code must not collect cache entries from this side trip.
    def root(**kw: Any) -> Any:
        return fn(**kw)

    fresh = types.FunctionType(
        root.__code__.replace(co_name=f"_twinkle_pattern_{getattr(fn, '__name__', 'fn')}"),
        {"fn": fn, "__builtins__": __builtins__}, None, None, root.__closure__,
    )
    with same_compile_invocation():  # traced while a later graph of the user's step compiles
        torch.compile(fresh, backend=capture, fullgraph=True, dynamic=False)(**kwargs)
    if len(captured) != 1:
        raise RuntimeError(f"expected one graph, Dynamo produced {len(captured)}")
    return captured[0]


def trace_function(name: str, fn: Callable[..., Any]) -> TracedPattern:
    """Trace ``fn`` into a pattern. Raises with the reason when no plan of example inputs works."""
    signature = _signature(fn)
    errors = []
    for plan, shapes in _shape_plans(len(_tensor_parameters(signature))):
        try:
            kwargs, scalars = _example_arguments(signature, shapes)
            with quiet_fake_tensor_errors():  # a plan that does not fit fails there; the reason is kept
                gm, example_inputs = _dynamo_graph(fn, kwargs)
        except Exception as e:  # the next plan may fit; all failing is reported below
            errors.append(f"{plan}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            continue
        by_identity = {id(v): k for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        params = tuple(by_identity.get(id(v), "?") for v in example_inputs)
        if "?" in params or len(params) != len(placeholders):
            errors.append(f"{plan}: a graph input is not one of the function's tensor arguments")
            continue
        slots = []
        for node in gm.graph.nodes:
            for i, leaf in enumerate(tree_leaves((node.args, dict(node.kwargs)))):
                if isinstance(leaf, float) and leaf == _SENTINEL:
                    slots.append((node.name, i))
        if len(scalars) > 1 and slots:
            slots = []  # several float parameters share the sentinel: which is which is unknown
        scalar_slots = tuple((scalars[0], node, i) for node, i in slots) if scalars else ()
        return TracedPattern(name, fn, signature, gm.graph, params, scalar_slots)
    raise RuntimeError("; ".join(errors))


_LOCK = threading.Lock()


def resolve_reference(target: str) -> Any:
    """The function ``target`` names, as its author wrote it: the original when ``kernelize_model``
    / ``apply_function_kernel`` has patched the module attribute (tracing the kernel instead would
    make the backend search for the kernel's computation)."""
    original = original_function(target)
    if original is not None:
        return original
    module_name, _, func_name = target.rpartition(".")
    return getattr(importlib.import_module(module_name), func_name)


def pattern_for(registry: KernelRegistry, target: str) -> TracedPattern | str:
    """The pattern of a registered function target, or why there is none.

    Traced on first use by the backend (registering imports and runs nothing) and kept on the
    target's registrations, so it lives exactly as long as they do: a scoped registry takes its
    patterns with it. Traced again when the function object changed (a module reloaded).
    """
    registrations = [r for modes in registry.function_registrations(target).values() for r in modes.values()]
    try:
        reference = resolve_reference(target)
    except Exception as e:  # any import failure is the user's to see, in the report
        return f"{target} could not be imported ({type(e).__name__}: {e})"
    with _LOCK:
        for registration in registrations:
            cached = registration.compile_cache.get("pattern")
            if cached is not None and cached[0] is reference:
                return cached[1]
    start = time.perf_counter()
    try:
        result: TracedPattern | str = trace_function(target, reference)
    except Exception as e:  # every shape plan failed: the reasons are in the message
        result = f"Dynamo could not trace {target} on example inputs ({e})"
        logger.info("no pattern for %s: %s", target, result)
    else:
        logger.info("traced the pattern of %s in %.1f ms", target, (time.perf_counter() - start) * 1e3)
    with _LOCK:
        for registration in registrations:
            registration.compile_cache["pattern"] = (reference, result)
    return result


@dataclass
class RegisteredPatterns:
    """The registered function targets' patterns, largest first (targets with the same pattern
    share one entry), and why the other targets have none (targets that could match nothing in the
    graph are in neither); ``traced_through``: function name -> the files of the functions of that name
    the graph's calls were inlined from."""

    patterns: list[tuple[list[str], TracedPattern]]
    missing: dict[str, str]
    traced_through: dict[str, set[str]] = field(default_factory=dict)
