"""How each backend turns a freshly built model into the model a benchmark runs.

A backend is a context manager around one run: it prepares the model on entry and undoes anything
process-wide on exit (registrations, patched functions, Liger's module patches), so the backends of
one run cannot leak into each other whatever their order.

=================  ==========================================================================
eager              the model as built
inductor           ``torch.compile(model)``
twinkle            ``twinkle_fx.compile(model)`` with the built-in kernels registered: the fused-loss
                   head on the compiled module, then ``torch.compile(model, backend="twinkle")``
                   (``swap_policy="measured"`` in training; ``twinkle-all-swaps`` swaps every region)
kernelize+twinkle  ``kernelize_model(model, mode="train+compile")`` (fused-loss head), then twinkle
kernelize          ``twinkle_fx.kernelize_model(model, mode="train")`` with the built-in kernels, decoder layers too
kernelize+cudagraphs  the same with ``cuda_graphs=True``: each decoder layer's forward and backward replayed
                   from CUDA graphs
inductor+cudagraphs  ``torch.compile(model, mode="reduce-overhead")``: Inductor's CUDA-graph trees, the
                   forward and the backward each one graph
inductor+cudagraphs+cce  the same, the loss computed by Cut Cross-Entropy from the last hidden state (no
                   logits), the strongest head a plain torch.compile user would pick
twinkle+cudagraphs ``twinkle_fx.compile(model, mode="reduce-overhead")``: the same through the backend,
                   fused-loss head included, every region swapped (``swap_policy="always"``: under CUDA
                   graphs a launch costs no host time, only device time counts)
twinkle+cudagraphs+fused-experts  the same with ``use_builtin_kernels(fused_experts=True)``: a MoE model's
                   experts computed whole by ``twinkle_triton.moe_swiglu_experts``, Mixtral's too (by default
                   only the families it measured faster for)
twinkle+gemm-fusion  ``twinkle_fx.compile(model, options={"fuse_projections": True})``: linears reading one
                   input (q/k/v) as one GEMM
twinkle+cudagraphs+gemm-fusion  the same with ``"cudagraphs": True`` (mode="reduce-overhead"'s twin)
liger              ``liger_kernel.transformers.apply_liger_kernel_to_<family>(model=model)``
liger+inductor     the same, then ``torch.compile``
=================  ==========================================================================

A twinkle backend followed by ``-<graph rewrite>`` (``twinkle+cudagraphs-embedding_grad``) is that backend
with the rewrite removed from its registry scope (:data:`twinkle_fx.core.registry.GRAPH_REWRITES`): beside
the backend itself in one run, the two rows measure what the one rewrite does, at the run's clocks.

For a model in eval mode (``--inference``) the kernelize modes are "inference" and "compile".

A backend whose optional package is missing (liger-kernel not installed) raises
:class:`BackendUnavailable` with a message saying what is missing.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ContextManager

import torch

__all__ = ["Backend", "BackendUnavailable", "Prepared", "BACKENDS", "backend", "parse_backends"]


class BackendUnavailable(RuntimeError):
    """The backend cannot run in this environment; the message says what is missing and how to get it."""


@dataclass
class Prepared:
    """The model to run and what the backend did to it (shown in the report, e.g. swap counts)."""

    model: torch.nn.Module
    notes: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Backend:
    name: str
    description: str
    prepare: Callable[[torch.nn.Module, str, torch.device], ContextManager[Prepared]]
    """``prepare(model, family, device)``: ``family`` is the transformers model type (qwen2, llama, ...)."""


@contextlib.contextmanager
def _builtin_kernels(family: str, device: torch.device, **options: Any) -> Iterator[list[str]]:
    """The built-in kernels of model ``family`` registered for ``device`` in a private registry
    scope for the duration of the block; yields what was bound."""
    from twinkle_fx import scoped_registry
    from twinkle_fx.builtin import use_builtin_kernels

    with scoped_registry():
        # the built-ins register for cuda by default; on the CPU (--tiny) they run through the
        # Triton interpreter
        yield use_builtin_kernels(devices=(device.type,), models=(family,), **options)


def _swap_notes(model: torch.nn.Module) -> dict[str, Any]:
    """How many modules got each kernel, and which functions are patched (what kernelize did)."""
    from twinkle_fx.function import patched_functions
    from twinkle_fx.core.swaps import swapped_forward

    layers = Counter(
        f"{type(module).__name__} -> {forward.kernel_name}"
        for module in model.modules()
        if (forward := swapped_forward(module)) is not None
    )
    return {"swapped_layers": dict(layers), "patched_functions": patched_functions()}


def _compile_notes(report) -> dict[str, Any]:
    """What the twinkle backend swapped in the graphs it compiled, and what it kept and why."""
    return {
        "graphs": report.graph_count,
        "graph_breaks": report.graph_breaks,
        "swapped_regions": dict(Counter(f"{r.kind} {r.target} -> {r.kernel}" for r in report.swapped)),
        "kept_regions": dict(Counter(f"{r.kind} {r.target}: {r.reason}" for r in report.not_swapped)),
    }


@contextlib.contextmanager
def _eager(model: torch.nn.Module, family: str, device: torch.device) -> Iterator[Prepared]:
    yield Prepared(model)


@contextlib.contextmanager
def _inductor(model: torch.nn.Module, family: str, device: torch.device) -> Iterator[Prepared]:
    yield Prepared(torch.compile(model))


@contextlib.contextmanager
def _cudagraph_notes(prepared: Callable[[], Prepared], device: torch.device) -> Iterator[Prepared]:
    """Run a CUDA-graphed row, then note whether each graph was captured: Inductor's skip messages
    (and, for graphs the twinkle backend compiled, each one's status) and what the CUDA-graph tree
    recorded. The harness's step sets every ``.grad`` to None first (``zero_grad(set_to_none=True)``):
    a ``.grad`` left from the previous step is a buffer of that step's backward graph, which the
    next step's replay overwrites (see tools/cudagraph_training_probe.py)."""
    from twinkle_fx.compiler.inner.inductor_options import collect_cudagraph_status, cudagraph_tree_summary

    with collect_cudagraph_status() as cudagraphs:
        row = prepared()
        try:
            yield row
        finally:
            row.notes["cudagraphs"] = cudagraphs.summary()
            if device.type == "cuda":
                row.notes["cudagraph_tree"] = cudagraph_tree_summary(device.index)


@contextlib.contextmanager
def _inductor_cudagraphs(model: torch.nn.Module, family: str, device: torch.device) -> Iterator[Prepared]:
    with _cudagraph_notes(lambda: Prepared(torch.compile(model, mode="reduce-overhead")), device) as prepared:
        yield prepared


def _twinkle(kernelize_first: bool, rewrites_off: tuple[str, ...] = (), builtin: dict[str, Any] | None = None,
             **compile_kwargs: Any):
    @contextlib.contextmanager
    def prepare(model: torch.nn.Module, family: str, device: torch.device) -> Iterator[Prepared]:
        import twinkle_fx
        from twinkle_fx import kernelize_model, undo_kernelize
        from twinkle_fx.compiler import collect_reports

        # the registry scope stays open for the whole run: Dynamo compiles at the first call
        with _builtin_kernels(family, device, **(builtin or {})) as bound, collect_reports() as report:
            for rewrite in rewrites_off:
                twinkle_fx.get_registry().remove_graph_rewrite(rewrite)
            if kernelize_first:
                # every registered layer swapped eagerly, the fused-loss head included, then the backend
                kernelize_model(model, mode="train+compile" if model.training else "compile", device=device)
                compiled = torch.compile(model, backend="twinkle", **compile_kwargs)
            else:
                compiled = twinkle_fx.compile(model, device=device, **compile_kwargs)  # the one call users are shown
            prepared = Prepared(compiled, {"builtin_kernels": bound})
            graphed = (compile_kwargs.get("mode") == "reduce-overhead"
                       or (compile_kwargs.get("options") or {}).get("cudagraphs") is True)
            try:
                with _cudagraph_notes(lambda: prepared, device) if graphed else contextlib.nullcontext():
                    yield prepared
            finally:
                prepared.notes.update(_compile_notes(report))
                prepared.notes.update(_swap_notes(model))
                undo_kernelize(model)

    return prepare


def _kernelize(cuda_graphs: bool = False):
    @contextlib.contextmanager
    def prepare(model: torch.nn.Module, family: str, device: torch.device) -> Iterator[Prepared]:
        from twinkle_fx import kernelize_model, undo_kernelize
        from twinkle_fx.eager.cuda_graphs import graph_status

        # decoder layers too: residual add + post-attention norm in one kernel (eager only, see use_builtin_kernels)
        with _builtin_kernels(family, device, decoder_layers=True) as bound:
            kernelize_model(model, mode="train" if model.training else "inference", device=device,
                            cuda_graphs=cuda_graphs)
            prepared = Prepared(model, {"builtin_kernels": bound, **_swap_notes(model)})
            try:
                yield prepared
            finally:
                if cuda_graphs:
                    prepared.notes["cuda_graphs"] = str(graph_status(model))
                undo_kernelize(model)  # function patches are process-wide

    return prepare


@contextlib.contextmanager
def _inductor_cudagraphs_cce(model: torch.nn.Module, family: str, device: torch.device) -> Iterator[Prepared]:
    """torch.compile with CUDA graphs, the loss computed by Cut Cross-Entropy from the last hidden
    state and the output embedding (no logits materialised): the strongest head a user of plain
    torch.compile would pick. The model's forward is replaced on the instance for the run."""
    if importlib.util.find_spec("cut_cross_entropy") is None:
        raise BackendUnavailable("cut-cross-entropy not installed (pip install cut-cross-entropy)")
    from cut_cross_entropy import linear_cross_entropy
    from transformers.modeling_outputs import CausalLMOutputWithPast

    base, head = model.base_model, model.get_output_embeddings()

    def forward(input_ids: torch.Tensor, labels: torch.Tensor, **kwargs: Any) -> CausalLMOutputWithPast:
        hidden = base(input_ids=input_ids, **kwargs).last_hidden_state
        # shift=True: the token at position i predicts label i + 1, as the model's own loss does
        return CausalLMOutputWithPast(loss=linear_cross_entropy(hidden, head.weight, labels, shift=True))

    model.forward = forward
    try:
        with _cudagraph_notes(lambda: Prepared(torch.compile(model, mode="reduce-overhead")), device) as prepared:
            yield prepared
    finally:
        del model.forward


_ABSENT = object()


@contextlib.contextmanager
def _module_state_restored(module) -> Iterator[None]:
    """Put back every global of ``module`` and every attribute of the classes defined in it on exit.

    Liger patches transformers' modeling module in place (``modeling_qwen2.Qwen2RMSNorm =
    LigerRMSNorm``, ``apply_rotary_pos_emb = liger_rotary_pos_emb``) and has no undo; without this
    every backend after a Liger row would build Liger models.
    """
    saved_globals = dict(vars(module))
    classes = [v for v in saved_globals.values() if isinstance(v, type) and v.__module__ == module.__name__]
    saved_classes = {cls: dict(vars(cls)) for cls in classes}
    try:
        yield
    finally:
        for name in set(vars(module)) - set(saved_globals):
            delattr(module, name)
        for name, value in saved_globals.items():
            if vars(module).get(name, _ABSENT) is not value:
                setattr(module, name, value)
        for cls, saved in saved_classes.items():
            for name in set(vars(cls)) - set(saved):
                delattr(cls, name)
            for name, value in saved.items():
                if vars(cls).get(name, _ABSENT) is not value and name not in ("__dict__", "__weakref__"):
                    setattr(cls, name, value)


def _liger(compiled: bool):
    @contextlib.contextmanager
    def prepare(model: torch.nn.Module, family: str, device: torch.device) -> Iterator[Prepared]:
        if importlib.util.find_spec("liger_kernel") is None:
            raise BackendUnavailable("liger-kernel not installed (pip install liger-kernel)")
        liger_transformers = importlib.import_module("liger_kernel.transformers")
        apply = getattr(liger_transformers, f"apply_liger_kernel_to_{family}", None)
        if apply is None:
            raise BackendUnavailable(f"liger-kernel has no apply_liger_kernel_to_{family}")
        with _module_state_restored(importlib.import_module(type(model).__module__)):
            apply(model=model)
            yield Prepared(torch.compile(model) if compiled else model)

    return prepare


# the twinkle backends: (description, kernelize first, compile arguments[, use_builtin_kernels' options]); a name
# with "-<graph rewrite>" after one of them is resolved by backend()
_TWINKLE: dict[str, tuple[str, bool, dict[str, Any]] | tuple[str, bool, dict[str, Any], dict[str, Any]]] = {
    "twinkle": ("twinkle_fx.compile(model): fused-loss head + backend=\"twinkle\", built-in kernels", False, {}),
    "kernelize+twinkle": ('kernelize_model(model, mode="train+compile"), then backend="twinkle"', True, {}),
    "twinkle+cudagraphs": ('backend="twinkle", mode="reduce-overhead"', False, {"mode": "reduce-overhead"}),
    "twinkle+gemm-fusion": ('backend="twinkle", options={"fuse_projections": True}', False,
                            {"options": {"fuse_projections": True}}),
    "twinkle+cudagraphs+gemm-fusion": ('backend="twinkle", options={"cudagraphs": True, "fuse_projections": True}',
                                       False, {"options": {"cudagraphs": True, "fuse_projections": True}}),
    "twinkle-all-swaps": ('backend="twinkle", options={"swap_policy": "always"}', False,
                          {"options": {"swap_policy": "always"}}),
    "twinkle+cudagraphs+fused-experts": ('backend="twinkle", mode="reduce-overhead", '
                                         "use_builtin_kernels(fused_experts=True)", False, {"mode": "reduce-overhead"},
                                         {"fused_experts": True}),
}


def _twinkle_backend(name: str, rewrites_off: tuple[str, ...] = ()) -> Backend:
    description, kernelize_first, kwargs, *builtin = _TWINKLE[name]
    if rewrites_off:
        name = "-".join((name, *rewrites_off))
        description += f", without the {', '.join(rewrites_off)} rewrite"
    return Backend(name, description, _twinkle(kernelize_first, rewrites_off, *builtin, **kwargs))


BACKENDS: dict[str, Backend] = {
    b.name: b
    for b in (
        Backend("eager", "the transformers model as built", _eager),
        Backend("inductor", "torch.compile(model)", _inductor),
        _twinkle_backend("twinkle"),
        _twinkle_backend("kernelize+twinkle"),
        Backend("kernelize", 'kernelize_model(model, mode="train"), built-in kernels', _kernelize()),
        Backend("kernelize+cudagraphs", 'kernelize_model(model, mode="train", cuda_graphs=True), built-in kernels',
                _kernelize(cuda_graphs=True)),
        Backend("liger", "apply_liger_kernel_to_<model>(model=model)", _liger(compiled=False)),
        # CUDA graphs and horizontal GEMM fusion in the training step
        Backend("inductor+cudagraphs", 'torch.compile(model, mode="reduce-overhead")', _inductor_cudagraphs),
        _twinkle_backend("twinkle+cudagraphs"),
        Backend("inductor+cudagraphs+cce", 'torch.compile(model, mode="reduce-overhead"), the loss by Cut Cross-Entropy',
                _inductor_cudagraphs_cce),
        _twinkle_backend("twinkle+gemm-fusion"),
        _twinkle_backend("twinkle+cudagraphs+gemm-fusion"),
        _twinkle_backend("twinkle-all-swaps"),
        _twinkle_backend("twinkle+cudagraphs+fused-experts"),
        Backend("liger+inductor", "Liger, then torch.compile(model)", _liger(compiled=True)),
    )
}


def backend(name: str) -> Backend:
    """The backend ``name``: one of :data:`BACKENDS`, or a twinkle backend without one graph rewrite,
    ``<twinkle backend>-<rewrite>`` (see the module docstring).

    Raises:
        KeyError: neither (the message lists the names).

    Examples:
        >>> backend("twinkle+cudagraphs-embedding_grad").description
        'backend="twinkle", mode="reduce-overhead", without the embedding_grad rewrite'
    """
    if name in BACKENDS:
        return BACKENDS[name]
    from twinkle_fx.core.registry import GRAPH_REWRITES

    base, _, rewrite = name.rpartition("-")
    if base not in _TWINKLE or rewrite not in GRAPH_REWRITES:
        raise KeyError(f"unknown backend {name!r}; backends: {', '.join(BACKENDS)}, and a twinkle backend "
                       f"({', '.join(_TWINKLE)}) followed by -<graph rewrite> ({', '.join(GRAPH_REWRITES)})")
    return _twinkle_backend(base, (rewrite,))


def _resolves(name: str) -> bool:
    try:
        backend(name)
    except KeyError:
        return False
    return True


def parse_backends(text: str, known: dict[str, Any] | None = None) -> list[str]:
    """Split a comma-separated backend list and check each name.

    Raises:
        ValueError: an unknown name (the message lists the valid ones) or an empty list.

    Examples:
        >>> parse_backends("eager, inductor")
        ['eager', 'inductor']
    """
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise ValueError("--backends is empty; give a comma-separated list.")
    unknown = [name for name in names if (name not in known if known is not None else not _resolves(name))]
    if unknown:
        more = "" if known is not None else ", or a twinkle backend followed by -<graph rewrite>"
        raise ValueError(f"Unknown backend(s) {', '.join(map(repr, unknown))}; valid: "
                         f"{', '.join(known if known is not None else BACKENDS)}{more}.")
    return list(dict.fromkeys(names))
